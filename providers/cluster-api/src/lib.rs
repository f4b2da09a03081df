//! Cluster API workload clusters as a fleet (Go: `providers/cluster-api`).
//!
//! The provider watches Cluster API `Cluster` objects in a management
//! cluster. A Cluster that is ready is engaged as `<namespace>/<name>` with
//! the kubeconfig in its `<name>-kubeconfig` Secret (data key `value`):
//!
//! - readiness by default: v1beta2 `status.initialization.controlPlaneInitialized`;
//!   v1beta1 `status.phase == Provisioned` or `status.controlPlaneReady`;
//!   [`ClusterApiOptions::readiness`] overrides it. A Cluster that is not
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

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use multicluster_runtime::cache::{Cache, CacheEvent, CacheOptions};
use multicluster_runtime::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::controller::Backoff;
use multicluster_runtime::failures::Failures;
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::retry::{PROVIDER_BACKOFF, Retries};
use multicluster_runtime::{Aware, ClusterName, Error, RunnableProvider, watch_filter};
use tokio_util::sync::CancellationToken;

/// The label key of the watch-filter convention.
pub use multicluster_runtime::watch_filter::LABEL as WATCH_FILTER_LABEL;
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
pub struct ClusterApiOptions {
    /// Watch Clusters and Secrets in this namespace only.
    pub namespace: Option<String>,
    /// Only Clusters labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Which Cluster API version to watch.
    pub version: ClusterApiVersion,
    /// Overrides the version's default readiness.
    pub readiness: Option<Readiness>,
    /// How long to wait before building a failed cluster's client again
    /// (default [`PROVIDER_BACKOFF`]: 1 s, doubling up to 5 min).
    pub retry: Backoff,
    /// Where engagement failures are counted.
    pub metrics: Option<Metrics>,
}

impl Default for ClusterApiOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            watch_filter: None,
            version: ClusterApiVersion::default(),
            readiness: None,
            retry: PROVIDER_BACKOFF,
            metrics: None,
        }
    }
}

impl std::fmt::Debug for ClusterApiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterApiOptions")
            .field("namespace", &self.namespace)
            .field("watch_filter", &self.watch_filter)
            .field("version", &self.version)
            .field("custom_readiness", &self.readiness.is_some())
            .field("retry", &self.retry)
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

/// Cluster API workload clusters.
#[derive(Debug)]
pub struct ClusterApiProvider {
    options: ClusterApiOptions,
    resource: ApiResource,
    management: Cache,
    secrets: Cache,
    clusters: Clusters,
    failures: Failures,
}

impl ClusterApiProvider {
    /// Watches Clusters and their kubeconfig Secrets through `management`.
    pub fn new(management: kube::Client, options: ClusterApiOptions) -> Self {
        let clusters_watch = watch_filter::watcher_config(options.watch_filter.as_deref());
        let cache = |name: &str, watch: watcher::Config| {
            Cache::with_options(
                name,
                management.clone(),
                CacheOptions {
                    namespace: options.namespace.clone(),
                    watcher: watch,
                    ..CacheOptions::default()
                },
            )
        };
        Self {
            resource: options.version.resource(),
            management: cache("cluster-api-clusters", clusters_watch),
            // Only Secrets that belong to a cluster are cached.
            secrets: cache(
                "cluster-api-secrets",
                watcher::Config::default().labels(CLUSTER_NAME_LABEL),
            ),
            failures: Failures::new("cluster-api", options.metrics.clone()),
            options,
            clusters: Clusters::new(),
        }
    }

