//! The clusters of the fleet as this replica keeps them: which it works
//! on (under which fence), which wait for a retry, and whether its share
//! has settled. Every change to a cluster's share goes through a method
//! here, under one lock; what a look decides per cluster is in `decide`.

mod decide;

pub(super) use decide::{Rules, Step};

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{fence, lock};
use multicluster_runtime::Aware;
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::coordinator::{add_components, work_until as child_until};
use multicluster_runtime::engagements::{Arrival, Engagements, when_ended};

/// The clusters of the fleet, what this replica holds of them, and what
/// its looks decided.
#[derive(Default)]
pub(super) struct WorkingSet {
    /// Every cluster engaged with this replica, and its share.
    clusters: Mutex<Clusters>,
    /// Wakes the looks: a fence lost or handed, a standing renewed, a
    /// cluster engaged.
    wake: Arc<Notify>,
    /// Fired by the first look, once this replica is ready, that had
    /// nothing to take or hand back: its share of the fleet has settled.
    settled: CancellationToken,
    /// The joining peers this replica may stand in for, as the last look
    /// found them (logged when that changes).
    standing_in: watch::Sender<BTreeSet<String>>,
    /// Fences held with the peer Lease whose release failed, tried again
    /// at every look: unlike a renewed fence, such a fence does not lapse.
    unreleased: Mutex<Vec<fence::Fence>>,
    /// The clusters worked on, as of the last look, hand-over or
    /// inheritance: what `ShardedCoordinator::working_set` follows.
    shown: watch::Sender<Vec<ClusterName>>,
}

#[derive(Default)]
struct Clusters {
    engaged: Engagements<Share>,
    /// Set once every fence was collected to be handed back (the replica
    /// stops): nothing is held after that, or it would not be handed back.
    handing_back: bool,
}

/// What this replica keeps for each cluster of the fleet.
struct Share {
    components: Vec<Arc<dyn Aware>>,
    held: Option<Held>,
    retry_at: Option<Instant>,
    /// Attempts in a row that found the fence held by another replica.
    busy: u32,
    /// The fence as this replica last wrote it, from a hold that ended
    /// with its epoch: taken again by writing over it.
    last_written: Option<Lease>,
}

/// A cluster this replica works on: its fence and the work's lifetime.
pub(super) struct Held {
    pub(super) fence: fence::Fence,
    pub(super) work: CancellationToken,
    /// For a fence inherited from an ended epoch and not yet written as
    /// this replica's own: until when it may be worked on so.
    inherited_until: Option<Timestamp>,
}

impl Held {
    /// Work under `fence` that ends with the fence or the cluster.
    fn new(fence: fence::Fence, lifetime: &CancellationToken) -> Self {
        let work = child_until(lifetime, fence.lost());
        Self {
            fence,
            work,
            inherited_until: None,
        }
    }

    fn is_lost(&self) -> bool {
        self.fence.lost().is_cancelled()
    }

    fn is_working(&self) -> bool {
        !self.work.is_cancelled()
    }
}

/// What engaging a cluster under a fence just held takes: the work's
/// token, the cluster and its components.
pub(super) type Start = (CancellationToken, Cluster, Vec<Arc<dyn Aware>>);

/// A cluster handed back at shutdown: its fence and the components whose
/// work must settle first.
pub(super) type HandedBack = (ClusterName, Held, Vec<Arc<dyn Aware>>);

/// How holding a fence for a cluster came out ([`WorkingSet::start`]).
pub(super) enum Starting {
    /// Held now: the work starts with this.
    Started(Start),
    /// Held already under this fence (handed over and taken up meanwhile).
    AlreadyHeld,
    /// The cluster was replaced or left meanwhile, or is not known: the
    /// fence is not held.
    Unheld(fence::Fence),
    /// Every fence is being handed back (the replica stops): not held.
    HandingBack(fence::Fence),
}

