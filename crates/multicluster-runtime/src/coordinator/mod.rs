//! Which replica works on which cluster.
//!
//! The manager hands every ready cluster to its [`Coordinator`], which
//! decides whether this replica engages it:
//!
//! - by default, with no coordinator set: one replica works on everything;
//! - [`leader_election::LeaderElection`]: one Lease holder works on
//!   everything, the other replicas stand by with warm caches;
//! - [`sharding::ShardedCoordinator`] (feature `sharding`): the replicas
//!   share the fleet, each cluster fenced by a Lease of its own.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::error::Error;
use crate::multicluster::Aware;
use crate::name::ClusterName;

pub(crate) mod fence;
pub mod leader_election;
pub(crate) mod lease;
mod names;
#[cfg(feature = "sharding")]
pub mod sharding;

pub(crate) use names::dns1123;
#[cfg(feature = "sharding")]
pub(crate) use names::lease_name;

/// Annotation on a fence Lease held with its holder's peer Lease rather than
/// renewed itself: `<peer Lease name>/<epoch>`. The fence holds while that
/// peer Lease is live and announces that epoch.
pub(crate) const HELD_WITH_ANNOTATION: &str = "mcr.sigs.k8s.io/held-with";

/// Annotation on a peer Lease: the epoch of its replica's standing. A
/// replica that could not renew its peer Lease in time starts a new epoch,
/// which frees every fence it held with the old one.
pub(crate) const EPOCH_ANNOTATION: &str = "mcr.sigs.k8s.io/epoch";

/// Decides which components engage a cluster. The basic coordinator engages
/// all of them; a sharded one ([`sharding::ShardedCoordinator`])
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
}

/// Adds to `held` the components of `offered` it does not have yet (a
/// coordinator asked again for a cluster it has, as components are added
/// later), and returns those.
pub(crate) fn add_components(
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
pub(crate) fn engage_each(
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
