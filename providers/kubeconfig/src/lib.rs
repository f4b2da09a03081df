//! Clusters from kubeconfig Secrets in a management cluster (Go:
//! `providers/kubeconfig`).
//!
//! Every Secret labelled `sigs.k8s.io/multicluster-runtime-kubeconfig=true`
//! (label configurable) in the watched namespace becomes a cluster built from
//! the kubeconfig in its `kubeconfig` data key (key configurable):
//!
//! - cluster name: the Secret name; when watching every namespace (Go cannot)
//!   `<namespace>/<name>`, so equal names in two namespaces stay distinct;
//! - data changed → the cluster is replaced (credential rotation); changes to
//!   metadata only → nothing happens;
//! - Secret deleted or being deleted, or its key emptied → cluster removed;
//! - key missing or empty, kubeconfig unusable → logged (naming the Secret
//!   and key, never quoting the data), counted in
//!   `mcr_cluster_engagement_failures`, and skipped; the rest of the fleet is
//!   unaffected. A kubeconfig whose credentials cannot be obtained (a
//!   credential plugin that fails) is tried again with backoff. An unreachable server is
//!   the manager's business: reported `unreachable` and retried, never
//!   blocking other clusters.
//!
//! With a watch filter only Secrets also labelled
//! `cluster.x-k8s.io/watch-filter=<value>` count, so several instances can
//! share a namespace.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher;
use multicluster_runtime::cache::{Cache, CacheEvent, CacheOptions};
use multicluster_runtime::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::controller::Backoff;
use multicluster_runtime::failures::Failures;
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::retry::{PROVIDER_BACKOFF, Retries};
use multicluster_runtime::{Aware, ClusterName, Error, RunnableProvider, watch_filter};
use tokio_util::sync::CancellationToken;

/// The default label marking kubeconfig Secrets (value `true`).
pub const DEFAULT_LABEL: &str = "sigs.k8s.io/multicluster-runtime-kubeconfig";
/// The default data key holding the kubeconfig.
pub const DEFAULT_DATA_KEY: &str = "kubeconfig";
/// The label key of the watch-filter convention.
pub use multicluster_runtime::watch_filter::LABEL as WATCH_FILTER_LABEL;

/// Options of the kubeconfig provider.
#[derive(Clone, Debug)]
pub struct KubeconfigOptions {
    /// The namespace to watch; `None` watches every namespace.
    pub namespace: Option<String>,
    /// The label marking kubeconfig Secrets (its value must be `true`).
    pub label: String,
    /// The data key holding the kubeconfig.
    pub data_key: String,
    /// Only Secrets labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Where to count Secrets that could not be turned into clusters (the
    /// manager's registry, typically).
    pub metrics: Option<Metrics>,
    /// How long to wait before building a failed cluster's client again
    /// (default [`PROVIDER_BACKOFF`]: 1 s, doubling up to 5 min).
    pub retry: Backoff,
}

impl Default for KubeconfigOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            label: DEFAULT_LABEL.to_string(),
            data_key: DEFAULT_DATA_KEY.to_string(),
            watch_filter: None,
            metrics: None,
            retry: PROVIDER_BACKOFF,
        }
    }
}

/// Clusters from kubeconfig Secrets.
#[derive(Debug)]
pub struct KubeconfigProvider {
    options: KubeconfigOptions,
    secrets: Cache,
    clusters: Clusters,
    failures: Failures,
}

impl KubeconfigProvider {
    /// Watches Secrets through `management` (a client for the cluster holding
    /// them). Only labelled Secrets are listed and cached, so RBAC to
    /// `list`/`watch` Secrets in the namespace is all it needs.
    pub fn new(management: kube::Client, options: KubeconfigOptions) -> Self {
        let mut selector = format!("{}=true", options.label);
        if let Some(filter) = watch_filter::selector(options.watch_filter.as_deref()) {
            selector.push_str(&format!(",{filter}"));
        }
        let secrets = Cache::with_options(
            "kubeconfig-secrets",
            management,
            CacheOptions {
                namespace: options.namespace.clone(),
                watcher: watcher::Config::default().labels(&selector),
                ..CacheOptions::default()
            },
        );
        Self {
            failures: Failures::new("kubeconfig", options.metrics.clone()),
            options,
            secrets,
            clusters: Clusters::new(),
        }
    }

