//! Every namespace of one host cluster as a cluster (Go: `providers/namespace`).
//!
//! Each namespace becomes a virtual cluster named after it. Inside, the
//! virtual cluster has one namespace, `default`, which is the host namespace:
//!
//! - its client moves reads, writes, patches (merge, JSON, strategic, apply)
//!   and watches into the host namespace and answers with `default`; other
//!   namespaces, Namespace objects and cluster-scoped resources are refused
//!   with a 403 naming the reason (Go's provider panics on patch);
//! - its cache is a view of the host cache ([`Cache::scoped`]), so one host
//!   watch per type serves every virtual cluster;
//! - a namespace that is deleted or starts terminating leaves the fleet.
//!
//! With a watch filter only namespaces labelled
//! `cluster.x-k8s.io/watch-filter=<value>` become clusters, so several
//! instances can split one host between them; a namespace selector
//! ([`NamespaceOptions::namespace_selector`]) narrows them further, and
//! [`without_system_namespaces`] keeps out the namespaces Kubernetes
//! keeps for itself (the examples' default), so a controller over the
//! fleet needs no right to write in them.

mod client;
mod rewrite;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::core::{Expression, Selector, SelectorExt};
use multicluster_runtime::cache::{Cache, CacheEvent, CacheOptions};
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::provider::watch_filter::WatchFilter;
use multicluster_runtime::{
    Cluster, ClusterName, Error, Inventory, InventoryEngaged, ProviderContext, RunnableProvider,
};

/// The namespace each virtual cluster shows its host namespace as.
pub const VIRTUAL_NAMESPACE: &str = multicluster_runtime::cache::Cache::VIRTUAL_NAMESPACE;

/// The label key of the watch-filter convention (`cluster.x-k8s.io/watch-filter`).
pub const WATCH_FILTER_LABEL: &str = WatchFilter::LABEL;

/// The namespaces Kubernetes keeps for itself.
pub const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// The label the API server sets on every namespace to its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A namespace selector keeping out `names` (by the label the API server
/// sets to every namespace's name, which nobody can change).
pub fn without_namespaces<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Selector {
    let mut selector = Selector::default();
    let names: std::collections::BTreeSet<String> = names.into_iter().map(Into::into).collect();
    if !names.is_empty() {
        selector.extend([Expression::NotIn(NAMESPACE_NAME_LABEL.to_string(), names)]);
    }
    selector
}

/// A namespace selector keeping out [`SYSTEM_NAMESPACES`].
pub fn without_system_namespaces() -> Selector {
    without_namespaces(SYSTEM_NAMESPACES)
}

/// Options of the namespace provider.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct NamespaceOptions {
    /// Only namespaces whose `cluster.x-k8s.io/watch-filter` label has this
    /// value become clusters; `None` takes every namespace.
    pub watch_filter: Option<String>,
    /// Only namespaces whose labels match become clusters (besides the
    /// watch filter); `None` takes every namespace. A namespace relabelled
    /// out of it leaves the fleet. [`without_system_namespaces`] is the
    /// examples' default.
    pub namespace_selector: Option<Selector>,
    /// How the host cache watches (selectors, page size, streaming lists,
    /// per type too; `managedFields` stripping; watch backoff). One host
    /// watch per type serves every virtual cluster, so these are the member
    /// options of all of them at once. Its namespace restriction is not
    /// used: the provider must see every namespace.
    pub cache: CacheOptions,
}

multicluster_runtime::option_setters!(NamespaceOptions {
    watch_filter: impl Into<Option<String>>,
    namespace_selector: impl Into<Option<Selector>>,
    cache: CacheOptions,
});

/// Namespaces of a host cluster as virtual clusters.
pub struct NamespaceProvider {
    host: Cluster,
    options: NamespaceOptions,
    clusters: Clusters,
    discovery: Arc<client::Discovery>,
}

