//! Clusters from kubeconfig Secrets in a management cluster (Go:
//! `providers/kubeconfig`).
//!
//! Every Secret labelled `sigs.k8s.io/multicluster-runtime-kubeconfig=true`
//! (label configurable) in the watched namespace becomes a cluster built from
//! the kubeconfig in its `kubeconfig` data key (key configurable):
//!
//! - cluster name: the Secret name; when watching every namespace (Go cannot)
//!   `<namespace>/<name>`, so equal names in two namespaces stay distinct;
//! - data changed → the cluster is replaced (credential rotation); labels or
//!   annotations changed → its [`Inventory`] follows in place (client, cache
//!   and engagement kept; kubectl's last-applied annotation, which holds the
//!   data, is left out); other metadata → nothing happens;
//! - Secret deleted or being deleted, or its key emptied → cluster removed;
//! - key missing or empty, kubeconfig unusable → logged (naming the Secret
//!   and key, never quoting the data), counted in
//!   `mcr_cluster_engagement_failures`, listed by
//!   [`KubeconfigProvider::failures`], and skipped; the rest of the fleet is
//!   unaffected. A kubeconfig whose credentials cannot be obtained (a
//!   credential plugin that fails or hangs past
//!   [`ClientOptions::plugin_timeout`](multicluster_runtime::client::ClientOptions::plugin_timeout)) is tried again with backoff. An
//!   unreachable server is the manager's business: reported `unreachable`
//!   and retried, never blocking other clusters.
//!
//! Discovery is a controller over the Secrets
//! ([`multicluster_runtime::provider::discovery`]): each Secret is reconciled on its
//! own, up to [`KubeconfigOptions::max_concurrent_builds`] at once, so a
//! Secret whose plugin hangs holds up only itself.
//!
//! With a watch filter only Secrets also labelled
//! `cluster.x-k8s.io/watch-filter=<value>` count, so several instances can
//! share a namespace.
//!
//! A kubeconfig Secret is written by whoever may write Secrets in the
//! watched namespace, so by default its kubeconfig may not run a command
//! (an exec plugin), name a local file, use an auth provider, skip TLS
//! verification or pick a proxy
//! ([`KubeconfigPolicy::untrusted`](multicluster_runtime::client::KubeconfigPolicy::untrusted)).
//! A Secret that does is not engaged: it is listed with its reason (the
//! Secret, the refused field, the policy field that would allow it) in
//! [`KubeconfigProvider::failures`], on the manager's `/clusters` and in
//! `mcr_cluster_engagement_failures{reason="refused-kubeconfig"}`.
//! [`KubeconfigOptions::kubeconfig_policy`] allows what you trust, for
//! example one credential plugin by path.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
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

/// The default label marking kubeconfig Secrets (value `true`).
pub const DEFAULT_LABEL: &str = "sigs.k8s.io/multicluster-runtime-kubeconfig";
/// The default data key holding the kubeconfig.
pub const DEFAULT_DATA_KEY: &str = "kubeconfig";
/// The label key of the watch-filter convention (`cluster.x-k8s.io/watch-filter`).
pub const WATCH_FILTER_LABEL: &str = WatchFilter::LABEL;

/// Options of the kubeconfig provider.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct KubeconfigOptions {
    /// This instance's name (default `kubeconfig`): the label `provider` of
    /// its metrics, and its controller's name with `-provider` appended
    /// (logs and spans carry it). Give instances in one process (two in a
    /// multi provider, say) different names, so their figures stay apart.
    pub name: String,
    /// The namespace to watch; `None` watches every namespace.
    pub namespace: Option<String>,
    /// The label marking kubeconfig Secrets (its value must be `true`).
    pub label: String,
    /// The data key holding the kubeconfig.
    pub data_key: String,
    /// Only Secrets labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Where to count Secrets that could not be turned into clusters, and
    /// the provider's reconciles (controller `<name>-provider`).
    /// Default: the registry of the manager that runs the provider.
    pub metrics: Option<Metrics>,
    /// How long to wait before building a failed cluster's client again
    /// (default [`Discovered::DEFAULT_BACKOFF`]: 1 s, doubling up to 5 min).
    pub retry: Backoff,
    /// How many Secrets' clients are built at once (default
    /// [`Discovered::DEFAULT_MAX_CONCURRENT_BUILDS`]).
    pub max_concurrent_builds: usize,
    /// How each member's clients and cache are built: the same for every
    /// member, or adjusted per member from its Secret
    /// ([`Members::per_member`]). A `ClientOptions`, `CacheOptions` or
    /// `MemberOptions` converts into it.
    pub members: Members<Secret>,
    /// What the Secrets' kubeconfigs may use beyond a server, inline CA
    /// data and inline credentials (default
    /// [`KubeconfigPolicy::untrusted`]: no exec plugin, local file, auth
    /// provider, skipped TLS verification or proxy URL).
    pub kubeconfig_policy: KubeconfigPolicy,
}

multicluster_runtime::option_setters!(KubeconfigOptions {
    name: impl Into<String>,
    namespace: impl Into<Option<String>>,
    label: impl Into<String>,
    data_key: impl Into<String>,
    watch_filter: impl Into<Option<String>>,
    metrics: impl Into<Option<Metrics>>,
    retry: Backoff,
    max_concurrent_builds: usize,
    members: impl Into<Members<Secret>>,
    kubeconfig_policy: KubeconfigPolicy,
});

