//! What the reads of the peer Leases tell: written by the registry
//! (`peers/mod.rs`), read by the looks.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::sharding::epochs::Epochs;
use crate::sharding::hrw::Peer;

/// What the reads of the peer Leases tell, as the registry last wrote it:
/// what the looks decide by.
#[derive(Clone)]
pub(crate) struct PeersView {
    /// The live peers, this replica included, sorted by ID.
    peers: watch::Sender<Vec<Peer>>,
    /// The other peers whose Leases say they are not ready yet: a cluster
    /// one of them owns stays with the replica working on it until it is.
    joining: watch::Sender<BTreeSet<String>>,
    /// The other peers whose Leases say they are leaving (live ones only):
    /// they hand their clusters over, so their next owners wait for that
    /// rather than ask.
    leaving: watch::Sender<Vec<Peer>>,
    /// What the reads tell of the peers' epochs.
    epochs: Arc<Mutex<Epochs>>,
}

impl PeersView {
    /// What a replica knows before its first read: itself.
    pub(crate) fn new(me: Peer) -> Self {
        Self {
            peers: watch::Sender::new(vec![me]),
            joining: watch::Sender::default(),
            leaving: watch::Sender::default(),
            epochs: Arc::default(),
        }
    }

    /// The live peers as last read, this replica included, sorted by ID.
    pub(crate) fn peers(&self) -> Vec<Peer> {
        self.peers.borrow().clone()
    }

    /// Follows the live peers as the reads find them.
    pub(crate) fn follow(&self) -> watch::Receiver<Vec<Peer>> {
        self.peers.subscribe()
    }

    /// The other peers whose Leases say they are not ready yet.
    pub(crate) fn joining(&self) -> BTreeSet<String> {
        self.joining.borrow().clone()
    }

    /// The other live peers whose Leases say they are leaving.
    pub(crate) fn leaving(&self) -> Vec<Peer> {
        self.leaving.borrow().clone()
    }

    /// Says the reads found `peers` live, for tests.
    #[cfg(test)]
    pub(crate) fn read_as(&self, peers: Vec<Peer>) {
        self.peers.send_replace(peers);
    }

    /// Takes in the live peers a read found; logs when they changed.
    pub(super) fn read_live(&self, peers: Vec<Peer>) {
        self.peers.send_if_modified(|known| {
            if *known == peers {
                return false;
            }
            tracing::info!(peers = ?peers.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), "peers changed");
            *known = peers;
            true
        });
    }

    /// Takes in the joining peers a read found; whether they changed.
    pub(super) fn read_joining(&self, joining: BTreeSet<String>) -> bool {
        self.joining.send_if_modified(|known| {
            let modified = *known != joining;
            *known = joining;
            modified
        })
    }

    /// Takes in the leaving peers a read found; whether they changed.
    pub(super) fn read_leaving(&self, leaving: Vec<Peer>) -> bool {
        self.leaving.send_if_modified(|known| {
            let modified = *known != leaving;
            *known = leaving;
            modified
        })
    }

    /// What the reads tell of the peers' epochs.
    pub(crate) fn epochs(&self) -> &Mutex<Epochs> {
        &self.epochs
    }

    /// Tells whether the peers, the joining or the leaving change from
    /// now on.
    pub(crate) fn changes(&self) -> Changes {
        Changes {
            peers: self.peers.subscribe(),
            joining: self.joining.subscribe(),
            leaving: self.leaving.subscribe(),
        }
    }
}

/// Whether the view changed since [`PeersView::changes`].
pub(crate) struct Changes {
    peers: watch::Receiver<Vec<Peer>>,
    joining: watch::Receiver<BTreeSet<String>>,
    leaving: watch::Receiver<Vec<Peer>>,
}

impl Changes {
    /// Whether any of the live, joining or leaving peers changed.
    pub(crate) fn any(&self) -> bool {
        [
            self.peers.has_changed(),
            self.joining.has_changed(),
            self.leaving.has_changed(),
        ]
        .into_iter()
        .any(|changed| changed.unwrap_or(false))
    }
}
