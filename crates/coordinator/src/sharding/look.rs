//! What one look at the fleet sees of the peers, worked out once for all
//! its clusters (what it decides for each cluster is `working_set::decide`).

use super::Peer;
use super::owner_of;
use crate::lease;
use multicluster_runtime::ClusterName;

/// The peers as one look at the fleet sees them, worked out once for all
/// its clusters.
#[derive(Default)]
pub(super) struct Look {
    /// The live peers, this replica included.
    pub(super) peers: Vec<Peer>,
    /// Those whose Leases say they are not ready yet.
    pub(super) joining: std::collections::BTreeSet<String>,
    /// Those of `joining` that left lately and came back (they restarted),
    /// if this replica is ready itself: it may stand in for them.
    pub(super) came_back: std::collections::BTreeSet<String>,
    /// The peers that are ready.
    pub(super) ready: Vec<Peer>,
    /// What a fence handed to each ready peer says (fences held with the
    /// peer Lease only; a peer whose epoch is not known live is absent).
    pub(super) next: std::collections::HashMap<String, lease::Next>,
    /// The peers leaving (not in `peers`): they hand their clusters over.
    pub(super) leaving: std::collections::BTreeSet<String>,
    /// `peers` and the leaving peers, sorted by ID.
    pub(super) with_leaving: Vec<Peer>,
    /// How many more inherited fences this look writes as this replica's
    /// own (see `heirs`).
    pub(super) rewrites_left: std::sync::atomic::AtomicUsize,
    /// Whether heirs named lately include this replica and their fences
    /// are being listed: the look takes nothing meanwhile.
    pub(super) inheriting: bool,
    /// How many clusters this look took or handed back (or tried to).
    pub(super) moves: std::sync::atomic::AtomicUsize,
}

impl Look {
    /// Whether `cluster` is most likely held by a leaving peer, which hands
    /// it over: asking for its fence meanwhile finds it busy, thousands of
    /// requests that slow the hand-over down.
    pub(super) fn awaits_hand_over(&self, cluster: &str) -> bool {
        !self.leaving.is_empty()
            && owner_of(cluster, &self.with_leaving)
                .is_some_and(|peer| self.leaving.contains(&peer.id))
    }

    /// Where `me`, leaving, hands `cluster`: to its owner among the
    /// others, or if that one is not ready yet, to the ready peer that
    /// keeps it until it is ([`Look::keeper`]).
    pub(super) fn hand_over_to(&self, cluster: &ClusterName, me: &str) -> Option<lease::Next> {
        let owner = owner_but(cluster.as_str(), &self.peers, me)?;
        if !self.joining.contains(&owner.id) {
            return self.next_for(Some(owner), cluster);
        }
        self.next_for(self.keeper(cluster.as_str(), me), cluster)
    }

    /// Who keeps `cluster` for an owner that is not ready yet when the
    /// replica `leaving` lets it go: the owner among the other ready peers.
    pub(super) fn keeper(&self, cluster: &str, leaving: &str) -> Option<&Peer> {
        owner_but(cluster, &self.ready, leaving)
    }

    /// What `cluster`'s fence says handed straight to `owner`, if it can be.
    pub(super) fn next_for(
        &self,
        owner: Option<&Peer>,
        cluster: &ClusterName,
    ) -> Option<lease::Next> {
        let next = self.next.get(&owner?.id)?;
        Some(lease::Next {
            // Its name as it is (the local cluster's is empty), not as
            // shown.
            cluster: cluster.as_str().to_string(),
            ..next.clone()
        })
    }

    /// Whether replica `me` works on `cluster` until its `owner`, a peer
    /// that came back lately (it restarted) and is not ready yet, is: the
    /// clusters it left were being taken over when it came back, and those
    /// nobody had taken yet would otherwise wait for its provider. The one
    /// that stands in is the owner among the ready peers. (At a cold start
    /// nobody came back: each cluster waits for its owner, and no ready
    /// replica claims the fleet to hand it back.)
    pub(super) fn stands_in_for(&self, cluster: &str, owner: Option<&Peer>, me: &str) -> bool {
        owner.is_some_and(|owner| self.came_back.contains(&owner.id))
            && owner_of(cluster, &self.ready).is_some_and(|peer| peer.id == me)
    }

    /// Whether this look may write one more inherited fence.
    pub(super) fn may_rewrite(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.rewrites_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    }
}

/// The owner of `cluster` among `peers` but `let_go`, a replica that let
/// it go (it leaves, or handed it over).
pub(super) fn owner_but<'a>(cluster: &str, peers: &'a [Peer], let_go: &str) -> Option<&'a Peer> {
    owner_of(cluster, peers.iter().filter(|p| p.id != let_go))
}
