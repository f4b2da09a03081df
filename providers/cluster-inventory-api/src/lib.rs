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
//!   cluster's stable ID ([`multicluster_runtime::Cluster::stable_id`]).
//!
//! Labels and properties: each cluster's [`multicluster_runtime::Cluster::inventory`]
//! has its profile's labels (with [`CLUSTER_MANAGER_LABEL`] from the spec
//! when missing) and `status.properties`. [`placement`] reads
//! PlacementDecisions, to act on the clusters a scheduler chose.
//!
//! The access-provider strategy (KEP-5339) reads the consumer's
//! [`access::ProviderFile`] and runs an exec credential plugin per profile;
//! see [`access`].
//!
//! Discovery is a controller over the profiles (and their Secrets)
//! ([`multicluster_runtime::provider::discovery`]): each profile is reconciled on its
//! own, up to [`ClusterProfileOptions::max_concurrent_builds`] at once, so a
//! slow or hung plugin holds up only its own profile.
//!
//! A profile that cannot be engaged is logged, counted in
//! `mcr_cluster_engagement_failures{provider="cluster-inventory-api"}` and
//! listed by [`ClusterProfileProvider::failures`]; the rest of the fleet goes
//! on. When its credentials cannot be obtained (a credential plugin that
//! fails) it is retried with exponential backoff; other problems wait for the
//! profile or its Secret to change.

pub mod access;
mod options;
pub mod placement;
mod secrets;

pub use options::{ClusterProfileOptions, Credentials, Readiness, control_plane_healthy};

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::client::{ExecPolicy, KubeconfigPolicy};
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::provider::discovery::{self, Fleet, MANAGEMENT};
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::watch_filter;
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, Inventory, RunnableProvider};
use tokio_util::sync::CancellationToken;

/// The label naming the consumer a credentials Secret is for.
pub const CONSUMER_LABEL: &str = "x-k8s.io/cluster-inventory-consumer";
/// The label naming the ClusterProfile a credentials Secret is for.
pub const PROFILE_LABEL: &str = "x-k8s.io/cluster-profile";
/// The data key of a credentials Secret.
pub const SECRET_KEY: &str = "Config";
/// The property carrying the cluster's stable ID (KEP-2149).
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";

/// The label naming a profile's cluster manager (`LabelClusterManagerKey`
/// upstream). Cluster managers are asked to set it; where one did not, the
/// cluster's labels ([`multicluster_runtime::Cluster::inventory`]) carry
/// it from `spec.clusterManager.name`, so sources can select by it.
pub const CLUSTER_MANAGER_LABEL: &str = "x-k8s.io/cluster-manager";
/// The label key of the watch-filter convention.
pub use multicluster_runtime::provider::watch_filter::LABEL as WATCH_FILTER_LABEL;

/// ClusterProfiles as clusters.
#[derive(Debug)]
pub struct ClusterProfileProvider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: ClusterProfileOptions,
    resource: ApiResource,
    /// The hub, whose cache holds the profiles (and, for the Secret
    /// strategy, this consumer's credentials Secrets).
    hub: Cluster,
    /// The consumer's provider file, for the access-provider strategy.
    providers: Option<access::ProviderFile>,
    fleet: Fleet,
}

/// What a look at a profile calls for.
enum Wanted {
    /// Gone or being deleted: remove it.
    Gone,
    /// Not ready: leave the fleet as it is.
    NotReady,
    /// Ready, but without usable credentials: recorded, waiting for a change.
    NoCredentials(String),
    /// Ready with credentials: engage it.
    Engage(Box<KubeconfigCluster>),
}

impl ClusterProfileProvider {
    /// Watches profiles (and, for the Secret strategy, credential Secrets)
    /// through `hub`, the cluster holding the inventory.
    pub fn new(hub: kube::Client, options: ClusterProfileOptions) -> Self {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "multicluster.x-k8s.io",
            "v1alpha1",
            "ClusterProfile",
        ));
        let mut cache_options = CacheOptions::default()
            .namespace(options.namespace.clone())
            .watcher_for_resource(
                &resource,
                watch_filter::watcher_config(options.watch_filter.as_deref()),
            );
        let providers = match &options.credentials {
            Credentials::Secret { consumer } => {
                cache_options = cache_options.watcher_for::<Secret>(
                    watcher::Config::default().labels(&format!("{CONSUMER_LABEL}={consumer}")),
                );
                None
            }
            Credentials::AccessProviders(providers) => Some(providers.clone()),
        };
        let cache = Cache::with_options("cluster-profiles", hub.clone(), cache_options);
        Self {
            shared: Arc::new(Shared {
                resource,
                hub: Cluster::with_cache(MANAGEMENT, hub, cache),
                providers,
                fleet: Fleet::new(options.name.as_str(), options.metrics.clone()),
                options,
            }),
        }
    }

    /// Profiles that are ready but could not be engaged with their current
    /// settings, each with the reason; an entry goes once the profile is
    /// engaged or gone.
    pub fn failures(&self) -> BTreeMap<ClusterName, String> {
        self.shared.fleet.failures().current()
    }
}

impl Shared {
    fn ready(&self, profile: &DynamicObject) -> bool {
        match &self.options.readiness {
            Some(readiness) => readiness(profile),
            None => control_plane_healthy(profile),
        }
    }

