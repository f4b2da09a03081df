//! ClusterProfiles of the Cluster Inventory API (KEP-4322) as a fleet (Go:
//! `providers/cluster-inventory-api`).
//!
//! The provider watches `ClusterProfile` objects through
//! `multicluster.x-k8s.io/v1alpha2` where the hub serves it, `v1alpha1`
//! otherwise, decided when it starts ([`version`]). A profile that is
//! ready — by default its `ControlPlaneHealthy` condition is `True`,
//! overridable — is engaged as `<namespace>/<name>`, or as its inventory
//! member id when it carries [`INVENTORY_MEMBER_ID_LABEL`] (profiles with
//! one id engage one cluster; see the crate README):
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
mod inventory_member;
mod options;
pub mod placement;
mod secrets;
mod steering;
pub mod version;

pub use options::{ClusterProfileOptions, Credentials, Readiness, control_plane_healthy};
pub use version::ApiVersion;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher;
use multicluster_runtime::cache::{Cache, CacheOptions, FieldIndex, Informer};
use multicluster_runtime::client::{ExecPolicy, KubeconfigPolicy};
use multicluster_runtime::controller::{Action, Controller, MapContext, Request, Watch};
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::provider::discovery::Discovered;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::watch_filter::WatchFilter;
use multicluster_runtime::{
    Cluster, ClusterName, Error, Inventory, InventoryEngaged, ProviderContext, RunnableProvider,
};

/// The label naming the consumer a credentials Secret is for.
pub const CONSUMER_LABEL: &str = "x-k8s.io/cluster-inventory-consumer";
/// The label naming the ClusterProfile a credentials Secret is for.
pub const PROFILE_LABEL: &str = "x-k8s.io/cluster-profile";
/// The data key of a credentials Secret (KEP-4322).
pub const SECRET_KEY: &str = "Config";
/// The data key read when a credentials Secret has no [`SECRET_KEY`]: the
/// one upstream's implementation of the Secret strategy writes
/// (cluster-inventory-api pull request #18).
pub const SECRET_KEY_LOWER_CASE: &str = "config";
/// The property carrying the cluster's stable ID (KEP-2149).
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";

/// The label naming a profile's cluster manager (`LabelClusterManagerKey`
/// upstream). Cluster managers are asked to set it; where one did not, the
/// cluster's labels ([`multicluster_runtime::Cluster::inventory`]) carry
/// it from `spec.clusterManager.name`, so sources can select by it.
pub const CLUSTER_MANAGER_LABEL: &str = "x-k8s.io/cluster-manager";
/// The label correlating ClusterProfiles that describe one member cluster
/// (`LabelInventoryMemberIDKey` upstream, KEP-4322): profiles carrying the
/// same non-empty value are engaged as one cluster named by that value.
pub const INVENTORY_MEMBER_ID_LABEL: &str = "multicluster.x-k8s.io/inventory-member-id";
/// The label key of the watch-filter convention (`cluster.x-k8s.io/watch-filter`).
pub const WATCH_FILTER_LABEL: &str = WatchFilter::LABEL;

/// The kind the provider reads.
const KIND: &str = "ClusterProfile";
/// Its plural, as discovery lists it.
const PLURAL: &str = "clusterprofiles";

/// ClusterProfiles as clusters.
#[derive(Debug)]
pub struct ClusterProfileProvider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: ClusterProfileOptions,
    /// The version read: decided by discovery when the provider starts.
    version: OnceLock<ApiVersion>,
    /// The hub, whose cache holds the profiles (and, for the Secret
    /// strategy, this consumer's credentials Secrets).
    hub: Cluster,
    /// The consumer's provider file, for the access-provider strategy.
    providers: Option<access::ProviderFile>,
    fleet: Discovered,
    /// The inventory member id each profile carried when last seen, so
    /// that the member a profile leaves is looked at again.
    member_ids: Mutex<HashMap<(String, String), String>>,
    /// Engaged clusters kept while their profile is not ready, so that
    /// this is told once, not on every status update of the profile.
    kept_unready: Mutex<std::collections::HashSet<ClusterName>>,
    /// Which server each plugin input was engaged with (see `steering`).
    steering: steering::Steering,
}

