//! The clusters of the fleet as this replica keeps them: which it works
//! on (under which fence), which wait for a retry, and whether its share
//! has settled.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fence;
use multicluster_runtime::Aware;
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::coordinator::work_until as child_until;
use multicluster_runtime::engagements::{Engagement, Engagements};

/// The clusters of the fleet, what this replica holds of them, and what
/// its looks decided.
#[derive(Default)]
pub(super) struct WorkingSet {
    /// Every cluster engaged with this replica, and its share.
    pub(super) clusters: Mutex<Engagements<Share>>,
    /// Wakes the looks: a fence lost or handed, a standing renewed, a
    /// cluster engaged.
    pub(super) wake: Arc<Notify>,
    /// Fired by the first look, once this replica is ready, that had
    /// nothing to take or hand back: its share of the fleet has settled.
    pub(super) settled: CancellationToken,
    /// The joining peers this replica may stand in for, as the last look
    /// found them (logged when that changes).
    pub(super) standing_in: watch::Sender<BTreeSet<String>>,
    /// Fences held with the peer Lease whose release failed, tried again
    /// at every look: unlike a renewed fence, such a fence does not lapse.
    pub(super) unreleased: Mutex<Vec<fence::Fence>>,
    /// The clusters worked on, as of the last look, hand-over or
    /// inheritance: what `ShardedCoordinator::working_set` follows.
    shown: watch::Sender<Vec<ClusterName>>,
}

impl WorkingSet {
    /// The clusters this replica works on now (it holds their fences and
    /// the work under them goes on), sorted.
    pub(super) fn working_on(&self) -> Vec<ClusterName> {
        crate::lock(&self.clusters)
            .iter()
            .filter(|(_, entry)| {
                entry
                    .data
                    .held
                    .as_ref()
                    .is_some_and(|held| !held.work.is_cancelled())
            })
            .map(|(name, _)| name.clone())
            .collect()
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
}

/// What this replica keeps for each cluster of the fleet.
pub(super) struct Share {
    pub(super) components: Vec<Arc<dyn Aware>>,
    pub(super) held: Option<Held>,
    pub(super) retry_at: Option<Instant>,
    /// Attempts in a row that found the fence held by another replica.
    pub(super) busy: u32,
    /// The fence as this replica last wrote it, from a hold that ended
    /// with its epoch: taken again by writing over it.
    pub(super) last_written: Option<Lease>,
}

/// A cluster this replica works on: its fence and the work's lifetime.
pub(super) struct Held {
    pub(super) fence: fence::Fence,
    pub(super) work: CancellationToken,
    /// For a fence inherited from an ended epoch and not yet written as
    /// this replica's own: until when it may be worked on so.
    pub(super) inherited_until: Option<Timestamp>,
}

impl Held {
    /// Work under `fence` that ends with the fence or the cluster.
    pub(super) fn new(fence: fence::Fence, lifetime: &CancellationToken) -> Self {
        let work = child_until(lifetime, fence.lost());
        Self {
            fence,
            work,
            inherited_until: None,
        }
    }

    pub(super) fn is_lost(&self) -> bool {
        self.fence.lost().is_cancelled()
    }
}

/// What engaging a cluster under a fence just held takes: the work's
/// token, the cluster and its components.
pub(super) type Start = (CancellationToken, Cluster, Vec<Arc<dyn Aware>>);

/// Holds `fence` for `entry`'s cluster from now on; the work under it
/// starts with what this returns.
pub(super) fn hold(entry: &mut Engagement<Share>, fence: fence::Fence) -> Start {
    let held = Held::new(fence, &entry.lifetime);
    let start = (
        held.work.clone(),
        entry.cluster.clone(),
        entry.data.components.clone(),
    );
    entry.data.held = Some(held);
    entry.data.retry_at = None;
    entry.data.busy = 0;
    start
}

/// A cluster handed back at shutdown: its fence and the components whose
/// work must settle first.
pub(super) type HandedBack = (ClusterName, Held, Vec<Arc<dyn Aware>>);
