//! A provider with exactly one cluster (Go: `providers/single`).
//!
//! The cluster is engaged once when the provider starts and stays engaged
//! until shutdown. Lookups of its name return it; any other name is
//! [`Error::ClusterNotFound`]. Indexes go to that cluster's cache.

use multicluster_runtime::provider::lock;
use std::sync::Mutex;

use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::{
    Cluster, ClusterName, Error, InventoryEngaged, Provider, ProviderContext, RunnableProvider,
};

/// One named cluster.
#[derive(Debug)]
pub struct SingleProvider {
    name: ClusterName,
    cluster: Cluster,
    started: Mutex<bool>,
}

impl SingleProvider {
    /// A provider whose only cluster is `cluster`, known as `name`.
    pub fn new(name: impl Into<ClusterName>, cluster: Cluster) -> Self {
        Self {
            name: name.into(),
            cluster,
            started: Mutex::new(false),
        }
    }

    /// The cluster's name.
    pub fn name(&self) -> &ClusterName {
        &self.name
    }
}

#[async_trait::async_trait]
impl Provider for SingleProvider {
    async fn get(&self, name: &ClusterName) -> Result<Cluster, Error> {
        if *name == self.name {
            Ok(self.cluster.clone())
        } else {
            Err(Error::ClusterNotFound(name.clone()))
        }
    }

    async fn index_field(&self, index: FieldIndex) -> Result<(), Error> {
        self.cluster.cache().index_field(&index);
        Ok(())
    }
}

#[async_trait::async_trait]
impl RunnableProvider for SingleProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        let (shutdown, aware) = (context.shutdown.clone(), context.aware.clone());
        {
            let mut started = lock(&self.started);
            if *started {
                return Err(Error::AlreadyStarted("single provider"));
            }
            *started = true;
        }
        aware.engage(
            shutdown.child_token(),
            self.name.clone(),
            self.cluster.clone(),
        )?;
        let engaged = context.inventory_engaged();
        shutdown.cancelled().await;
        Ok(engaged)
    }
}