/// What a look at a profile calls for.
enum Wanted {
    /// Gone or being deleted: remove it.
    Gone,
    /// Not ready: leave the fleet as it is.
    NotReady,
    /// Ready, but without usable credentials: recorded, waiting for a
    /// change; `kind` is the reason's metrics label.
    NoCredentials { reason: String, kind: &'static str },
    /// Ready with credentials: engage it; once engaged, `steered` is
    /// what it handed an access provider's plugin, told to `steering`.
    Engage {
        wanted: Box<KubeconfigCluster>,
        steered: Steered,
    },
}

/// The metrics label of a profile whose credentials cannot be had.
const NO_CREDENTIALS: &str = "no-credentials";
/// The metrics label of a profile refused by a policy (the provider file's
/// or the kubeconfig policy).
const REFUSED: &str = "refused-kubeconfig";

/// Locks `mutex`, whatever a panicking holder left in it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What [`Shared::credentials`] finds for a profile: the kubeconfig text,
/// where it came from, its policy, and what it hands a plugin.
type ProfileCredentials = (String, String, KubeconfigPolicy, Steered);

/// What a profile hands an access provider's plugin (`input`, if
/// anything) and the server it names, as `steering` records them once the
/// profile is engaged; `None` for the Secret strategy.
type Steered = Option<(Option<String>, String)>;

impl ClusterProfileProvider {
    /// Watches profiles (and, for the Secret strategy, credential Secrets)
    /// through `hub`, the cluster holding the inventory. Which version of
    /// the API is read is decided when the provider starts
    /// ([`version`]).
    pub fn new(hub: kube::Client, options: ClusterProfileOptions) -> Self {
        let mut cache_options = CacheOptions::default().namespace(options.namespace.clone());
        for version in [ApiVersion::V1Alpha1, ApiVersion::V1Alpha2] {
            cache_options = cache_options.watcher_for_resource(
                &version.resource(KIND),
                WatchFilter::new(options.watch_filter.as_deref()).watcher_config(),
            );
        }
        let providers = match &options.credentials {
            Credentials::Secret { consumer } => {
                cache_options = cache_options.watcher_for::<Secret>(
                    watcher::Config::default().labels(&format!("{CONSUMER_LABEL}={consumer}")),
                );
                None
            }
            Credentials::AccessProviders(providers) => {
                providers.warn_about_profile_input();
                Some(providers.clone())
            }
        };
        let cache = Cache::with_options("cluster-profiles", hub.clone(), cache_options);
        for version in [ApiVersion::V1Alpha1, ApiVersion::V1Alpha2] {
            cache.index_field(&FieldIndex::dynamic(
                &version.resource(KIND),
                inventory_member::INDEX,
                |profile| {
                    inventory_member::id(profile)
                        .map(str::to_string)
                        .into_iter()
                        .collect()
                },
            ));
            // Every profile's plugin input, looked at or not, so that
            // the oldest claims an input after a restart too.
            if let Some(providers) = providers.clone() {
                cache.index_field(&FieldIndex::dynamic(
                    &version.resource(KIND),
                    steering::INDEX,
                    move |profile| plugin_input(&providers, profile).into_iter().collect(),
                ));
            }
        }
        Self {
            shared: Arc::new(Shared {
                version: OnceLock::new(),
                hub: Cluster::with_cache(Discovered::MANAGEMENT, hub, cache),
                providers,
                fleet: Discovered::new(options.name.as_str(), options.metrics.clone()),
                member_ids: Mutex::default(),
                kept_unready: Mutex::default(),
                steering: steering::Steering::default(),
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

    /// Profiles not engaged because another profile with their inventory
    /// member id is (`<namespace>/<name>` → the member's cluster name).
    pub fn duplicates(&self) -> BTreeMap<ClusterName, ClusterName> {
        self.shared.fleet.failures().duplicates()
    }

    /// The version of the API the provider reads, once it has started.
    pub fn api_version(&self) -> Option<ApiVersion> {
        self.shared.version.get().copied()
    }
}

impl Shared {
    fn resource(&self) -> ApiResource {
        self.version
            .get()
            .copied()
            .unwrap_or(ApiVersion::V1Alpha1)
            .resource(KIND)
    }

    fn profiles(&self) -> Arc<Informer<DynamicObject>> {
        self.hub.cache().dynamic(&self.resource())
    }

    fn ready(&self, profile: &DynamicObject) -> bool {
        match &self.options.readiness {
            Some(readiness) => readiness(profile),
            None => control_plane_healthy(profile),
        }
    }

    /// The kubeconfig text for a profile, a description of where it came
    /// from (for errors), what it may use, and what it hands a plugin; or
    /// why not, with the reason's metrics label.
    fn credentials(
        &self,
        profile: &DynamicObject,
    ) -> Result<ProfileCredentials, (String, &'static str)> {
        let namespace = profile.metadata.namespace.as_deref().unwrap_or_default();
        let name = profile.metadata.name.as_deref().unwrap_or_default();
        let policy = self.options.kubeconfig_policy.clone();
        let Some(providers) = &self.providers else {
            let (text, source) = secrets::credentials(self.hub.cache(), namespace, name)
                .map_err(|reason| (reason, NO_CREDENTIALS))?;
            return Ok((text, source, policy, None));
        };
        let key = format!("{namespace}/{name}");
        let access = providers.access_for(profile).map_err(|err| {
            let kind = match err {
                access::AccessError::Refused { .. } => REFUSED,
                _ => NO_CREDENTIALS,
            };
            (err.to_string(), kind)
        })?;
        if let Some(input) = &access.input {
            let claim = steering::Claim {
                profile: key.clone(),
                server: access.server().to_string(),
                created: profile.metadata.creation_timestamp.clone(),
            };
            self.steering
                .check(input, &claim, &self.claims(providers, input, &key))
                .map_err(|reason| (format!("ClusterProfile {key}: {reason}"), REFUSED))?;
        }
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
        let steered = Some((access.input.clone(), access.server().to_string()));
        Ok((
            access.text(),
            source,
            policy.exec(ExecPolicy::AllowAll),
            steered,
        ))
    }

    /// The live profiles other than `key` handing the plugin `input`.
    fn claims(
        &self,
        providers: &access::ProviderFile,
        input: &str,
        key: &str,
    ) -> Vec<steering::Claim> {
        self.profiles()
            .by_index(steering::INDEX, input, None)
            .into_iter()
            .filter(|other| other.metadata.deletion_timestamp.is_none())
            .filter_map(|other| {
                let profile = profile_key(&other);
                let access = providers.access_for(&other).ok()?;
                (profile != key && access.input.as_deref() == Some(input)).then(|| {
                    steering::Claim {
                        profile,
                        server: access.server().to_string(),
                        created: other.metadata.creation_timestamp.clone(),
                    }
                })
            })
            .collect()
    }

    /// What `profile` calls for, engaged as `cluster`.
    fn wanted(&self, profile: Option<&DynamicObject>, cluster: &ClusterName) -> Wanted {
        let Some(profile) = profile.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
            return Wanted::Gone;
        };
        if !self.ready(profile) {
            return Wanted::NotReady;
        }
        match self.credentials(profile) {
            Ok((text, source, policy, steered)) => Wanted::Engage {
                wanted: Box::new(KubeconfigCluster {
                    name: cluster.clone(),
                    text,
                    source,
                    policy,
                    stable_id: stable_id(profile),
                    member: self.options.members.for_member(profile),
                    inventory: inventory(profile),
                }),
                steered,
            },
            Err((reason, kind)) => Wanted::NoCredentials { reason, kind },
        }
    }

    /// After an engagement of `cluster` built from `profile`: tells
    /// `steering` what the profile handed a plugin and where its
    /// credential went, if the cluster now holds it.
    fn settle(&self, cluster: &ClusterName, profile: &str, steered: Steered) {
        let engaged = self.fleet.clusters().get(cluster).is_ok()
            && !self.fleet.failures().current().contains_key(cluster);
        if let (Some((input, server)), true) = (steered, engaged) {
            self.steering.engaged(profile, input.as_deref(), &server);
        }
    }

    /// A profile looked at again just before its cluster is engaged (its
    /// client was being built): what it calls for now, recording why it
    /// cannot be engaged any more if it cannot, so that it is shown.
    fn still_wanted(&self, now: Wanted, cluster: &ClusterName) -> Option<KubeconfigCluster> {
        match now {
            Wanted::Engage { wanted, .. } => Some(*wanted),
            Wanted::NoCredentials { reason, kind } => {
                self.fleet.failures().record(cluster, reason, kind);
                None
            }
            Wanted::Gone | Wanted::NotReady => None,
        }
    }

    /// The requests a change of the profile `namespace/name` calls for:
    /// the profile's own, those of the inventory members it belongs to
    /// and belonged to when last seen, and those of the profiles handing
    /// a plugin the input it hands (`input`) or handed before.
    fn requests_for(
        &self,
        context: &MapContext<'_>,
        namespace: &str,
        name: &str,
        member_id: Option<&str>,
        input: Option<&str>,
    ) -> Vec<Request> {
        let key = (namespace.to_string(), name.to_string());
        let before = {
            let mut seen = self.member_ids.lock().unwrap_or_else(|e| e.into_inner());
            match member_id {
                Some(id) => seen.insert(key, id.to_string()),
                None => seen.remove(&key),
            }
        };
        let mut requests = vec![context.here(Some(namespace), name)];
        requests.extend(member_id.map(|id| context.here(None, id)));
        // A change of one may lift the refusal of another handing the
        // plugin the same input (see `steering`).
        let key = format!("{namespace}/{name}");
        let mut sharing = std::collections::BTreeSet::new();
        for input in self.steering.seen(&key, input) {
            sharing.extend(self.steering.engaged_with(&input));
            sharing.extend(
                self.profiles()
                    .by_index(steering::INDEX, &input, None)
                    .iter()
                    .map(|profile| profile_key(profile)),
            );
        }
        sharing.remove(&key);
        requests.extend(
            sharing
                .iter()
                .filter_map(|other| other.split_once('/'))
                .map(|(namespace, name)| context.here(Some(namespace), name)),
        );
        requests.extend(
            before
                .filter(|before| Some(before.as_str()) != member_id)
                .map(|before| context.here(None, before)),
        );
        requests
    }

    /// A cluster whose profile (or every profile of its inventory member)
    /// is not ready: an engaged one stays, told once (a warning) until it
    /// is ready again or gone, not on every status update.
    fn not_ready(&self, cluster: &ClusterName, why: &str) {
        let engaged = self.fleet.clusters().get(cluster).is_ok();
        let first = engaged
            && self
                .kept_unready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(cluster.clone());
        if first {
            tracing::warn!(%cluster, "{why}; keeping the engaged cluster");
        } else {
            tracing::debug!(%cluster, engaged, "{why}");
        }
    }

    /// Forgets that `cluster` was kept while not ready.
    fn ready_again(&self, cluster: &ClusterName) {
        self.kept_unready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(cluster);
    }

    /// Brings the fleet in line with the profile or inventory member of
    /// `request`: a namespaced request names a profile, engaged as
    /// `<namespace>/<name>` unless it carries an inventory member id; one
    /// without a namespace names an inventory member.
    async fn reconcile(&self, request: Request) -> Result<Action, Error> {
        let Some(namespace) = request.namespace.as_deref() else {
            return self.reconcile_member(&request.name).await;
        };
        let fleet_name = ClusterName::from(format!("{namespace}/{}", request.name));
        let profile = self.profiles().get(Some(namespace), &request.name);
        if profile.is_none() {
            let mut seen = self.member_ids.lock().unwrap_or_else(|e| e.into_inner());
            seen.remove(&(namespace.to_string(), request.name.clone()));
            self.steering.forget(fleet_name.as_str());
        }
        if let Some(id) = profile.as_deref().and_then(inventory_member::id) {
            self.fleet.remove(
                &fleet_name,
                &format!(
                    "its ClusterProfile describes inventory member {id:?}, engaged under that name"
                ),
            );
            return Ok(Action::await_change());
        }
        let wanted = self.wanted(profile.as_deref(), &fleet_name);
        if !matches!(wanted, Wanted::NotReady) {
            self.ready_again(&fleet_name);
        }
        match wanted {
            Wanted::Gone => self
                .fleet
                .remove(&fleet_name, "its ClusterProfile is deleted"),
            Wanted::NotReady => self.not_ready(&fleet_name, "its ClusterProfile is not ready"),
            Wanted::NoCredentials { reason, kind } => {
                self.fleet.failures().record(&fleet_name, reason, kind);
            }
            Wanted::Engage { wanted, steered } => {
                let now = || {
                    let profile = self.profiles().get(Some(namespace), &request.name);
                    self.still_wanted(self.wanted(profile.as_deref(), &fleet_name), &fleet_name)
                };
                let action = self.fleet.engage(*wanted, now).await;
                self.settle(&fleet_name, fleet_name.as_str(), steered);
                return action;
            }
        }
        Ok(Action::await_change())
    }
}

/// `<namespace>/<name>` of a profile.
fn profile_key(profile: &DynamicObject) -> String {
    format!(
        "{}/{}",
        profile.metadata.namespace.as_deref().unwrap_or_default(),
        profile.metadata.name.as_deref().unwrap_or_default()
    )
}

/// What `profile` hands its access provider's plugin, if the provider
/// file lets it use one ([`access::ProfileAccess::input`]).
fn plugin_input(providers: &access::ProviderFile, profile: &DynamicObject) -> Option<String> {
    providers.access_for(profile).ok()?.input
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

/// A profile's labels and annotations, with [`CLUSTER_MANAGER_LABEL`]
/// taken from `spec.clusterManager.name` when the cluster manager did not
/// set it, and its `status.properties` as properties.
fn inventory(profile: &DynamicObject) -> Inventory {
    let mut inventory = Inventory::of_object(&profile.metadata);
    if let Some(manager) = profile.data["spec"]["clusterManager"]["name"].as_str() {
        inventory
            .labels
            .entry(CLUSTER_MANAGER_LABEL.to_string())
            .or_insert_with(|| manager.to_string());
    }
    inventory.properties = profile.data["status"]["properties"]
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
    inventory
}

impl ClusterSetProvider for ClusterProfileProvider {
    fn cluster_set(&self) -> &Clusters {
        self.shared.fleet.clusters()
    }
}

#[async_trait::async_trait]
impl RunnableProvider for ClusterProfileProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        let shared = &self.shared;
        shared.fleet.start(&context)?;
        let shutdown = context.shutdown.clone();
        let Some(version) = ApiVersion::decide(&shared.hub.client(), PLURAL, &shutdown).await
        else {
            return Ok(context.stopped_before_engaged());
        };
        let version = *shared.version.get_or_init(|| version);
        let mapper = shared.clone();
        let mut builder = Controller::builder(format!("{}-provider", shared.options.name))
            .watches_dynamic(
                version.resource(KIND),
                Watch::new(),
                move |context, profile| {
                    let namespace = profile.metadata.namespace.as_deref().unwrap_or_default();
                    let name = profile.metadata.name.as_deref().unwrap_or_default();
                    // Gone while its client is built (a plugin waiting for
                    // a login): the build stops now, the reconcile removes it.
                    let gone = mapper
                        .profiles()
                        .get(Some(namespace), name)
                        .is_none_or(|now| now.metadata.deletion_timestamp.is_some());
                    if gone {
                        mapper
                            .fleet
                            .abandon(&ClusterName::from(format!("{namespace}/{name}")));
                    }
                    let input = mapper
                        .providers
                        .as_ref()
                        .and_then(|providers| plugin_input(providers, profile));
                    mapper.requests_for(
                        context,
                        profile.metadata.namespace.as_deref().unwrap_or_default(),
                        profile.metadata.name.as_deref().unwrap_or_default(),
                        inventory_member::id(profile),
                        input.as_deref(),
                    )
                },
            )
            .max_concurrent_reconciles(shared.options.max_concurrent_builds)
            .backoff(shared.options.retry);
        if shared.providers.is_none() {
            // Profiles are only looked at once the Secrets they may need are
            // listed, so a Secret that exists is never reported missing.
            let secrets = shared.hub.cache().informer::<Secret>();
            tracing::debug!("waiting for the credentials Secrets to be listed");
            tokio::select! {
                () = shutdown.cancelled() => return Ok(context.stopped_before_engaged()),
                () = secrets.wait_ready() => {}
            }
            let mapper = shared.clone();
            builder = builder.watches(Watch::<Secret>::new(), move |context, secret| {
                let Some((namespace, name)) = secrets::profile_of(secret) else {
                    return Vec::new();
                };
                let namespace = namespace.unwrap_or_default();
                let profile = mapper.profiles().get(Some(&namespace), &name);
                mapper.requests_for(
                    context,
                    &namespace,
                    &name,
                    profile.as_deref().and_then(inventory_member::id),
                    None,
                )
            });
        }
        let reconciler = shared.clone();
        shared
            .fleet
            .run(builder, shared.hub.clone(), &context, move |request| {
                let shared = reconciler.clone();
                async move { shared.reconcile(request).await }
            })
            .await
    }
}
