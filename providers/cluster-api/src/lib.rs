//! Cluster API workload clusters as a fleet (Go: `providers/cluster-api`).
//!
//! The provider watches Cluster API `Cluster` objects in a management
//! cluster. A Cluster that is ready is engaged as `<namespace>/<name>` with
//! the kubeconfig in its `<name>-kubeconfig` Secret (data key `value`):
//!
//! - readiness by default: v1beta2 `status.initialization.controlPlaneInitialized`;
//!   v1beta1 `status.phase == Provisioned` or `status.controlPlaneReady`.
//!   v1beta2 is the version Cluster API stores; served as v1beta1 through
//!   its conversion webhook, a Cluster has `controlPlaneReady`, but where
//!   only the CRD is installed (no webhook) the API server keeps no field
//!   that v1beta2 lacks, and a v1beta1 Cluster's readiness comes from its
//!   `phase` alone. [`ClusterApiOptions::readiness`] overrides it. A Cluster that is not
//!   ready yet is engaged when it becomes ready; one already engaged is not
//!   dropped for turning not-ready;
//! - the kubeconfig Secrets are watched too, so a rotated kubeconfig replaces
//!   the cluster at once (Go waits for the next Cluster event); a missing
//!   Secret or key is logged naming it, and the Cluster is engaged as soon as
//!   the Secret appears;
//! - a Cluster deleted or being deleted is removed;
//! - a paused Cluster (annotation `cluster.x-k8s.io/paused`, or
//!   `spec.paused: true`) is left exactly as it is: not engaged, replaced or
//!   removed until it is unpaused (deletion still removes it);
//! - `namespace` limits the watches to one namespace, and `watch_filter` to
//!   Clusters labelled `cluster.x-k8s.io/watch-filter=<value>` (Cluster API's
//!   multi-instance contract), so instances never touch each other's clusters.
//!
//! The kubeconfig Secrets are cluster objects, written by Cluster API's
//! controllers and by whoever else may write Secrets in their namespace, so
//! by default their kubeconfigs may not run a command, name a local file,
//! use an auth provider, skip TLS verification or pick a proxy
//! ([`ClusterApiOptions::kubeconfig_policy`]); one that does is listed with
//! its reason, not engaged. Cluster API writes none of these.
//!
//! Discovery is a controller over the Clusters and their Secrets
//! ([`multicluster_runtime::provider::discovery`]): each Cluster is reconciled on its
//! own, up to [`ClusterApiOptions::max_concurrent_builds`] at once, and one
//! whose credential plugin fails or hangs is retried with backoff while the
//! others go on.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::controller::{Action, Backoff, Controller, Request, Watch};
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::provider::discovery::Discovered;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::Members;
use multicluster_runtime::provider::watch_filter::WatchFilter;
use multicluster_runtime::{
    Cluster, ClusterName, Error, Inventory, InventoryEngaged, ProviderContext, RunnableProvider,
};

/// The label key of the watch-filter convention (`cluster.x-k8s.io/watch-filter`).
pub const WATCH_FILTER_LABEL: &str = WatchFilter::LABEL;
/// The annotation that pauses a Cluster.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// The label Cluster API puts on a cluster's Secrets.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The data key of the kubeconfig Secret.
pub const KUBECONFIG_KEY: &str = "value";

/// The Cluster API version to watch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClusterApiVersion {
    /// `cluster.x-k8s.io/v1beta2` (current).
    #[default]
    V1Beta2,
    /// `cluster.x-k8s.io/v1beta1` (still widely deployed).
    V1Beta1,
}

impl ClusterApiVersion {
    fn resource(self) -> ApiResource {
        let version = match self {
            ClusterApiVersion::V1Beta2 => "v1beta2",
            ClusterApiVersion::V1Beta1 => "v1beta1",
        };
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.x-k8s.io",
            version,
            "Cluster",
        ))
    }

    /// The default readiness of a Cluster of this version.
    pub fn is_ready(self, cluster: &DynamicObject) -> bool {
        let status = &cluster.data["status"];
        match self {
            ClusterApiVersion::V1Beta2 => {
                status["initialization"]["controlPlaneInitialized"] == true
            }
            ClusterApiVersion::V1Beta1 => {
                status["phase"] == "Provisioned" || status["controlPlaneReady"] == true
            }
        }
    }
}