impl Default for KubeconfigOptions {
    fn default() -> Self {
        Self {
            name: "kubeconfig".to_string(),
            namespace: None,
            label: DEFAULT_LABEL.to_string(),
            data_key: DEFAULT_DATA_KEY.to_string(),
            watch_filter: None,
            metrics: None,
            retry: Discovered::DEFAULT_BACKOFF,
            max_concurrent_builds: Discovered::DEFAULT_MAX_CONCURRENT_BUILDS,
            members: Members::default(),
            kubeconfig_policy: KubeconfigPolicy::untrusted(),
        }
    }
}

/// Clusters from kubeconfig Secrets.
#[derive(Debug)]
pub struct KubeconfigProvider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: KubeconfigOptions,
    /// The management cluster, whose cache holds the labelled Secrets.
    management: Cluster,
    fleet: Discovered,
}

impl KubeconfigProvider {
    /// Watches Secrets through `management` (a client for the cluster holding
    /// them). Only labelled Secrets are listed and cached, so RBAC to
    /// `list`/`watch` Secrets in the namespace is all it needs.
    pub fn new(management: kube::Client, options: KubeconfigOptions) -> Self {
        let mut selector = format!("{}=true", options.label);
        if let Some(filter) = WatchFilter::new(options.watch_filter.as_deref()).selector() {
            selector.push_str(&format!(",{filter}"));
        }
        let secrets = Cache::with_options(
            "kubeconfig-secrets",
            management.clone(),
            CacheOptions::default()
                .namespace(options.namespace.clone())
                .watcher(watcher::Config::default().labels(&selector)),
        );
        Self {
            shared: Arc::new(Shared {
                fleet: Discovered::new(options.name.as_str(), options.metrics.clone()),
                management: Cluster::with_cache(Discovered::MANAGEMENT, management, secrets),
                options,
            }),
        }
    }

    /// Labelled Secrets that cannot be turned into clusters now, each with
    /// the reason (naming the Secret and key, never quoting it).
    pub fn failures(&self) -> std::collections::BTreeMap<ClusterName, String> {
        self.shared.fleet.failures().current()
    }
}

impl Shared {
    fn cluster_name(&self, namespace: Option<&str>, name: &str) -> ClusterName {
        match (&self.options.namespace, namespace) {
            (None, Some(namespace)) => ClusterName::from(format!("{namespace}/{name}")),
            _ => ClusterName::from(name),
        }
    }

    fn secret(&self, request: &Request) -> Option<Arc<Secret>> {
        self.management
            .cache()
            .informer::<Secret>()
            .get(request.namespace.as_deref(), &request.name)
    }

    /// What the Secret asks for: the cluster to build, or why there is none
    /// (`Ok(None)`: it is gone or being deleted).
    fn wanted(
        &self,
        request: &Request,
    ) -> Result<Option<KubeconfigCluster>, (String, &'static str)> {
        let Some(secret) = self
            .secret(request)
            .filter(|secret| secret.metadata.deletion_timestamp.is_none())
        else {
            return Ok(None);
        };
        let source = format!(
            "Secret {}/{} key {:?}",
            request.namespace.as_deref().unwrap_or_default(),
            request.name,
            self.options.data_key
        );
        let data = secret
            .data
            .as_ref()
            .and_then(|data| data.get(&self.options.data_key))
            .filter(|bytes| !bytes.0.is_empty())
            .ok_or_else(|| (format!("{source} is missing or empty"), "missing-key"))?;
        let text = String::from_utf8(data.0.clone())
            .map_err(|_| (format!("{source} is not UTF-8 text"), "invalid-kubeconfig"))?;
        Ok(Some(KubeconfigCluster {
            name: self.cluster_name(request.namespace.as_deref(), &request.name),
            text,
            source,
            policy: self.options.kubeconfig_policy.clone(),
            stable_id: None,
            member: self.options.members.for_member(&secret),
            inventory: Inventory::of_object(&secret.metadata),
        }))
    }

    /// Brings the fleet in line with one Secret.
    async fn reconcile(&self, request: Request) -> Result<Action, Error> {
        let name = self.cluster_name(request.namespace.as_deref(), &request.name);
        match self.wanted(&request) {
            Ok(Some(wanted)) => {
                let now = || self.wanted(&request).ok().flatten();
                self.fleet.engage(wanted, now).await
            }
            Ok(None) => {
                self.fleet.remove(&name, "its Secret is gone");
                Ok(Action::await_change())
            }
            Err((reason, kind)) => {
                if self.fleet.clusters().remove(&name) {
                    tracing::info!(cluster = %name, "cluster removed: its kubeconfig is gone");
                }
                self.fleet.failures().record(&name, reason, kind);
                Ok(Action::await_change())
            }
        }
    }
}

impl ClusterSetProvider for KubeconfigProvider {
    fn cluster_set(&self) -> &Clusters {
        self.shared.fleet.clusters()
    }
}

#[async_trait::async_trait]
impl RunnableProvider for KubeconfigProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        let shared = &self.shared;
        shared.fleet.start(&context)?;
        let watcher = shared.clone();
        let builder = Controller::builder(format!("{}-provider", self.shared.options.name))
            .for_resource(Watch::<Secret>::new())
            // A Secret gone (or being deleted) while its client is built
            // (a plugin waiting for a login): the build stops now, not when
            // the plugin's deadline comes; the reconcile then removes it.
            .watches(Watch::<Secret>::new(), move |_, secret| {
                let request = Request::new(
                    "",
                    secret.metadata.namespace.as_deref(),
                    secret.metadata.name.as_deref().unwrap_or_default(),
                );
                let gone = watcher
                    .secret(&request)
                    .is_none_or(|secret| secret.metadata.deletion_timestamp.is_some());
                if gone {
                    watcher.fleet.abandon(
                        &watcher.cluster_name(request.namespace.as_deref(), &request.name),
                    );
                }
                Vec::new()
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
