//! Fences handed straight to this replica by their last holder.
//!
//! A replica that hands a cluster to a ready peer (with fences held with
//! the peer Lease) does not clear the fence for that peer to take: it
//! writes the fence as held by the peer in the peer's current epoch, with
//! a label the peer watches for (`wire::HANDED_TO_LABEL`, a hash of its
//! peer Lease and epoch). One write instead of a release, a read and a
//! write; and the new owner, which learns of it from its watch, starts
//! without a request. When a restarted replica became ready at 100,000
//! clusters, the eight replicas standing in for it released its 10,000
//! clusters far faster than it could take them one read and one write at a
//! time; the last waited a minute.
//!
//! Nothing here is needed for safety: a handed fence names this replica in
//! its epoch, so nobody else takes it while that epoch lasts, and if it
//! ends the fence is free like any other. The watch only saves requests;
//! without it (a Role without `watch`) a take reads the fence, finds it
//! held by this replica in its epoch, and writes nothing. A fence handed
//! for a cluster this replica does not own is passed on to its owner or
//! cleared at once, and one for a cluster it does not know at all once it
//! has waited two looks.

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::time::Instant;

use super::lifecycle::Phase;
use crate::fence::{self, Standing};
use crate::lease;
use crate::lock;
use crate::wire;
use multicluster_runtime::ClusterName;

use super::{ShardedCoordinator, Starting, engage_or_hand_back, owner_but};

pub(crate) use lease::label_for;

/// The fences handed to this replica and not taken up yet, by name.
#[derive(Debug, Default)]
pub(crate) struct Handed {
    fences: std::sync::Mutex<HashMap<String, Arrived>>,
}

#[derive(Debug)]
struct Arrived {
    lease: Lease,
    at: Instant,
}

impl Handed {
    /// The fences that arrived before `before` and that no look took up:
    /// their clusters are unknown here.
    pub(crate) fn unclaimed(&self, before: Instant) -> Vec<(String, Lease)> {
        lock(&self.fences)
            .extract_if(|_, arrived| arrived.at < before)
            .map(|(name, arrived)| (name, arrived.lease))
            .collect()
    }

    /// Keeps `lease`, handed to this replica, for the looks.
    pub(crate) fn arrive(&self, name: String, lease: Lease) {
        let at = Instant::now();
        lock(&self.fences).insert(name, Arrived { lease, at });
    }

    fn gone(&self, name: &str) {
        lock(&self.fences).remove(name);
    }

    fn clear(&self) {
        lock(&self.fences).clear();
    }
}

impl ShardedCoordinator {
    /// Clears the fences handed to this replica for clusters it does not
    /// know (two looks have passed since they came): left alone they would
    /// keep the cluster from whoever owns it for as long as this epoch
    /// lasts.
    pub(super) async fn give_back_unclaimed(&self) {
        let waited = self.inner.options.probe_interval * 2;
        let Some(before) = Instant::now().checked_sub(waited) else {
            return;
        };
        for (name, handed) in self.inner.handed.unclaimed(before) {
            tracing::info!(lease = %name, "a fence was handed to this replica for a cluster it does not know; clearing it");
            self.give_back(name, handed, None).await;
        }
    }

    /// Hands `handed`, a fence handed to this replica that it will not
    /// work under, to `next` or clears it.
    async fn give_back(&self, name: String, handed: Lease, next: Option<lease::Next>) {
        let standing = self.inner.standing.borrow().clone();
        // Handed in an epoch that has ended: free already.
        let Some(live) = standing.live() else {
            return;
        };
        let fence = fence::Fence::handed(name, live, handed);
        self.release(fence, next.as_ref()).await;
    }