/// Decides whether a Cluster is ready to be engaged.
pub type Readiness = Arc<dyn Fn(&DynamicObject) -> bool + Send + Sync>;

/// Options of the Cluster API provider.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClusterApiOptions {
    /// This instance's name (default `cluster-api`): the label `provider` of
    /// its metrics, and its controller's name with `-provider` appended
    /// (logs and spans carry it). Give instances in one process (two in a
    /// multi provider, say) different names, so their figures stay apart.
    pub name: String,
    /// Watch Clusters and Secrets in this namespace only.
    pub namespace: Option<String>,
    /// Only Clusters labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Which Cluster API version to watch.
    pub version: ClusterApiVersion,
    /// Overrides the version's default readiness.
    pub readiness: Option<Readiness>,
    /// How long to wait before building a failed cluster's client again
    /// (default [`Discovered::DEFAULT_BACKOFF`]: 1 s, doubling up to 5 min).
    pub retry: Backoff,
    /// Where engagement failures and the provider's reconciles (controller
    /// `cluster-api-provider`) are counted. Default: the registry of the
    /// manager that runs the provider.
    pub metrics: Option<Metrics>,
    /// How many Clusters' clients are built at once (default
    /// [`Discovered::DEFAULT_MAX_CONCURRENT_BUILDS`]).
    pub max_concurrent_builds: usize,
    /// How each workload cluster's clients and cache are built: the same
    /// for every member, or adjusted per member from its `Cluster` object
    /// ([`Members::per_member`]). A `ClientOptions`, `CacheOptions` or
    /// `MemberOptions` converts into it.
    pub members: Members<DynamicObject>,
    /// What the kubeconfig Secrets may use beyond a server, inline CA data
    /// and inline credentials (default [`KubeconfigPolicy::untrusted`]).
    pub kubeconfig_policy: KubeconfigPolicy,
}

multicluster_runtime::option_setters!(ClusterApiOptions {
    name: impl Into<String>,
    namespace: impl Into<Option<String>>,
    watch_filter: impl Into<Option<String>>,
    version: ClusterApiVersion,
    retry: Backoff,
    metrics: impl Into<Option<Metrics>>,
    max_concurrent_builds: usize,
    members: impl Into<Members<DynamicObject>>,
    kubeconfig_policy: KubeconfigPolicy,
});

impl ClusterApiOptions {
    /// Sets [`ClusterApiOptions::readiness`]: `ready` decides whether an object's
    /// cluster is engaged, instead of the default rule.
    #[must_use]
    pub fn readiness(
        mut self,
        ready: impl Fn(&DynamicObject) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.readiness = Some(Arc::new(ready));
        self
    }
}

impl Default for ClusterApiOptions {
    fn default() -> Self {
        Self {
            name: "cluster-api".to_string(),
            namespace: None,
            watch_filter: None,
            version: ClusterApiVersion::default(),
            readiness: None,
            retry: Discovered::DEFAULT_BACKOFF,
            metrics: None,
            max_concurrent_builds: Discovered::DEFAULT_MAX_CONCURRENT_BUILDS,
            members: Members::default(),
            kubeconfig_policy: KubeconfigPolicy::untrusted(),
        }
    }
}

impl std::fmt::Debug for ClusterApiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterApiOptions")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("watch_filter", &self.watch_filter)
            .field("version", &self.version)
            .field("custom_readiness", &self.readiness.is_some())
            .field("retry", &self.retry)
            .field("metrics", &self.metrics.is_some())
            .field("max_concurrent_builds", &self.max_concurrent_builds)
            .field("members", &self.members)
            .field("kubeconfig_policy", &self.kubeconfig_policy)
            .finish()
    }
}

/// Cluster API workload clusters.
#[derive(Debug)]
pub struct ClusterApiProvider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: ClusterApiOptions,
    resource: ApiResource,
    /// The management cluster, whose cache holds the Clusters and their
    /// Secrets.
    management: Cluster,
    fleet: Discovered,
}

