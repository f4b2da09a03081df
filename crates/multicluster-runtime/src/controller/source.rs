//! Event sources of a controller: which resource to watch, in which
//! clusters, which events count, and which requests they map to.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::api::DynamicObject;
use tokio_util::sync::CancellationToken;

use super::{Controller, Request};
use crate::cache::{CacheEvent, CachedResource};
use crate::cluster::Cluster;
use kube::core::Selector;
use multicluster_core::ClusterName;

/// Which clusters a source watches, by where they are and by name (a
/// selection by the clusters' labels is [`super::Watch::cluster_labels`]).
#[derive(Clone, Default)]
pub enum ClusterScope {
    /// Every cluster a provider engages (not the local cluster).
    #[default]
    Fleet,
    /// Only the local cluster.
    Local,
    /// The fleet and the local cluster.
    Both,
    /// The clusters whose name passes the filter (the local cluster's name is
    /// empty).
    Matching(Arc<dyn Fn(&ClusterName) -> bool + Send + Sync>),
}

impl ClusterScope {
    /// Whether a source with this selection watches `name`.
    pub fn includes(&self, name: &ClusterName) -> bool {
        match self {
            ClusterScope::Fleet => !name.is_local(),
            ClusterScope::Local => name.is_local(),
            ClusterScope::Both => true,
            ClusterScope::Matching(filter) => filter(name),
        }
    }
}

impl Debug for ClusterScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterScope::Fleet => f.write_str("Fleet"),
            ClusterScope::Local => f.write_str("Local"),
            ClusterScope::Both => f.write_str("Both"),
            ClusterScope::Matching(_) => f.write_str("Matching(..)"),
        }
    }
}

/// Decides whether an event should trigger reconciles.
pub type Filter<K> = Arc<dyn Fn(&CacheEvent<K>) -> bool + Send + Sync>;

/// Maps an object to the `(namespace, name)` of the primary objects to
/// reconcile in the same cluster.
pub(crate) type Mapper<K> = Arc<dyn Fn(&K) -> Vec<(Option<String>, String)> + Send + Sync>;

/// Maps an object, seen in the cluster [`MapContext::cluster`], to requests
/// in any cluster (see [`super::map`] for ready ones).
pub(crate) type RequestMapper<K> = Arc<dyn Fn(&MapContext<'_>, &K) -> Vec<Request> + Send + Sync>;

/// What a mapper ([`ControllerBuilder::watches`](super::ControllerBuilder::watches))
/// knows besides the object: where the event came from and which clusters
/// the controller works on.
pub struct MapContext<'a> {
    cluster: &'a ClusterName,
    controller: &'a Controller,
}

impl MapContext<'_> {
    /// The cluster the event came from.
    pub fn cluster(&self) -> &ClusterName {
        self.cluster
    }

    /// A request for `namespace/name` in the cluster the event came from:
    /// what a mapper within one cluster returns.
    pub fn here(&self, namespace: Option<&str>, name: impl Into<String>) -> Request {
        Request::new(self.cluster.clone(), namespace, name)
    }

    /// The clusters engaged with the controller now (the local cluster
    /// among them when it is), sorted. Requests for other clusters are
    /// dropped.
    pub fn engaged_clusters(&self) -> Vec<ClusterName> {
        self.controller.inner.work.queue().engaged()
    }

    /// The engaged cluster of that name, to read its labels
    /// ([`Cluster::inventory`]) or its cache.
    pub fn engaged(&self, name: &ClusterName) -> Option<Cluster> {
        self.controller.cluster(name)
    }
}

/// A same-cluster [`Mapper`] as a [`RequestMapper`].
pub(crate) fn in_same_cluster<K: 'static>(mapper: Mapper<K>) -> RequestMapper<K> {
    Arc::new(move |context, object| {
        mapper(object)
            .into_iter()
            .map(|(namespace, name)| Request {
                cluster: context.cluster().clone(),
                namespace,
                name,
            })
            .collect()
    })
}

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

    /// Passes events of objects carrying every label in `labels`. An update
    /// passes when the object carried them before *or* carries them now, so
    /// the reconciler also learns of an object that just lost a label (and,
    /// say, removes what it made for it); a deletion passes when the
    /// deleted object carried them.
    pub fn labels<K: Resource>(labels: BTreeMap<String, String>) -> Filter<K> {
        let carries = move |object: &K| {
            let have = object.meta().labels.as_ref();
            labels
                .iter()
                .all(|(key, value)| have.and_then(|have| have.get(key)) == Some(value))
        };
        Arc::new(move |event| match event {
            CacheEvent::Applied { old, new } => {
                carries(new) || old.as_deref().is_some_and(&carries)
            }
            CacheEvent::Deleted(gone) => carries(gone),
        })
    }

    /// Passes events for which `filter` holds.
    pub fn custom<K>(filter: impl Fn(&CacheEvent<K>) -> bool + Send + Sync + 'static) -> Filter<K> {
        Arc::new(filter)
    }
}

/// A source without its type, as the controller keeps it.
pub(crate) trait Source: Send + Sync {
    fn clusters(&self) -> &ClusterScope;
    /// The selector over cluster labels, if the source has one.
    fn cluster_labels(&self) -> Option<&Selector>;
    /// Starts feeding `controller`'s queue from `cluster` until `stop`
    /// fires.
    fn start(
        &self,
        name: ClusterName,
        cluster: &Cluster,
        controller: Controller,
        stop: CancellationToken,
    );
    /// Starts the informer this source reads in `cluster`'s cache, without
    /// feeding any queue.
    fn warm(&self, cluster: &Cluster);
}

