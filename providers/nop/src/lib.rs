//! A provider with no clusters (Go: `providers/nop`).
//!
//! Useful where a provider is required but only the local cluster matters:
//! every lookup is [`Error::ClusterNotFound`], indexes are accepted and go
//! nowhere, and [`RunnableProvider::start`] waits for shutdown.

use std::sync::Arc;

use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, Provider, RunnableProvider};
use tokio_util::sync::CancellationToken;

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
    async fn start(
        &self,
        shutdown: CancellationToken,
        _aware: Arc<dyn Aware>,
    ) -> Result<(), Error> {
        shutdown.cancelled().await;
        Ok(())
    }
}