impl ClusterApiProvider {
    /// Watches Clusters and their kubeconfig Secrets through `management`.
    pub fn new(management: kube::Client, options: ClusterApiOptions) -> Self {
        let resource = options.version.resource();
        let cache = Cache::with_options(
            "cluster-api",
            management.clone(),
            CacheOptions::default()
                .namespace(options.namespace.clone())
                .watcher_for_resource(
                    &resource,
                    WatchFilter::new(options.watch_filter.as_deref()).watcher_config(),
                )
                // Only Secrets that belong to a cluster are cached.
                .watcher_for::<Secret>(watcher::Config::default().labels(CLUSTER_NAME_LABEL)),
        );
        Self {
            shared: Arc::new(Shared {
                resource,
                management: Cluster::with_cache(Discovered::MANAGEMENT, management, cache),
                fleet: Discovered::new(options.name.as_str(), options.metrics.clone()),
                options,
            }),
        }
    }

    /// Ready Clusters that cannot be engaged now, each with the reason
    /// (naming the Secret and key, never quoting it).
    pub fn failures(&self) -> std::collections::BTreeMap<ClusterName, String> {
        self.shared.fleet.failures().current()
    }
}

/// What a Cluster calls for.
enum Wanted {
    /// Gone or being deleted: remove it.
    Gone,
    /// Paused or not ready: leave the fleet as it is.
    Leave(&'static str),
    /// Ready, but its kubeconfig is missing: recorded, waiting for it.
    Missing(String, &'static str),
    /// Ready with a kubeconfig: engage it.
    Engage(Box<KubeconfigCluster>),
}

impl Shared {
    fn ready(&self, cluster: &DynamicObject) -> bool {
        match &self.options.readiness {
            Some(readiness) => readiness(cluster),
            None => self.options.version.is_ready(cluster),
        }
    }

    fn wanted(&self, namespace: &str, name: &str) -> Wanted {
        let cache = self.management.cache();
        let object = cache.dynamic(&self.resource).get(Some(namespace), name);
        let Some(object) = object.filter(|object| object.metadata.deletion_timestamp.is_none())
        else {
            return Wanted::Gone;
        };
        let paused = object
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|annotations| annotations.contains_key(PAUSED_ANNOTATION))
            || object.data["spec"]["paused"] == true;
        if paused {
            return Wanted::Leave("Cluster is paused; leaving it as it is");
        }
        if !self.ready(&object) {
            return Wanted::Leave("Cluster is not ready yet");
        }
        let secret_name = format!("{name}-kubeconfig");
        let source = format!("Secret {namespace}/{secret_name} key {KUBECONFIG_KEY:?}");
        let Some(secret) = cache
            .informer::<Secret>()
            .get(Some(namespace), &secret_name)
        else {
            return Wanted::Missing(
                format!("{source} does not exist (yet); engaging when it appears"),
                "missing-secret",
            );
        };
        let Some(text) = secret
            .data
            .as_ref()
            .and_then(|data| data.get(KUBECONFIG_KEY))
            .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
            .filter(|text| !text.trim().is_empty())
        else {
            return Wanted::Missing(
                format!("{source} is missing, empty or not text"),
                "missing-key",
            );
        };
        Wanted::Engage(Box::new(KubeconfigCluster {
            name: ClusterName::from(format!("{namespace}/{name}")),
            text,
            source,
            policy: self.options.kubeconfig_policy.clone(),
            stable_id: None,
            member: self.options.members.for_member(&object),
            inventory: inventory(&object),
        }))
    }

    /// Brings the fleet in line with the Cluster of `request`.
    async fn reconcile(&self, request: Request) -> Result<Action, Error> {
        let namespace = request.namespace.as_deref().unwrap_or_default();
        let fleet_name = ClusterName::from(format!("{namespace}/{}", request.name));
        match self.wanted(namespace, &request.name) {
            Wanted::Gone => self.fleet.remove(&fleet_name, "its Cluster is deleted"),
            Wanted::Leave(why) => tracing::debug!(cluster = %fleet_name, "{why}"),
            Wanted::Missing(reason, kind) => {
                self.fleet.failures().record(&fleet_name, reason, kind)
            }
            Wanted::Engage(wanted) => {
                let now = || match self.wanted(namespace, &request.name) {
                    Wanted::Engage(now) => Some(*now),
                    _ => None,
                };
                return self.fleet.engage(*wanted, now).await;
            }
        }
        Ok(Action::await_change())
    }
}

/// The property naming a Cluster's topology class, the `ClusterClass` it
/// is built from (`spec.topology.classRef.name` in v1beta2,
/// `spec.topology.class` in v1beta1); absent for Clusters without a
/// managed topology.
pub const TOPOLOGY_CLASS_PROPERTY: &str = "topology.class";

/// A Cluster's labels and annotations, and its topology class as a
/// property.
fn inventory(object: &DynamicObject) -> Inventory {
    let topology = &object.data["spec"]["topology"];
    let class = topology["classRef"]["name"]
        .as_str()
        .or_else(|| topology["class"].as_str());
    Inventory {
        properties: class
            .map(|class| (TOPOLOGY_CLASS_PROPERTY.to_string(), class.to_string()))
            .into_iter()
            .collect(),
        ..Inventory::of_object(&object.metadata)
    }
}

impl ClusterSetProvider for ClusterApiProvider {
    fn cluster_set(&self) -> &Clusters {
        self.shared.fleet.clusters()
    }
}

#[async_trait::async_trait]
impl RunnableProvider for ClusterApiProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        let shared = &self.shared;
        shared.fleet.start(&context)?;
        let shutdown = context.shutdown.clone();
        // Secrets first, so a ready Cluster finds its kubeconfig on the first
        // look instead of being reported without one.
        let secrets = shared.management.cache().informer::<Secret>();
        tokio::select! {
            () = shutdown.cancelled() => return Ok(context.stopped_before_engaged()),
            () = secrets.wait_ready() => {}
        }
        let builder = Controller::builder(format!("{}-provider", shared.options.name))
            .watches_dynamic(shared.resource.clone(), Watch::new(), |context, cluster| {
                vec![context.here(
                    cluster.metadata.namespace.as_deref(),
                    cluster.metadata.name.clone().unwrap_or_default(),
                )]
            })
            .watches(Watch::<Secret>::new(), |context, secret| {
                cluster_of_secret(secret)
                    .map(|(namespace, name)| context.here(namespace.as_deref(), name))
                    .into_iter()
                    .collect()
            })
            .max_concurrent_reconciles(shared.options.max_concurrent_builds)
            .backoff(shared.options.retry);
        let reconciler = shared.clone();
        shared
            .fleet
            .run(
                builder,
                shared.management.clone(),
                &context,
                move |request| {
                    let shared = reconciler.clone();
                    async move { shared.reconcile(request).await }
                },
            )
            .await
    }
}

