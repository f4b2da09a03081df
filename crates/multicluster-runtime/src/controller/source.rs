//! Event sources of a controller: which resource to watch, in which
//! clusters, which events count, and which requests they map to.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::api::DynamicObject;
use tokio_util::sync::CancellationToken;

use super::Request;
use super::queue::Queue;
use crate::cache::{CacheEvent, CachedResource};
use crate::{Cluster, ClusterName};

/// Which clusters a source watches.
#[derive(Clone, Default)]
pub enum Clusters {
    /// Every cluster a provider engages (not the local cluster).
    #[default]
    Fleet,
    /// Only the local cluster.
    Local,
    /// The fleet and the local cluster.
    Both,
    /// Clusters whose name passes the filter (the local cluster's name is
    /// empty).
    Matching(Arc<dyn Fn(&ClusterName) -> bool + Send + Sync>),
}

impl Clusters {
    /// Whether a source with this selection watches `name`.
    pub fn includes(&self, name: &ClusterName) -> bool {
        match self {
            Clusters::Fleet => !name.is_local(),
            Clusters::Local => name.is_local(),
            Clusters::Both => true,
            Clusters::Matching(filter) => filter(name),
        }
    }
}

impl Debug for Clusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Clusters::Fleet => f.write_str("Fleet"),
            Clusters::Local => f.write_str("Local"),
            Clusters::Both => f.write_str("Both"),
            Clusters::Matching(_) => f.write_str("Matching(..)"),
        }
    }
}

/// Decides whether an event should trigger reconciles.
pub type Filter<K> = Arc<dyn Fn(&CacheEvent<K>) -> bool + Send + Sync>;

/// Maps an object to the `(namespace, name)` of the primary objects to
/// reconcile in the same cluster.
pub type Mapper<K> = Arc<dyn Fn(&K) -> Vec<(Option<String>, String)> + Send + Sync>;

/// Ready-made event filters.
pub mod filters {
    use super::*;
    use std::collections::BTreeMap;

    /// Passes creations, deletions and updates that change
    /// `metadata.generation` (spec changes; status-only updates are dropped).
    /// Objects without a generation always pass.
    pub fn generation_changed<K: Resource>() -> Filter<K> {
        Arc::new(|event| match event {
            CacheEvent::Applied {
                old: Some(old),
                new,
            } => new.meta().generation.is_none() || old.meta().generation != new.meta().generation,
            _ => true,
        })
    }

    /// Passes events of objects carrying every label in `labels`.
    pub fn labels<K: Resource>(labels: BTreeMap<String, String>) -> Filter<K> {
        Arc::new(move |event| {
            let have = event.object().meta().labels.as_ref();
            labels
                .iter()
                .all(|(key, value)| have.and_then(|have| have.get(key)) == Some(value))
        })
    }

    /// Passes events for which `filter` holds.
    pub fn custom<K>(filter: impl Fn(&CacheEvent<K>) -> bool + Send + Sync + 'static) -> Filter<K> {
        Arc::new(filter)
    }
}

/// A source without its type, as the controller keeps it.
pub(crate) trait Source: Send + Sync {
    fn clusters(&self) -> &Clusters;
    /// Starts feeding `queue` from `cluster` until `stop` fires.
    fn start(
        &self,
        name: ClusterName,
        cluster: &Cluster,
        queue: Arc<Queue>,
        stop: CancellationToken,
    );
}

pub(crate) struct TypedSource<K> {
    pub(crate) clusters: Clusters,
    pub(crate) filters: Vec<Filter<K>>,
    pub(crate) mapper: Mapper<K>,
}

impl<K: CachedResource> Source for TypedSource<K> {
    fn clusters(&self) -> &Clusters {
        &self.clusters
    }

    fn start(
        &self,
        name: ClusterName,
        cluster: &Cluster,
        queue: Arc<Queue>,
        stop: CancellationToken,
    ) {
        let subscription = cluster.cache().informer::<K>().subscribe();
        forward(
            subscription,
            name,
            self.filters.clone(),
            self.mapper.clone(),
            queue,
            stop,
        );
    }
}

pub(crate) struct DynamicSource {
    pub(crate) resource: kube::api::ApiResource,
    pub(crate) clusters: Clusters,
    pub(crate) filters: Vec<Filter<DynamicObject>>,
    pub(crate) mapper: Mapper<DynamicObject>,
}

impl Source for DynamicSource {
    fn clusters(&self) -> &Clusters {
        &self.clusters
    }

    fn start(
        &self,
        name: ClusterName,
        cluster: &Cluster,
        queue: Arc<Queue>,
        stop: CancellationToken,
    ) {
        let subscription = cluster.cache().dynamic(&self.resource).subscribe();
        forward(
            subscription,
            name,
            self.filters.clone(),
            self.mapper.clone(),
            queue,
            stop,
        );
    }
}

fn forward<K: Send + Sync + 'static>(
    mut subscription: crate::cache::Subscription<K>,
    cluster: ClusterName,
    filters: Vec<Filter<K>>,
    mapper: Mapper<K>,
    queue: Arc<Queue>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => break,
                event = subscription.next() => event,
            };
            let Some(event) = event else { break };
            if !filters.iter().all(|filter| filter(&event)) {
                continue;
            }
            for (namespace, name) in mapper(event.object()) {
                queue.add(Request {
                    cluster: cluster.clone(),
                    namespace,
                    name,
                });
            }
        }
    });
}