impl NamespaceProvider {
    /// A provider over the namespaces of the cluster `host` reaches. It
    /// keeps its own cache of the host, one watch per type for every
    /// virtual cluster, with [`NamespaceOptions::cache`] but no namespace
    /// restriction (it must see every namespace).
    pub fn new(host: kube::Client, options: NamespaceOptions) -> Self {
        let cache = Cache::with_options(
            "host",
            host.clone(),
            options.cache.clone().namespace(None::<String>),
        );
        Self {
            host: Cluster::with_cache("host", host, cache),
            options,
            clusters: Clusters::new(),
            discovery: Arc::default(),
        }
    }

    /// The host cluster, whose cache serves every virtual cluster. Give it
    /// to the manager as its local cluster and the manager's local work
    /// shares that cache too.
    pub fn host(&self) -> &Cluster {
        &self.host
    }

    /// Names of the virtual clusters, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.clusters.names()
    }

    fn wanted(&self, namespace: &Namespace) -> bool {
        if namespace.metadata.deletion_timestamp.is_some() {
            return false;
        }
        let labels = namespace.metadata.labels.clone().unwrap_or_default();
        WatchFilter::new(self.options.watch_filter.as_deref()).passes(Some(&labels))
            && self
                .options
                .namespace_selector
                .as_ref()
                .is_none_or(|selector| selector.matches(&labels))
    }

    fn virtual_cluster(&self, namespace: &str) -> Cluster {
        let client = client::scoped_client(self.host.client(), namespace, self.discovery.clone());
        let cache = Cache::scoped(namespace, self.host.cache(), namespace);
        Cluster::with_cache(namespace, client, cache)
    }
}

impl ClusterSetProvider for NamespaceProvider {
    fn cluster_set(&self) -> &Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for NamespaceProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        let shutdown = context.shutdown.clone();
        // It says the inventory is engaged itself, once the host's
        // namespaces are listed.
        self.clusters.start_discovering(&context)?;
        let informer = self.host.cache().informer::<Namespace>();
        let mut namespaces = informer.subscribe();
        let mut engaged = None;
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => {
                    return Ok(engaged.unwrap_or_else(|| context.stopped_before_engaged()));
                }
                // Once the host's namespaces are listed, those wanted are
                // engaged from the store at once (their events, still on
                // the way, then change nothing), and the inventory is.
                () = informer.wait_ready(), if engaged.is_none() => {
                    for namespace in informer.store().state() {
                        self.applied(&namespace);
                    }
                    engaged = Some(context.inventory_engaged());
                    continue;
                }
                event = namespaces.next() => event,
            };
            let Some(event) = event else {
                return Err(Error::Watch {
                    what: "the host's namespaces".to_string(),
                    source: "the host cache stopped".into(),
                });
            };
            match &event {
                CacheEvent::Applied { new, .. } if self.wanted(new) => self.applied(new),
                _ => {
                    let Some(name) = event.object().metadata.name.as_deref() else {
                        continue;
                    };
                    if self.clusters.remove(&ClusterName::from(name)) {
                        tracing::info!(namespace = %name, "namespace leaves the fleet");
                    }
                }
            }
        }
    }
}

impl NamespaceProvider {
    /// Engages `namespace` if it is wanted and not engaged yet; updates its
    /// labels, which are the virtual cluster's, if it is.
    fn applied(&self, namespace: &Namespace) {
        let Some(name) = namespace.metadata.name.as_deref() else {
            return;
        };
        if !self.wanted(namespace) {
            return;
        }
        let cluster_name = ClusterName::from(name);
        let inventory = Inventory::of_object(&namespace.metadata);
        match self.clusters.get(&cluster_name) {
            Ok(cluster) => {
                cluster.set_inventory(inventory);
            }
            Err(_) => {
                tracing::info!(namespace = %name, "namespace joins the fleet");
                let cluster = self.virtual_cluster(name);
                cluster.set_inventory(inventory);
                if let Err(err) = self.clusters.add(cluster_name, cluster) {
                    tracing::warn!(namespace = %name, error = %err, "could not add the namespace");
                }
            }
        }
    }
}

impl std::fmt::Debug for NamespaceProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceProvider")
            .field("options", &self.options)
            .field("clusters", &self.names())
            .finish_non_exhaustive()
    }
}