/// The Cluster a Secret belongs to: its `cluster.x-k8s.io/cluster-name`
/// label, for Secrets named `<cluster>-kubeconfig`.
fn cluster_of_secret(secret: &Secret) -> Option<(Option<String>, String)> {
    let meta = &secret.metadata;
    let cluster = meta.labels.as_ref()?.get(CLUSTER_NAME_LABEL)?;
    if meta.name.as_deref()? != format!("{cluster}-kubeconfig") {
        return None;
    }
    Some((meta.namespace.clone(), cluster.clone()))
}

#[cfg(test)]
mod tests {
    use kube::api::DynamicObject;

    use super::*;

    fn with_status(version: ClusterApiVersion, status: serde_json::Value) -> DynamicObject {
        let mut cluster = DynamicObject::new("c", &version.resource()).within("fleet");
        cluster.data = serde_json::json!({ "status": status });
        cluster
    }

    /// Statuses as Cluster API leaves them: v1beta2 as stored; v1beta1
    /// through its conversion webhook (`controlPlaneReady` may come before
    /// the phase moves on), and without the webhook (only the phase left).
    #[test]
    fn readiness_reads_what_each_version_really_carries() {
        use ClusterApiVersion::{V1Beta1, V1Beta2};
        for (version, status, ready) in [
            (
                V1Beta2,
                serde_json::json!({"initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true}, "phase": "Provisioned"}),
                true,
            ),
            (
                V1Beta2,
                serde_json::json!({"initialization": {"infrastructureProvisioned": true}, "phase": "Provisioning"}),
                false,
            ),
            (
                V1Beta1,
                serde_json::json!({"infrastructureReady": true, "controlPlaneReady": true, "phase": "Provisioning"}),
                true,
            ),
            (
                V1Beta1,
                serde_json::json!({"infrastructureReady": true, "controlPlaneReady": false, "phase": "Provisioning"}),
                false,
            ),
            (V1Beta1, serde_json::json!({"phase": "Provisioned"}), true),
            (V1Beta1, serde_json::json!({"phase": "Provisioning"}), false),
        ] {
            assert_eq!(
                version.is_ready(&with_status(version, status.clone())),
                ready,
                "{version:?} {status}"
            );
        }
    }
}
