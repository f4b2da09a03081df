//! The contract between providers and the components that work on their
//! clusters (Go: `pkg/multicluster`): a [`Provider`] looks clusters up, a
//! [`RunnableProvider`] discovers them and engages each with every
//! [`Aware`] component, started with a [`ProviderContext`]. It depends on
//! nothing above it: clusters, the cache's index type, names, errors and
//! the metrics registry the context carries.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cache::FieldIndex;
use crate::cluster::Cluster;
use crate::error::Error;
use crate::metrics::Metrics;
use multicluster_core::ClusterName;

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
    /// under leader election (`multicluster-coordinator`) warms every cluster
    /// it would work on if it led. Must not block; the default does
    /// nothing.
    fn warm(&self, name: &ClusterName, cluster: &Cluster) {
        let _ = (name, cluster);
    }

    /// Whether this component works on the local cluster on every replica
    /// of a fleet shared among replicas (a sharded coordinator), rather
    /// than on the one replica the coordinator gives it to: a component
    /// whose members' work reads the hub (the local cluster) needs it
    /// wherever its members are worked on. Such a component must make
    /// its writes to the local cluster safe for several replicas at once.
    /// The default is false.
    fn local_on_every_replica(&self) -> bool {
        false
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
    /// Runs discovery until `context.shutdown` fires, engaging every
    /// cluster found through `context.aware` with a lifetime that is
    /// cancelled when the cluster leaves the fleet, and recording in
    /// `context.metrics`. A provider that keeps its clusters in a
    /// [`Fleet`](crate::provider::discovery::Discovered) hands the context to
    /// [`Discovered::start`](crate::provider::discovery::Discovered::start), which
    /// does all three: its unusable inventory then shows on `/clusters`
    /// without further wiring.
    ///
    /// It returns what [`ProviderContext::inventory_engaged`] gave it (or,
    /// stopped before that, [`ProviderContext::stopped_before_engaged`]):
    /// a provider cannot compile without saying when the inventory it first
    /// found is engaged, which a sharded replica waits for before it is
    /// handed clusters. [`Clusters::start`](crate::provider::clusters::Clusters::start)
    /// and [`Discovered::run`](crate::provider::discovery::Discovered::run)
    /// say it for providers built on them.
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error>;
}

/// What [`RunnableProvider::start`] returns: that the provider said its
/// inventory is engaged ([`ProviderContext::inventory_engaged`]), or
/// stopped before it could ([`ProviderContext::stopped_before_engaged`]).
/// Only a [`ProviderContext`] makes one, so a provider cannot forget the
/// call and leave a sharded replica waiting for its `inventory_wait`
/// (300 s by default) before it is handed any cluster.
#[derive(Debug)]
pub struct InventoryEngaged(());

/// What a provider is handed when it is started: when to stop, whom to
/// engage clusters with, and where to record. Cheap to clone.
#[derive(Clone)]
#[non_exhaustive]
pub struct ProviderContext {
    /// Fires when the provider is to stop.
    pub shutdown: CancellationToken,
    /// Whom every cluster found is engaged with (the manager).
    pub aware: Arc<dyn Aware>,
    /// The registry the provider records in (its discovery controller,
    /// engagement failures, unusable inventory and duplicates, which the
    /// manager's `/clusters` shows), unless it was given one of its own.
    pub metrics: Metrics,
    /// Fired by [`ProviderContext::inventory_engaged`].
    inventory_engaged: CancellationToken,
}

impl ProviderContext {
    /// A context stopping at `shutdown`, engaging with `aware`, recording
    /// in `metrics`.
    pub fn new(shutdown: CancellationToken, aware: Arc<dyn Aware>, metrics: Metrics) -> Self {
        Self {
            shutdown,
            aware,
            metrics,
            inventory_engaged: CancellationToken::new(),
        }
    }

    /// The same context with `aware` instead (a provider of providers
    /// engaging through a component of its own), stopping at `shutdown`.
    /// Its [`inventory_engaged`](Self::inventory_engaged) is its own: the
    /// provider of providers says its inventory is engaged once each of
    /// its providers has.
    pub fn with(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Self {
        Self {
            shutdown,
            aware,
            metrics: self.metrics.clone(),
            inventory_engaged: CancellationToken::new(),
        }
    }

    /// Says that every cluster of the inventory as the provider first found
    /// it has been engaged (handed to `aware`) or found unusable. Call it
    /// once, after the first full read of the inventory; later calls do
    /// nothing.
    ///
    /// A sharded replica says it is ready to be handed clusters only then
    /// (or after its `ShardingOptions::inventory_wait`): handed over
    /// earlier, they would sit unworked until the provider got to them.
    ///
    /// The [`InventoryEngaged`] it returns is what
    /// [`RunnableProvider::start`] returns in the end.
    pub fn inventory_engaged(&self) -> InventoryEngaged {
        self.inventory_engaged.cancel();
        InventoryEngaged(())
    }

    /// For a provider stopping (its `shutdown` fired, or it failed) before
    /// it could say its inventory is engaged: what
    /// [`RunnableProvider::start`] returns then. Says nothing: nobody waits
    /// for the inventory of a provider that stopped.
    pub fn stopped_before_engaged(&self) -> InventoryEngaged {
        InventoryEngaged(())
    }

    /// Completes once [`ProviderContext::inventory_engaged`] was called.
    pub async fn when_inventory_engaged(&self) {
        self.inventory_engaged.cancelled().await;
    }

    /// Whether [`ProviderContext::inventory_engaged`] was called.
    pub fn is_inventory_engaged(&self) -> bool {
        self.inventory_engaged.is_cancelled()
    }
}

impl std::fmt::Debug for ProviderContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderContext")
            .field("stopping", &self.shutdown.is_cancelled())
            .finish_non_exhaustive()
    }
}