impl WorkingSet {
    /// The clusters this replica works on now (it holds their fences and
    /// the work under them goes on), sorted.
    pub(super) fn working_on(&self) -> Vec<ClusterName> {
        lock(&self.clusters)
            .engaged
            .iter()
            .filter(|(_, entry)| entry.data.held.as_ref().is_some_and(Held::is_working))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether this replica works on `name` now.
    pub(super) fn works_on(&self, name: &ClusterName) -> bool {
        lock(&self.clusters)
            .engaged
            .live(name)
            .and_then(|entry| entry.data.held.as_ref())
            .is_some_and(Held::is_working)
    }

    /// Every cluster engaged, live or not, sorted.
    pub(super) fn names(&self) -> Vec<ClusterName> {
        lock(&self.clusters).engaged.names()
    }

    /// Tells the followers of the working set what it is now. Every change
    /// ends with a look (a fence lost or a cluster gone wakes one) or one
    /// of the hand-over, inheritance and shutdown paths, which call this.
    pub(super) fn show(&self) {
        let now = self.working_on();
        self.shown.send_if_modified(|shown| {
            let changed = *shown != now;
            if changed {
                *shown = now;
            }
            changed
        });
    }

    /// Follows the working set as [`WorkingSet::show`] tells it.
    pub(super) fn follow(&self) -> watch::Receiver<Vec<ClusterName>> {
        self.shown.subscribe()
    }

    /// Wakes the looks.
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    /// What wakes the looks, for the parts that wake them from a task.
    pub(super) fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Completes when the looks are woken.
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Says this replica's share of the fleet has settled.
    pub(super) fn settle(&self) {
        self.settled.cancel();
    }

    /// Fired once this replica's share of the fleet has settled.
    pub(super) fn settled(&self) -> CancellationToken {
        self.settled.clone()
    }

    /// Remembers the joining peers this replica stands in for; logs when
    /// they change.
    pub(super) fn stand_in_for(&self, came_back: &BTreeSet<String>, joining: &BTreeSet<String>) {
        self.standing_in.send_if_modified(|before| {
            if before == came_back {
                return false;
            }
            tracing::info!(came_back = ?came_back, joining = ?joining, "standing in for peers that restarted and are not ready yet");
            before.clone_from(came_back);
            true
        });
    }

    /// Takes in `cluster`, engaged as `name` for `lifetime` with
    /// `components`; what to start if it comes with work under a fence
    /// already held (more components for a cluster worked on, or a new
    /// instance of one: rotated credentials). Wakes the looks.
    pub(super) fn engage(
        &self,
        name: &ClusterName,
        cluster: &Cluster,
        lifetime: &CancellationToken,
        components: &[Arc<dyn Aware>],
    ) -> Option<Start> {
        let start = {
            let mut clusters = lock(&self.clusters);
            let engaged = &mut clusters.engaged;
            match engaged.arrival(name, cluster, lifetime) {
                Arrival::Stale => return None,
                Arrival::Again => {
                    let entry = engaged.get_mut(name)?;
                    let share = &mut entry.data;
                    let new = add_components(&mut share.components, components);
                    share
                        .held
                        .as_ref()
                        .filter(|held| held.is_working())
                        .map(|held| (held.work.clone(), cluster.clone(), new))
                }
                Arrival::New => {
                    // The old engagement's work ends, a fence held for it
                    // stays, and the work restarts on the new instance.
                    let share = Share {
                        components: components.to_vec(),
                        held: None,
                        retry_at: None,
                        busy: 0,
                        last_written: None,
                    };
                    let (entry, replaced) =
                        engaged.insert(name.clone(), cluster.clone(), lifetime, share);
                    let wake = self.wake.clone();
                    when_ended(&entry.lifetime, move || wake.notify_one());
                    let kept = replaced
                        .and_then(|old| old.data.held)
                        .filter(|held| !held.is_lost());
                    kept.map(|held| {
                        let held = Held::new(held.fence, &entry.lifetime);
                        let work = held.work.clone();
                        entry.data.held = Some(held);
                        (work, cluster.clone(), components.to_vec())
                    })
                }
            }
        };
        self.wake();
        start
    }

    /// Holds `fence` for `name` (the engagement of `generation`, or
    /// whichever is live) and says what work starts under it; an inherited
    /// fence is worked on until `inherited_until` unless written as this
    /// replica's own first.
    pub(super) fn start(
        &self,
        name: &ClusterName,
        generation: Option<u64>,
        fence: fence::Fence,
        inherited_until: Option<Timestamp>,
    ) -> Starting {
        let mut clusters = lock(&self.clusters);
        if clusters.handing_back {
            return Starting::HandingBack(fence);
        }
        let entry = match generation {
            Some(generation) => clusters.engaged.current_mut(name, generation),
            None => clusters.engaged.get_mut(name),
        };
        match entry {
            Some(entry) if entry.data.held.is_none() && entry.is_live() => {
                let mut held = Held::new(fence, &entry.lifetime);
                held.inherited_until = inherited_until;
                let start = (
                    held.work.clone(),
                    entry.cluster.clone(),
                    entry.data.components.clone(),
                );
                let share = &mut entry.data;
                share.held = Some(held);
                share.retry_at = None;
                share.busy = 0;
                Starting::Started(start)
            }
            Some(entry)
                if entry
                    .data
                    .held
                    .as_ref()
                    .is_some_and(|held| held.fence.name == fence.name) =>
            {
                Starting::AlreadyHeld
            }
            _ => Starting::Unheld(fence),
        }
    }

    /// The fence of `name` as this replica last wrote it before its hold
    /// ended with its epoch, to write over (taken: used once).
    pub(super) fn take_last_written(&self, name: &ClusterName, generation: u64) -> Option<Lease> {
        lock(&self.clusters)
            .engaged
            .current_mut(name, generation)
            .and_then(|entry| entry.data.last_written.take())
    }

    /// Takes in how writing the inherited fence `fence_name` of `name` as
    /// this replica's own came out: `Some`, written (worked on as its own
    /// from now on); `None`, another replica wrote it first, and the work
    /// stops (tried again after `retry_delay`). Whether the work stopped.
    pub(super) fn inherited_written(
        &self,
        name: &ClusterName,
        generation: u64,
        fence_name: &str,
        written: Option<Lease>,
        retry_delay: Duration,
    ) -> bool {
        let mut clusters = lock(&self.clusters);
        let Some(entry) = clusters.engaged.current_mut(name, generation) else {
            return false;
        };
        let share = &mut entry.data;
        let still_inherited = share
            .held
            .as_ref()
            .is_some_and(|held| held.fence.name == fence_name && held.inherited_until.is_some());
        if !still_inherited {
            return false;
        }
        match written {
            Some(written) => {
                if let Some(held) = share.held.as_mut() {
                    held.fence.set_written(written);
                    held.inherited_until = None;
                }
                false
            }
            None => {
                if let Some(held) = share.held.take() {
                    held.work.cancel();
                }
                share.retry_at = Some(Instant::now() + retry_delay);
                true
            }
        }
    }

    /// Tries `name` again after `delay`.
    pub(super) fn retry_later(&self, name: &ClusterName, generation: u64, delay: Duration) {
        if let Some(entry) = lock(&self.clusters).engaged.current_mut(name, generation) {
            entry.data.retry_at = Some(Instant::now() + delay);
        }
    }

    /// Tries `name`, whose fence another replica holds, again after
    /// `delay` doubled with each busy attempt in a row, up to `cap`.
    pub(super) fn retry_busy_later(
        &self,
        name: &ClusterName,
        generation: u64,
        delay: Duration,
        cap: Duration,
    ) {
        if let Some(entry) = lock(&self.clusters).engaged.current_mut(name, generation) {
            let share = &mut entry.data;
            let delay = delay.saturating_mul(1 << share.busy.min(16)).min(cap);
            share.busy = share.busy.saturating_add(1);
            share.retry_at = Some(Instant::now() + delay);
        }
    }

    /// `probe`, or the first retry due before it of a cluster not held.
    pub(super) fn next_retry(&self, probe: Instant) -> Instant {
        lock(&self.clusters)
            .engaged
            .values()
            .filter(|entry| entry.data.held.is_none())
            .filter_map(|entry| entry.data.retry_at)
            .fold(probe, Instant::min)
    }

    /// Keeps `fence`, whose release failed, to be released again.
    pub(super) fn keep_unreleased(&self, fence: fence::Fence) {
        lock(&self.unreleased).push(fence);
    }

    /// The fences whose release failed, to release again.
    pub(super) fn take_unreleased(&self) -> Vec<fence::Fence> {
        std::mem::take(&mut *lock(&self.unreleased))
    }

    /// Whether a fence named `fence_name` is held (taken again since its
    /// release failed: its cluster came back to this replica).
    pub(super) fn holds(&self, fence_name: &str) -> bool {
        lock(&self.clusters).engaged.values().any(|entry| {
            entry
                .data
                .held
                .as_ref()
                .is_some_and(|held| held.fence.name == fence_name)
        })
    }

    /// Lets go of every fence held, for the replica to hand back (it
    /// stops); none is held after this. Shows the empty working set.
    pub(super) fn hand_back_all(&self) -> Vec<HandedBack> {
        let held = {
            let mut clusters = lock(&self.clusters);
            clusters.handing_back = true;
            clusters
                .engaged
                .iter_mut()
                .filter_map(|(name, entry)| {
                    let held = entry.data.held.take()?;
                    Some((name.clone(), held, entry.data.components.clone()))
                })
                .collect()
        };
        self.show();
        held
    }

    /// The generation of the engagement under `name`, for tests.
    #[cfg(test)]
    pub(super) fn generation_of(&self, name: &ClusterName) -> Option<u64> {
        lock(&self.clusters)
            .engaged
            .get(name)
            .map(|entry| entry.generation)
    }

    /// When `name` is tried again, for tests.
    #[cfg(test)]
    pub(super) fn retry_at(&self, name: &ClusterName) -> Option<Instant> {
        lock(&self.clusters)
            .engaged
            .get(name)
            .and_then(|entry| entry.data.retry_at)
    }

    /// Whether a fence is held for `name`, live or not, for tests.
    #[cfg(test)]
    pub(super) fn is_held(&self, name: &ClusterName) -> bool {
        lock(&self.clusters)
            .engaged
            .get(name)
            .is_some_and(|entry| entry.data.held.is_some())
    }
}
