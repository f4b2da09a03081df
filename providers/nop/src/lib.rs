//! A provider with no clusters (Go: `providers/nop`).
//!
//! Useful where a provider is required but only the local cluster matters:
//! every lookup is [`Error::ClusterNotFound`], indexes are accepted and go
//! nowhere, and [`RunnableProvider::start`] waits for shutdown.

use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::{
    Cluster, ClusterName, Error, InventoryEngaged, Provider, ProviderContext, RunnableProvider,
};

/// The provider with no clusters.
#[derive(Clone, Copy, Debug, Default)]
pub struct NopProvider;

#[async_trait::async_trait]
impl Provider for NopProvider {
    async fn get(&self, name: &ClusterName) -> Result<Cluster, Error> {
        Err(Error::ClusterNotFound(name.clone()))
    }

    async fn index_field(&self, _index: FieldIndex) -> Result<(), Error> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl RunnableProvider for NopProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        // Nothing to engage: the inventory is engaged at once.
        let engaged = context.inventory_engaged();
        context.shutdown.cancelled().await;
        Ok(engaged)
    }
}
