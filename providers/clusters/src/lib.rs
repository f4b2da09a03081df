//! A provider whose clusters are added and removed by hand (Go:
//! `providers/clusters`).
//!
//! Clusters may be added before or after the provider starts; those added
//! before are engaged when it starts. Removing a cluster ends its lifetime,
//! which disengages it everywhere. [`Provider::get`](multicluster_runtime::Provider::get) returns the very
//! instance that was added. Starting twice is an error.

use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::{
    Cluster, ClusterName, Error, InventoryEngaged, ProviderContext, RunnableProvider,
};

/// Clusters managed by the caller.
#[derive(Clone, Debug, Default)]
pub struct ClustersProvider {
    clusters: Clusters,
}

impl ClustersProvider {
    /// An empty provider.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a cluster; an existing name is [`Error::ClusterExists`].
    pub fn add(&self, name: impl Into<ClusterName>, cluster: Cluster) -> Result<(), Error> {
        self.clusters.add(name, cluster)
    }

    /// Adds or replaces a cluster; `fingerprint` identifies its connection
    /// config, and an equal fingerprint leaves the existing cluster in
    /// place. Returns whether anything changed.
    pub fn add_or_replace(
        &self,
        name: impl Into<ClusterName>,
        cluster: Cluster,
        fingerprint: impl Into<String>,
    ) -> bool {
        self.clusters.add_or_replace(name, cluster, fingerprint)
    }

    /// Removes a cluster; returns whether it was there.
    pub fn remove(&self, name: &ClusterName) -> bool {
        self.clusters.remove(name)
    }
}

impl ClusterSetProvider for ClustersProvider {
    fn cluster_set(&self) -> &Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for ClustersProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        // Its clusters are the program's to add: those added before the
        // start are engaged now (and the inventory said engaged), and
        // nothing more is to be found.
        let engaged = self.clusters.start(&context)?;
        context.shutdown.cancelled().await;
        Ok(engaged)
    }
}
