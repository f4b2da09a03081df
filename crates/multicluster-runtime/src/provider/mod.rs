//! The provider contract, and what provider authors build on.
//!
//! [`Provider`], [`RunnableProvider`] and [`Aware`] are the contract (also
//! at the crate root). The modules below are the parts the providers of
//! this workspace are made of, for out-of-tree providers to use as well:
//!
//! - [`clusters`]: the set a provider keeps its clusters in;
//! - [`discovery`]: a provider as a controller over its management
//!   cluster, building several clients at once;
//! - [`kubeconfig`]: a cluster to build from kubeconfig text, as a
//!   provider found it (the client itself comes from [`crate::client`]);
//! - [`member`]: the client and cache options a provider builds each
//!   member with, the same for all or chosen per inventory object;
//! - [`failures`]: per-object failure records and their metrics;
//! - [`watch_filter`]: the `cluster.x-k8s.io/watch-filter` label
//!   convention.

pub mod clusters;
pub mod discovery;
pub mod failures;
pub mod kubeconfig;
pub mod member;
pub mod watch_filter;

/// Locks a `std::sync::Mutex`, carrying on with the data as it was left if
/// a holder panicked: what every provider of this workspace uses for its
/// short critical sections.
pub use crate::sync::lock;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cache::FieldIndex;
use crate::{Cluster, ClusterName, Error};

/// Something that wants to know about every cluster of the fleet: the
/// manager, controllers, other cluster-aware components.
pub trait Aware: Send + Sync {
    /// Start working on `cluster`, known in the fleet as `name`, until
    /// `lifetime` is cancelled. (The fleet name can differ from
    /// [`Cluster::name`]: the multi provider prefixes it.)
    ///
    /// Must not block (spawn what runs for the cluster's life) and must be
    /// re-entrant. Engaging the same instance again is a no-op; engaging a
    /// different instance under the same name replaces the old one (for
    /// example after credential rotation), whose work stops. An engagement
    /// whose `lifetime` has already ended is stale (it arrived after the
    /// one that replaced it) and is ignored.
    ///
    /// The lifetime ends when the cluster leaves the fleet, when it is
    /// replaced, and also when the process stops (the manager releases
    /// every cluster at shutdown). A component that cleans up after a
    /// cluster that left (deletes what it made for it on a hub, say) must
    /// tell these apart: [`Manager::is_stopping`](crate::Manager::is_stopping)
    /// is true from before any lifetime ends at shutdown.
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
    ) -> Result<(), Error>;

    /// Completes once nothing started for the cluster `name` is running any
    /// more, after its lifetime has ended: a controller's running
    /// reconciles have finished. The sharded coordinator waits for this
    /// before handing a cluster to another replica. The default completes
    /// at once, for components whose work stops with the lifetime.
    fn settled(&self, name: &ClusterName) -> futures::future::BoxFuture<'static, ()> {
        let _ = name;
        Box::pin(std::future::ready(()))
    }

    /// Gets ready to work on `cluster` without doing any work: starts the
    /// informers the component will read, so that a later
    /// [`engage`](Aware::engage) finds synced caches. A standby replica
    /// under [leader election](crate::coordinator::leader_election) warms every cluster
    /// it would work on if it led. Must not block; the default does
    /// nothing.
    fn warm(&self, name: &ClusterName, cluster: &Cluster) {
        let _ = (name, cluster);
    }
}

/// Looks up clusters of the fleet by name.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// The engaged cluster of that name, or [`Error::ClusterNotFound`].
    async fn get(&self, name: &ClusterName) -> Result<Cluster, Error>;

    /// Registers a field index on every cluster this provider has, now and
    /// later.
    async fn index_field(&self, index: FieldIndex) -> Result<(), Error>;
}

/// A provider that discovers clusters by itself.
#[async_trait::async_trait]
pub trait RunnableProvider: Provider {
    /// Runs discovery until `shutdown` fires, engaging every cluster found
    /// through `aware` with a lifetime that is cancelled when the cluster
    /// leaves the fleet.
    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error>;

    /// Records the provider's own metrics (its discovery controller,
    /// engagement failures) in `metrics` unless it was given a registry of
    /// its own. The manager calls this with its registry before
    /// [`RunnableProvider::start`]; the default records nothing.
    fn use_metrics(&self, metrics: &crate::metrics::Metrics) {
        let _ = metrics;
    }
}
