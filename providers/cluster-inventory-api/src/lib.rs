//! ClusterProfiles of the Cluster Inventory API (KEP-4322) as a fleet (Go:
//! `providers/cluster-inventory-api`).
//!
//! The provider watches `ClusterProfile` objects
//! (`multicluster.x-k8s.io/v1alpha1`). A profile that is ready — by default
//! its `ControlPlaneHealthy` condition is `True`, overridable — is engaged as
//! `<namespace>/<name>`:
//!
//! - credentials come from the configured [`Credentials`] strategy. The
//!   Secret strategy reads the one Secret in the profile's namespace labelled
//!   `x-k8s.io/cluster-inventory-consumer=<consumer>` and
//!   `x-k8s.io/cluster-profile=<profile>`, data key `Config`; none or several
//!   is a clear error for that profile only. Those Secrets are watched, so
//!   rotation applies at once;
//! - unchanged credentials never re-engage a cluster (Go re-engages on every
//!   reconcile with access providers);
//! - a profile that turns not-ready stays engaged (and is logged); one
//!   deleted or being deleted is removed;
//! - the `cluster.clusterset.k8s.io` property, when present, becomes the
//!   cluster's stable ID ([`Cluster::stable_id`]).
//!
//! Access providers with exec credential plugins (KEP-5339) are the next
//! strategy to come; see the README.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use multicluster_runtime::cache::{Cache, CacheEvent, CacheOptions, FieldIndex};
use multicluster_runtime::clusters::Clusters;
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, Provider, RunnableProvider};
use tokio_util::sync::CancellationToken;

/// The label naming the consumer a credentials Secret is for.
pub const CONSUMER_LABEL: &str = "x-k8s.io/cluster-inventory-consumer";
/// The label naming the ClusterProfile a credentials Secret is for.
pub const PROFILE_LABEL: &str = "x-k8s.io/cluster-profile";
/// The data key of a credentials Secret.
pub const SECRET_KEY: &str = "Config";
/// The property carrying the cluster's stable ID (KEP-2149).
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";
/// The label key of the watch-filter convention.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// How the provider gets credentials for a profile.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Credentials {
    /// A Secret per profile for the consumer `consumer`.
    Secret {
        /// This consumer's name (value of `x-k8s.io/cluster-inventory-consumer`).
        consumer: String,
    },
}

/// Decides whether a profile is ready to be engaged.
pub type Readiness = Arc<dyn Fn(&DynamicObject) -> bool + Send + Sync>;

/// Options of the ClusterProfile provider.
#[derive(Clone)]
pub struct ClusterProfileOptions {
    /// Where credentials come from.
    pub credentials: Credentials,
    /// Watch profiles (and Secrets) in this namespace only.
    pub namespace: Option<String>,
    /// Only profiles labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Overrides the default readiness (`ControlPlaneHealthy` is `True`).
    pub readiness: Option<Readiness>,
}

impl ClusterProfileOptions {
    /// Options for the Secret strategy with everything else at defaults.
    pub fn with_secrets(consumer: impl Into<String>) -> Self {
        Self {
            credentials: Credentials::Secret {
                consumer: consumer.into(),
            },
            namespace: None,
            watch_filter: None,
            readiness: None,
        }
    }
}

impl std::fmt::Debug for ClusterProfileOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterProfileOptions")
            .field("credentials", &self.credentials)
            .field("namespace", &self.namespace)
            .field("watch_filter", &self.watch_filter)
            .field("custom_readiness", &self.readiness.is_some())
            .finish()
    }
}

/// The default readiness: condition `ControlPlaneHealthy` is `True`.
pub fn control_plane_healthy(profile: &DynamicObject) -> bool {
    profile.data["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "ControlPlaneHealthy" && c["status"] == "True")
        })
}

/// ClusterProfiles as clusters.
#[derive(Debug)]
pub struct ClusterProfileProvider {
    options: ClusterProfileOptions,
    resource: ApiResource,
    profiles: Cache,
    secrets: Cache,
    clusters: Clusters,
}

impl ClusterProfileProvider {
    /// Watches profiles and credential Secrets through `hub` (the cluster
    /// holding the inventory).
    pub fn new(hub: kube::Client, options: ClusterProfileOptions) -> Self {
        let cache = |name: &str, watch: watcher::Config| {
            Cache::with_options(
                name,
                hub.clone(),
                CacheOptions {
                    namespace: options.namespace.clone(),
                    watcher: watch,
                    ..CacheOptions::default()
                },
            )
        };
        let profiles_watch = match &options.watch_filter {
            Some(value) => {
                watcher::Config::default().labels(&format!("{WATCH_FILTER_LABEL}={value}"))
            }
            None => watcher::Config::default(),
        };
        let Credentials::Secret { consumer } = &options.credentials;
        let secrets_watch =
            watcher::Config::default().labels(&format!("{CONSUMER_LABEL}={consumer}"));
        Self {
            resource: ApiResource::from_gvk(&GroupVersionKind::gvk(
                "multicluster.x-k8s.io",
                "v1alpha1",
                "ClusterProfile",
            )),
            profiles: cache("cluster-profiles", profiles_watch),
            secrets: cache("cluster-profile-secrets", secrets_watch),
            options,
            clusters: Clusters::new(),
        }
    }