/// Opens a subscription to one informer of a cluster's cache.
type Subscribe<K> =
    Arc<dyn Fn(&crate::cache::Cache) -> crate::cache::Subscription<K> + Send + Sync>;

/// Starts one informer of a cluster's cache (informers run from first use
/// until the cache stops).
type Ensure = Arc<dyn Fn(&crate::cache::Cache) + Send + Sync>;

/// Events of one informer per cluster, filtered and mapped to requests.
pub(crate) struct InformerSource<K> {
    clusters: ClusterScope,
    labels: Option<Selector>,
    filters: Vec<Filter<K>>,
    mapper: RequestMapper<K>,
    subscribe: Subscribe<K>,
    ensure: Ensure,
}

impl<K: CachedResource> InformerSource<K> {
    /// A source over the typed informer of `K`.
    pub(crate) fn typed(watch: super::Watch<K>, mapper: RequestMapper<K>) -> Self {
        Self::new(
            watch,
            mapper,
            Arc::new(|cache| cache.informer::<K>().subscribe()),
            Arc::new(|cache| {
                cache.informer::<K>();
            }),
        )
    }
}

impl InformerSource<DynamicObject> {
    /// A source over the dynamic informer of `resource`.
    pub(crate) fn dynamic(
        resource: kube::api::ApiResource,
        watch: super::Watch<DynamicObject>,
        mapper: RequestMapper<DynamicObject>,
    ) -> Self {
        let warm = resource.clone();
        Self::new(
            watch,
            mapper,
            Arc::new(move |cache| cache.dynamic(&resource).subscribe()),
            Arc::new(move |cache| {
                cache.dynamic(&warm);
            }),
        )
    }
}

impl<K> InformerSource<K> {
    fn new(
        watch: super::Watch<K>,
        mapper: RequestMapper<K>,
        subscribe: Subscribe<K>,
        ensure: Ensure,
    ) -> Self {
        let (clusters, labels, filters) = watch.into_parts();
        Self {
            clusters,
            labels,
            filters,
            mapper,
            subscribe,
            ensure,
        }
    }
}

impl<K: Send + Sync + 'static> Source for InformerSource<K> {
    fn clusters(&self) -> &ClusterScope {
        &self.clusters
    }

    fn cluster_labels(&self) -> Option<&Selector> {
        self.labels.as_ref()
    }

    fn start(
        &self,
        name: ClusterName,
        cluster: &Cluster,
        controller: Controller,
        stop: CancellationToken,
    ) {
        let subscription = (self.subscribe)(cluster.cache());
        forward(
            subscription,
            name,
            self.filters.clone(),
            self.mapper.clone(),
            controller,
            stop,
        );
    }

    fn warm(&self, cluster: &Cluster) {
        (self.ensure)(cluster.cache());
    }
}

fn forward<K: Send + Sync + 'static>(
    mut subscription: crate::cache::Subscription<K>,
    cluster: ClusterName,
    filters: Vec<Filter<K>>,
    mapper: RequestMapper<K>,
    controller: Controller,
    stop: CancellationToken,
) {
    controller.inner.catching_up(&cluster);
    tokio::spawn(async move {
        let mut behind = true;
        loop {
            if behind && subscription.caught_up() {
                controller.inner.caught_up(&cluster);
                behind = false;
            }
            let event = tokio::select! {
                () = stop.cancelled() => break,
                // An empty first list brings no event to wake for.
                () = subscription.listed(), if behind && !subscription.is_listed() => continue,
                event = subscription.next() => event,
            };
            let Some(event) = event else { break };
            if !filters.iter().all(|filter| filter(&event)) {
                continue;
            }
            let context = MapContext {
                cluster: &cluster,
                controller: &controller,
            };
            for request in mapper(&context, event.object()) {
                controller.inner.work.queue().add(request);
            }
        }
        // Stopped first: nobody is to wait for it.
        if behind {
            controller.inner.caught_up(&cluster);
        }
    });
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    fn labelled(sync: Option<&str>) -> Arc<ConfigMap> {
        let mut cm = ConfigMap::default();
        cm.metadata.labels =
            sync.map(|value| BTreeMap::from([("sync".to_string(), value.to_string())]));
        Arc::new(cm)
    }

    #[test]
    fn a_label_filter_passes_updates_that_add_or_remove_the_label() {
        let filter = filters::labels::<ConfigMap>(BTreeMap::from([(
            "sync".to_string(),
            "true".to_string(),
        )]));
        let update = |old: Option<&str>, new: Option<&str>| CacheEvent::Applied {
            old: Some(labelled(old)),
            new: labelled(new),
        };
        assert!(filter(&update(None, Some("true"))), "labelled");
        assert!(
            filter(&update(Some("true"), Some("true"))),
            "still labelled"
        );
        assert!(filter(&update(Some("true"), None)), "unlabelled");
        assert!(filter(&update(Some("true"), Some("false"))), "relabelled");
        assert!(!filter(&update(None, Some("false"))), "never labelled");
        assert!(!filter(&CacheEvent::Applied {
            old: None,
            new: labelled(None),
        }));
        assert!(filter(&CacheEvent::Deleted(labelled(Some("true")))));
        assert!(!filter(&CacheEvent::Deleted(labelled(None))));
    }
}