    /// The kubeconfig text for a profile, a description of where it came
    /// from (for errors), and what it may use.
    fn credentials(
        &self,
        profile: &DynamicObject,
    ) -> Result<(String, String, KubeconfigPolicy), String> {
        let namespace = profile.metadata.namespace.as_deref().unwrap_or_default();
        let name = profile.metadata.name.as_deref().unwrap_or_default();
        let policy = self.options.kubeconfig_policy.clone();
        let Some(providers) = &self.providers else {
            let (text, source) = secrets::credentials(self.hub.cache(), namespace, name)?;
            return Ok((text, source, policy));
        };
        let access = providers
            .access_for(profile)
            .map_err(|err| err.to_string())?;
        let source = format!(
            "ClusterProfile {namespace}/{name} access provider {:?}{}",
            access.provider,
            if access.deprecated_field {
                " (listed only in the deprecated status.credentialProviders)"
            } else {
                ""
            }
        );
        // The plugin is the provider file's: the operator's own.
        Ok((access.text(), source, policy.exec(ExecPolicy::AllowAll)))
    }

    fn wanted(&self, namespace: &str, name: &str) -> Wanted {
        let profile = self
            .hub
            .cache()
            .dynamic(&self.resource)
            .get(Some(namespace), name);
        let Some(profile) = profile.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
            return Wanted::Gone;
        };
        if !self.ready(&profile) {
            return Wanted::NotReady;
        }
        match self.credentials(&profile) {
            Ok((text, source, policy)) => Wanted::Engage(Box::new(KubeconfigCluster {
                name: ClusterName::from(format!("{namespace}/{name}")),
                text,
                source,
                policy,
                stable_id: stable_id(&profile),
                member: self.options.members.for_member(&profile),
                inventory: inventory(&profile),
            })),
            Err(reason) => Wanted::NoCredentials(reason),
        }
    }

    /// Brings the fleet in line with the profile of `request`.
    async fn reconcile(&self, request: Request) -> Result<Action, Error> {
        let namespace = request.namespace.as_deref().unwrap_or_default();
        let fleet_name = ClusterName::from(format!("{namespace}/{}", request.name));
        match self.wanted(namespace, &request.name) {
            Wanted::Gone => self
                .fleet
                .remove(&fleet_name, "its ClusterProfile is deleted"),
            Wanted::NotReady if self.fleet.clusters().get(&fleet_name).is_ok() => {
                tracing::warn!(cluster = %fleet_name, "ClusterProfile is not ready; keeping the engaged cluster");
            }
            Wanted::NotReady => {
                tracing::debug!(cluster = %fleet_name, "ClusterProfile is not ready yet");
            }
            Wanted::NoCredentials(reason) => {
                self.fleet
                    .failures()
                    .record(&fleet_name, reason, "no-credentials");
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

/// The value of the `cluster.clusterset.k8s.io` property, if any.
fn stable_id(profile: &DynamicObject) -> Option<String> {
    profile.data["status"]["properties"]
        .as_array()?
        .iter()
        .find(|property| property["name"] == CLUSTER_ID_PROPERTY)
        .and_then(|property| property["value"].as_str())
        .map(str::to_string)
}

/// A profile's labels, with [`CLUSTER_MANAGER_LABEL`] taken from
/// `spec.clusterManager.name` when the cluster manager did not set it, and
/// its `status.properties` as properties.
fn inventory(profile: &DynamicObject) -> Inventory {
    let mut labels = profile.metadata.labels.clone().unwrap_or_default();
    if let Some(manager) = profile.data["spec"]["clusterManager"]["name"].as_str() {
        labels
            .entry(CLUSTER_MANAGER_LABEL.to_string())
            .or_insert_with(|| manager.to_string());
    }
    let properties = profile.data["status"]["properties"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|property| {
            Some((
                property["name"].as_str()?.to_string(),
                property["value"].as_str()?.to_string(),
            ))
        })
        .collect();
    Inventory { labels, properties }
}

impl ClusterSetProvider for ClusterProfileProvider {
    fn cluster_set(&self) -> &Clusters {
        self.shared.fleet.clusters()
    }
}

#[async_trait::async_trait]
impl RunnableProvider for ClusterProfileProvider {
    fn use_metrics(&self, metrics: &multicluster_runtime::metrics::Metrics) {
        self.shared.fleet.use_metrics(metrics);
    }

    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        let shared = &self.shared;
        shared.fleet.start(&shutdown, aware)?;
        let mut builder = Controller::builder(format!("{}-provider", shared.options.name))
            .watches_dynamic(shared.resource.clone(), Watch::new(), |context, profile| {
                vec![context.here(
                    profile.metadata.namespace.as_deref(),
                    profile.metadata.name.clone().unwrap_or_default(),
                )]
            })
            .max_concurrent_reconciles(shared.options.max_concurrent_builds)
            .backoff(shared.options.retry);
        if shared.providers.is_none() {
            // Profiles are only looked at once the Secrets they may need are
            // listed, so a Secret that exists is never reported missing.
            let secrets = shared.hub.cache().informer::<Secret>();
            tracing::debug!("waiting for the credentials Secrets to be listed");
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = secrets.wait_ready() => {}
            }
            builder = builder.watches(Watch::<Secret>::new(), |context, secret| {
                secrets::profile_of(secret)
                    .map(|(namespace, name)| context.here(namespace.as_deref(), name))
                    .into_iter()
                    .collect()
            });
        }
        let reconciler = shared.clone();
        discovery::run(
            builder,
            shared.fleet.metrics(),
            shared.hub.clone(),
            shutdown,
            move |request| {
                let shared = reconciler.clone();
                async move { shared.reconcile(request).await }
            },
        )
        .await
    }
}