    /// A fence just handed to this replica (by the watch in `handover`):
    /// work on its cluster starts at once, without a request, if this
    /// replica owns it; a fence for a cluster it does not own (the two saw
    /// the peers differently) goes on to the owner or is cleared; one for
    /// a cluster it does not know waits for the looks, which clear it.
    pub(super) async fn arrived(&self, fence_name: String, handed: Lease) {
        let Some(name) = handed
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(wire::CLUSTER_ANNOTATION))
            .map(|cluster| ClusterName::from(cluster.as_str()))
            .filter(|name| self.fence_name(name) == fence_name)
        else {
            self.inner.handed.arrive(fence_name, handed);
            return;
        };
        let standing = self.inner.standing.borrow().clone();
        let held_with = standing.held_with();
        // Handed in an epoch that has ended since: free for anyone already.
        let Some(live) = standing
            .live()
            .filter(|_| lease::held_with_of(&handed) == Some(held_with.as_str()))
        else {
            return;
        };
        let look = self.look();
        let me = &self.inner.me.id;
        if self.inner.lifecycle.reached(Phase::SaidLeaving) {
            // Handed by a replica that had not read yet that this one
            // leaves: on to the next owner.
            let next = look.hand_over_to(&name, me);
            self.give_back(fence_name, handed, next).await;
            return;
        }
        // The replica that handed it let it go, whatever this one last read
        // of it: a replica that leaves hands its clusters over before every
        // peer has read that it leaves.
        let handed_by = handed
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(wire::HANDED_BY_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let owner = owner_but(name.as_str(), &look.peers, &handed_by);
        let keep_for_joiner = owner.is_some_and(|peer| look.joining.contains(&peer.id));
        let owns = owner.is_some_and(|peer| peer.id == *me)
            || keep_for_joiner
                && (look.stands_in_for(name.as_str(), owner, me)
                    || look
                        .keeper(name.as_str(), &handed_by)
                        .is_some_and(|keeper| keeper.id == *me));
        if !owns {
            let next = look.next_for(owner, &name);
            self.give_back(fence_name, handed, next).await;
            return;
        }
        let fence = fence::Fence::handed(fence_name.clone(), live, handed);
        match self.inner.working.start(&name, None, fence, None) {
            Starting::Started((work, cluster, components)) => {
                tracing::info!(cluster = %name, peer = %self.inner.me.id, lease = %fence_name, "working on the cluster (handed over)");
                engage_or_hand_back(&components, &work, &name, &cluster);
                self.inner.working.show();
            }
            // Taken up already (a take read it first), or everything is
            // being handed back (it goes with the peer Lease).
            Starting::AlreadyHeld | Starting::HandingBack(_) => {}
            // For a cluster not known (yet): the looks clear it.
            Starting::Unheld(mut fence) => {
                if let Some(handed) = fence.take_written() {
                    self.inner.handed.arrive(fence_name, handed);
                }
            }
        }
    }
}

/// Follows the fences handed to `coordinator`'s replica in its current
/// epoch (as `standing` says) and passes each on to it as it comes.
/// Starts over with each new epoch: fences handed in an ended one are free
/// for anyone and taken by a write. Never completes.
pub(super) async fn watch(
    coordinator: ShardedCoordinator,
    mut standing: watch::Receiver<Standing>,
) {
    let api = coordinator.inner.leases.clone();
    let me = coordinator.inner.me.id.clone();
    let handed = coordinator.inner.handed.clone();
    loop {
        let held_with = {
            let standing = standing.borrow_and_update();
            standing.held_with()
        };
        handed.clear();
        let selector = format!("{}={}", wire::HANDED_TO_LABEL, label_for(&held_with));
        let config = watcher::Config::default().labels(&selector);
        let mut events = watcher(api.clone(), config)
            .backoff(multicluster_runtime::cache::WatchBackoff::default().strategy())
            .boxed();
        loop {
            tokio::select! {
                changed = standing.changed() => {
                    if changed.is_err() {
                        return std::future::pending().await;
                    }
                    let now = standing.borrow();
                    if now.held_with() != held_with {
                        break;
                    }
                }
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(fence) | watcher::Event::InitApply(fence))) => {
                        let Some(name) = fence.metadata.name.clone() else {
                            continue;
                        };
                        let mine = lease::holder_of(&fence) == Some(me.as_str())
                            && lease::held_with_of(&fence) == Some(held_with.as_str());
                        if mine {
                            coordinator.arrived(name, fence).await;
                        } else {
                            handed.gone(&name);
                        }
                    }
                    Some(Ok(watcher::Event::Delete(fence))) => {
                        if let Some(name) = fence.metadata.name.as_deref() {
                            handed.gone(name);
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(err)) => {
                        tracing::debug!(error = %crate::watcher_error(&err), "watching the fences handed to this replica failed; retrying");
                    }
                    None => return std::future::pending().await,
                },
            }
        }
    }
}