    /// Names of the engaged clusters, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.clusters.names()
    }

    fn ready(&self, profile: &DynamicObject) -> bool {
        match &self.options.readiness {
            Some(readiness) => readiness(profile),
            None => control_plane_healthy(profile),
        }
    }

    /// The kubeconfig text for a profile from its credentials Secret.
    fn secret_credentials(
        &self,
        namespace: &str,
        profile: &str,
    ) -> Result<(String, String), String> {
        let matching: Vec<_> = self
            .secrets
            .informer::<Secret>()
            .list(Some(namespace))
            .into_iter()
            .filter(|secret| {
                secret
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(PROFILE_LABEL))
                    .map(String::as_str)
                    == Some(profile)
            })
            .collect();
        let secret = match matching.as_slice() {
            [one] => one,
            [] => {
                return Err(format!(
                    "no Secret in {namespace} labelled {PROFILE_LABEL}={profile} for this consumer"
                ));
            }
            several => {
                let names: Vec<_> = several
                    .iter()
                    .filter_map(|s| s.metadata.name.clone())
                    .collect();
                return Err(format!(
                    "several Secrets in {namespace} labelled {PROFILE_LABEL}={profile} for this consumer: {}",
                    names.join(", ")
                ));
            }
        };
        let source = format!(
            "Secret {namespace}/{} key {SECRET_KEY:?}",
            secret.metadata.name.as_deref().unwrap_or_default()
        );
        let text = secret
            .data
            .as_ref()
            .and_then(|data| data.get(SECRET_KEY))
            .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
            .filter(|text| !text.trim().is_empty())
            .ok_or_else(|| format!("{source} is missing, empty or not text"))?;
        Ok((text, source))
    }

    async fn reconcile(&self, namespace: &str, name: &str) {
        let fleet_name = ClusterName::from(format!("{namespace}/{name}"));
        let profile = self
            .profiles
            .dynamic(&self.resource)
            .get(Some(namespace), name);
        let Some(profile) = profile.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
            if self.clusters.remove(&fleet_name) {
                tracing::info!(cluster = %fleet_name, "ClusterProfile deleted; removed from the fleet");
            }
            return;
        };
        if !self.ready(&profile) {
            if self.clusters.get(&fleet_name).is_ok() {
                tracing::warn!(cluster = %fleet_name, "ClusterProfile is not ready; keeping the engaged cluster");
            } else {
                tracing::debug!(cluster = %fleet_name, "ClusterProfile is not ready yet");
            }
            return;
        }
        let (text, source) = match self.secret_credentials(namespace, name) {
            Ok(found) => found,
            Err(reason) => {
                tracing::warn!(cluster = %fleet_name, %reason, "no credentials for the ClusterProfile");
                return;
            }
        };
        let stable_id = stable_id(&profile);
        match self
            .clusters
            .add_or_replace_from_kubeconfig_with_id(
                fleet_name.clone(),
                &text,
                &source,
                stable_id.as_deref(),
            )
            .await
        {
            Ok(true) => tracing::info!(cluster = %fleet_name, "ClusterProfile engaged"),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(cluster = %fleet_name, error = %err, "skipping the ClusterProfile")
            }
        }
    }
}

/// The value of the `cluster.clusterset.k8s.io` property, if any.
fn stable_id(profile: &DynamicObject) -> Option<String> {
    profile.data["status"]["properties"]
        .as_array()?
        .iter()
        .find(|property| property["name"] == CLUSTER_ID_PROPERTY)
        .and_then(|property| property["value"].as_str())
        .map(str::to_string)
}

#[async_trait::async_trait]
impl Provider for ClusterProfileProvider {
    async fn get(&self, name: &ClusterName) -> Result<Cluster, Error> {
        self.clusters.get(name)
    }

    async fn index_field(&self, index: FieldIndex) -> Result<(), Error> {
        self.clusters.index_field(index);
        Ok(())
    }
}

#[async_trait::async_trait]
impl RunnableProvider for ClusterProfileProvider {
    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        self.clusters.start(shutdown.clone(), aware)?;
        let secrets = self.secrets.informer::<Secret>();
        let mut secret_events = secrets.subscribe();
        tracing::debug!("waiting for the credentials Secrets to be listed");
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = secrets.wait_ready() => {}
        }
        tracing::debug!("credentials Secrets listed; watching ClusterProfiles");
        let mut profile_events = self.profiles.dynamic(&self.resource).subscribe();
        loop {
            let key = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                event = profile_events.next() => match event {
                    Some(event) => {
                        let meta = &event.object().metadata;
                        meta.namespace.clone().zip(meta.name.clone())
                    }
                    None => return Err(Error::Other("the ClusterProfile watch stopped".into())),
                },
                event = secret_events.next() => match event {
                    Some(event) => profile_of_secret(&event),
                    None => return Err(Error::Other("the credentials Secret watch stopped".into())),
                },
            };
            if let Some((namespace, name)) = key {
                self.reconcile(&namespace, &name).await;
            }
        }
    }
}

fn profile_of_secret(event: &CacheEvent<Secret>) -> Option<(String, String)> {
    let meta = &event.object().metadata;
    let profile = meta.labels.as_ref()?.get(PROFILE_LABEL)?;
    Some((meta.namespace.clone()?, profile.clone()))
}