    /// Names of the engaged clusters, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.clusters.names()
    }

    /// Ready Clusters that cannot be engaged now, each with the reason
    /// (naming the Secret and key, never quoting it).
    pub fn failures(&self) -> std::collections::BTreeMap<ClusterName, String> {
        self.failures.current()
    }

    fn ready(&self, cluster: &DynamicObject) -> bool {
        match &self.options.readiness {
            Some(readiness) => readiness(cluster),
            None => self.options.version.is_ready(cluster),
        }
    }

    /// Brings the fleet in line with the Cluster `namespace/name`; false
    /// when building its client failed and another attempt should follow.
    async fn reconcile(&self, namespace: &str, name: &str) -> bool {
        let fleet_name = ClusterName::from(format!("{namespace}/{name}"));
        let object = self
            .management
            .dynamic(&self.resource)
            .get(Some(namespace), name);
        let Some(object) = object.filter(|object| object.metadata.deletion_timestamp.is_none())
        else {
            self.failures.clear(&fleet_name);
            if self.clusters.remove(&fleet_name) {
                tracing::info!(cluster = %fleet_name, "Cluster deleted; removed from the fleet");
            }
            return true;
        };
        let paused = object
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|annotations| annotations.contains_key(PAUSED_ANNOTATION))
            || object.data["spec"]["paused"] == true;
        if paused {
            tracing::debug!(cluster = %fleet_name, "Cluster is paused; leaving it as it is");
            return true;
        }
        if !self.ready(&object) {
            tracing::debug!(cluster = %fleet_name, "Cluster is not ready yet");
            return true;
        }
        let secret_name = format!("{name}-kubeconfig");
        let source = format!("Secret {namespace}/{secret_name} key {KUBECONFIG_KEY:?}");
        let Some(secret) = self
            .secrets
            .informer::<Secret>()
            .get(Some(namespace), &secret_name)
        else {
            self.failures.record(
                &fleet_name,
                format!("{source} does not exist (yet); engaging when it appears"),
                "missing-secret",
            );
            return true;
        };
        let Some(text) = secret
            .data
            .as_ref()
            .and_then(|data| data.get(KUBECONFIG_KEY))
            .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
            .filter(|text| !text.trim().is_empty())
        else {
            self.failures.record(
                &fleet_name,
                format!("{source} is missing, empty or not text"),
                "missing-key",
            );
            return true;
        };
        match self
            .clusters
            .add_or_replace_from_kubeconfig(fleet_name.clone(), &text, &source, &Default::default())
            .await
        {
            Ok(changed) => {
                if changed {
                    tracing::info!(cluster = %fleet_name, "workload cluster engaged");
                }
                self.failures.clear(&fleet_name);
                true
            }
            Err(err) => !self.failures.record_build_error(&fleet_name, &err),
        }
    }
}

impl ClusterSetProvider for ClusterApiProvider {
    fn cluster_set(&self) -> &Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for ClusterApiProvider {
    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        self.clusters.start(shutdown.clone(), aware)?;
        let secrets = self.secrets.informer::<Secret>();
        let mut secret_events = secrets.subscribe();
        // Secrets first, so a ready Cluster finds its kubeconfig on the first pass.
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = secrets.wait_ready() => {}
        }
        let mut cluster_events = self.management.dynamic(&self.resource).subscribe();
        let mut retries = Retries::new(self.options.retry);
        loop {
            let key = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                event = cluster_events.next() => match event {
                    Some(event) => key_of_cluster(&event),
                    None => return Err(Error::Other("the Cluster watch stopped".into())),
                },
                event = secret_events.next() => match event {
                    Some(event) => key_of_secret(&event),
                    None => return Err(Error::Other("the kubeconfig Secret watch stopped".into())),
                },
                key = retries.next() => Some(key),
            };
            let Some(key) = key else { continue };
            if self.reconcile(&key.0, &key.1).await {
                retries.forget(&key);
            } else {
                retries.failed(key);
            }
        }
    }
}

fn key_of_cluster(event: &CacheEvent<DynamicObject>) -> Option<(String, String)> {
    let meta = &event.object().metadata;
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

/// The Cluster a Secret belongs to: its `cluster.x-k8s.io/cluster-name`
/// label, for Secrets named `<cluster>-kubeconfig`.
fn key_of_secret(event: &CacheEvent<Secret>) -> Option<(String, String)> {
    let meta = &event.object().metadata;
    let cluster = meta.labels.as_ref()?.get(CLUSTER_NAME_LABEL)?;
    if meta.name.as_deref()? != format!("{cluster}-kubeconfig") {
        return None;
    }
    Some((meta.namespace.clone()?, cluster.clone()))
}
