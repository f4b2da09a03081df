//! Which replica works on which cluster.
//!
//! The manager hands every ready cluster to its [`Coordinator`], which
//! decides whether this replica engages it. By default, with no
//! coordinator set, one replica works on everything. The crate
//! `multicluster-coordinator` has the others: `LeaderElection` (one Lease
//! holder works on everything, the other replicas stand by with warm
//! caches) and `ShardedCoordinator` (the replicas share the fleet, each
//! cluster fenced by a Lease of its own). This module holds what they are
//! built on: the trait, and the rules of engaging components.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::error::Error;
use crate::multicluster::Aware;
use multicluster_core::ClusterName;

/// Decides which components engage a cluster. The basic coordinator engages
/// all of them; a sharded one (`multicluster_coordinator::sharding`)
/// engages only clusters this replica owns.
#[async_trait::async_trait]
pub trait Coordinator: Send + Sync {
    /// Engages `cluster` with `components` as this replica sees fit. Must not
    /// block. Called again with more components for a cluster already
    /// engaged when components are added later.
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
        components: &[Arc<dyn Aware>],
    ) -> Result<(), Error>;

    /// Runs whatever the coordinator does in the background until `stop`,
    /// which fires once running reconciles have finished; the manager waits
    /// for it before returning. The default does nothing.
    async fn run(&self, stop: CancellationToken) -> Result<(), Error> {
        stop.cancelled().await;
        Ok(())
    }

    /// The clusters this replica works on, for a coordinator that does not
    /// work on all of them (`None`, the default, means all). The `/clusters`
    /// endpoint reports it.
    fn working_on(&self) -> Option<Vec<ClusterName>> {
        None
    }

    /// Called when the manager starts shutting down, before its
    /// controllers stop: hands the clusters this replica works on to others
    /// while the controllers still work on the ones not handed yet, so
    /// they go from one replica to the next without a pause (a sharded
    /// coordinator with fences held with the peer Lease; see
    /// `ShardingOptions::leave_handover`). The manager gives it at most
    /// its shutdown grace. The default does nothing.
    async fn leave(&self) {}

    /// Whether [`Coordinator::leave`] hands clusters over, so that the
    /// controllers keep working (new reconciles too) until it is done. With
    /// `false`, the default, they stop taking work the moment shutdown
    /// starts.
    fn hands_over_on_leave(&self) -> bool {
        false
    }

    /// Told once the provider has engaged the inventory it first found
    /// ([`crate::multicluster::ProviderContext::inventory_engaged`]; at once
    /// for a manager without a provider that discovers). A sharded
    /// coordinator is then ready to be handed clusters. The default does
    /// nothing.
    fn inventory_engaged(&self) {}

    /// Whether this replica works on `name` now: false before it holds what
    /// lets it (a fence, the leadership), after it lost that, and for a
    /// name it does not know. [`crate::Manager::get_cluster`] refuses a
    /// cluster this replica does not own. The default asks
    /// [`Coordinator::working_on`].
    fn owns(&self, name: &ClusterName) -> bool {
        self.working_on()
            .is_none_or(|names| names.binary_search(name).is_ok())
    }

    /// For a coordinator that shares the fleet among replicas working at
    /// once: this replica among them ([`Replicas`]). `None`, the default,
    /// for one replica working on everything (alone, or leading).
    fn replicas(&self) -> Option<Replicas> {
        None
    }
}

/// This replica among the replicas sharing a fleet, as its coordinator
/// sees them now ([`Coordinator::replicas`]): for components that keep
/// facts per replica on a shared object.
#[derive(Clone)]
pub struct Replicas {
    /// This replica's ID.
    pub me: String,
    /// The live replicas' IDs (this one included), sorted.
    pub live: Vec<String>,
    /// Which live replica is meant to work on a cluster (it may not hold
    /// it yet, or still be handing it over).
    pub owner: OwnerOf,
}

/// Which replica is meant to work on a cluster ([`Replicas::owner`]).
pub type OwnerOf = Arc<dyn Fn(&ClusterName) -> Option<String> + Send + Sync>;

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("me", &self.me)
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

impl Replicas {
    /// Whether `name` is meant for this replica.
    pub fn is_mine(&self, name: &ClusterName) -> bool {
        (self.owner)(name).is_some_and(|owner| owner == self.me)
    }
}

/// Adds to `held` the components of `offered` it does not have yet (a
/// coordinator asked again for a cluster it has, as components are added
/// later), and returns those.
pub fn add_components(
    held: &mut Vec<Arc<dyn Aware>>,
    offered: &[Arc<dyn Aware>],
) -> Vec<Arc<dyn Aware>> {
    let new: Vec<Arc<dyn Aware>> = offered
        .iter()
        .filter(|c| !held.iter().any(|e| Arc::ptr_eq(e, c)))
        .cloned()
        .collect();
    held.extend(new.iter().cloned());
    new
}

/// Engages each component with `cluster` under `work`, every one of them
/// even when an earlier one fails (one component's trouble does not keep
/// the others from the cluster), and returns the first failure.
pub fn engage_each(
    components: &[Arc<dyn Aware>],
    work: &CancellationToken,
    name: &ClusterName,
    cluster: &Cluster,
) -> Result<(), Error> {
    let mut first = None;
    for component in components {
        if let Err(err) = component.engage(work.clone(), name.clone(), cluster.clone()) {
            first.get_or_insert(err);
        }
    }
    first.map_or(Ok(()), Err)
}

/// A child of `parent` that is also cancelled when `also` is: work that
/// ends with its cluster's lifetime or with the hold it was started under
/// (a fence, the leadership), whichever ends first.
pub fn work_until(parent: &CancellationToken, also: &CancellationToken) -> CancellationToken {
    crate::sync::child_until(parent, also)
}

/// Engages every component with every cluster: the manager's default.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EngageAll;

#[async_trait::async_trait]
impl Coordinator for EngageAll {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
        components: &[Arc<dyn Aware>],
    ) -> Result<(), Error> {
        engage_each(components, &lifetime, &name, &cluster)
    }
}