    /// Names of the engaged clusters, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.clusters.names()
    }

    fn cluster_name(&self, secret: &Secret) -> Option<ClusterName> {
        let name = secret.metadata.name.as_deref()?;
        Some(
            match (
                &self.options.namespace,
                secret.metadata.namespace.as_deref(),
            ) {
                (None, Some(namespace)) => ClusterName::from(format!("{namespace}/{name}")),
                _ => ClusterName::from(name),
            },
        )
    }

    /// Builds the cluster of `secret`; false when building its client failed
    /// and another attempt should follow.
    async fn apply(&self, name: ClusterName, secret: &Secret) -> bool {
        let source = format!(
            "Secret {}/{} key {:?}",
            secret.metadata.namespace.as_deref().unwrap_or_default(),
            secret.metadata.name.as_deref().unwrap_or_default(),
            self.options.data_key
        );
        let data = secret
            .data
            .as_ref()
            .and_then(|data| data.get(&self.options.data_key))
            .map(|bytes| bytes.0.clone())
            .filter(|bytes| !bytes.is_empty());
        let Some(data) = data else {
            if self.clusters.remove(&name) {
                tracing::info!(cluster = %name, "cluster removed: its kubeconfig is gone");
            }
            self.failures.record(
                &name,
                format!("{source} is missing or empty"),
                "missing-key",
            );
            return true;
        };
        let Ok(text) = String::from_utf8(data) else {
            self.failures.record(
                &name,
                format!("{source} is not UTF-8 text"),
                "invalid-kubeconfig",
            );
            return true;
        };
        let existed = self.clusters.get(&name).is_ok();
        match self
            .clusters
            .add_or_replace_from_kubeconfig(name.clone(), &text, &source, &Default::default())
            .await
        {
            Ok(changed) => {
                if changed {
                    tracing::info!(cluster = %name, replaced = existed, "cluster engaged from {source}");
                }
                self.failures.clear(&name);
                true
            }
            Err(err) => !self.failures.record_build_error(&name, &err),
        }
    }

    /// Labelled Secrets that cannot be turned into clusters now, each with
    /// the reason (naming the Secret and key, never quoting it).
    pub fn failures(&self) -> std::collections::BTreeMap<ClusterName, String> {
        self.failures.current()
    }
}

impl ClusterSetProvider for KubeconfigProvider {
    fn cluster_set(&self) -> &Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for KubeconfigProvider {
    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        self.clusters.start(shutdown.clone(), aware)?;
        let informer = self.secrets.informer::<Secret>();
        let mut secrets = informer.subscribe();
        let mut retries: Retries<SecretKey> = Retries::new(self.options.retry);
        loop {
            let secret = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                event = secrets.next() => match event {
                    Some(CacheEvent::Applied { new, .. }) => Some(new),
                    Some(event) => {
                        retries.forget(&key_of(event.object()));
                        let Some(name) = self.cluster_name(event.object()) else { continue };
                        self.failures.clear(&name);
                        if self.clusters.remove(&name) {
                            tracing::info!(cluster = %name, "cluster removed: its Secret is gone");
                        }
                        continue;
                    }
                    None => return Err(Error::Other("the kubeconfig Secret watch stopped".into())),
                },
                // The Secret as it is now; gone means its deletion was handled.
                (namespace, name) = retries.next() => informer.get(namespace.as_deref(), &name),
            };
            let Some(secret) = secret else { continue };
            let Some(name) = self.cluster_name(&secret) else {
                continue;
            };
            let key = key_of(&secret);
            if secret.metadata.deletion_timestamp.is_some() {
                retries.forget(&key);
                self.failures.clear(&name);
                if self.clusters.remove(&name) {
                    tracing::info!(cluster = %name, "cluster removed: its Secret is being deleted");
                }
            } else if self.apply(name, &secret).await {
                retries.forget(&key);
            } else {
                retries.failed(key);
            }
        }
    }
}

/// A Secret's namespace and name.
type SecretKey = (Option<String>, String);

fn key_of(secret: &Secret) -> SecretKey {
    (
        secret.metadata.namespace.clone(),
        secret.metadata.name.clone().unwrap_or_default(),
    )
}
