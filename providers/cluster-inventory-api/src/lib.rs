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
//! The access-provider strategy (KEP-5339) reads the consumer's
//! [`access::ProviderFile`] and runs an exec credential plugin per profile;
//! see [`access`]. Profiles are looked at in event order, but their clients
//! (and so their plugins) are built up to
//! [`ClusterProfileOptions::max_concurrent_builds`] at once, so a slow plugin
//! holds up only its own profile.
//!
//! A profile that cannot be engaged is logged, counted in
//! `mcr_cluster_engagement_failures{provider="cluster-inventory-api"}` and
//! listed by [`ClusterProfileProvider::failures`]; the rest of the fleet goes
//! on. When its credentials cannot be obtained (a credential plugin that
//! fails) it is retried with exponential backoff; other problems wait for the
//! profile or its Secret to change.

pub mod access;
mod options;
mod secrets;

pub use options::{ClusterProfileOptions, Credentials, Readiness, control_plane_healthy};

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::clusters::{ClusterSetProvider, Clusters, KubeconfigCluster};
use multicluster_runtime::failures::Failures;
use multicluster_runtime::inflight::InFlight;
use multicluster_runtime::retry::Retries;
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, RunnableProvider, watch_filter};
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
pub use multicluster_runtime::watch_filter::LABEL as WATCH_FILTER_LABEL;

/// ClusterProfiles as clusters.
#[derive(Debug)]
pub struct ClusterProfileProvider {
    options: ClusterProfileOptions,
    resource: ApiResource,
    profiles: Cache,
    credentials: CredentialSource,
    clusters: Clusters,
    failures: Failures,
}

/// Where the provider reads credentials, with what that needs.
#[derive(Debug)]
enum CredentialSource {
    /// The consumer's Secrets, watched.
    Secrets(Cache),
    /// The consumer's provider file.
    AccessProviders(access::ProviderFile),
}

/// A profile's key in the hub: namespace and name.
type ProfileKey = (String, String);

/// What a look at a profile calls for.
enum Decision {
    /// Nothing more (engaged and unchanged, removed, waiting, failed).
    Done(Outcome),
    /// A cluster to (re)build.
    Build(KubeconfigCluster),
}

/// Client builds in flight: each profile's wanted cluster and the result.
type Builds = InFlight<ProfileKey, (KubeconfigCluster, Result<Cluster, Error>)>;

/// What became of one look at a profile.
enum Outcome {
    /// Engaged (or unchanged), or removed: nothing to come back for.
    Settled,
    /// Waits for the profile or its Secret to change.
    Waiting,
    /// Its credentials could not be obtained; worth another attempt later.
    Failed,
}

impl ClusterProfileProvider {
    /// Watches profiles (and, for the Secret strategy, credential Secrets)
    /// through `hub`, the cluster holding the inventory.
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
        let profiles_watch = watch_filter::watcher_config(options.watch_filter.as_deref());
        let credentials = match &options.credentials {
            Credentials::Secret { consumer } => CredentialSource::Secrets(cache(
                "cluster-profile-secrets",
                watcher::Config::default().labels(&format!("{CONSUMER_LABEL}={consumer}")),
            )),
            Credentials::AccessProviders(providers) => {
                CredentialSource::AccessProviders(providers.clone())
            }
        };
        Self {
            resource: ApiResource::from_gvk(&GroupVersionKind::gvk(
                "multicluster.x-k8s.io",
                "v1alpha1",
                "ClusterProfile",
            )),
            profiles: cache("cluster-profiles", profiles_watch),
            credentials,
            failures: Failures::new("cluster-inventory-api", options.metrics.clone()),
            options,
            clusters: Clusters::new(),
        }
    }

    /// Names of the engaged clusters, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.clusters.names()
    }

    /// Profiles that are ready but could not be engaged with their current
    /// settings, each with the reason; an entry goes once the profile is
    /// engaged or gone.
    pub fn failures(&self) -> BTreeMap<ClusterName, String> {
        self.failures.current()
    }

    fn ready(&self, profile: &DynamicObject) -> bool {
        match &self.options.readiness {
            Some(readiness) => readiness(profile),
            None => control_plane_healthy(profile),
        }
    }

    /// The kubeconfig text for a profile and a description of where it came
    /// from, for errors.
    fn credentials(&self, profile: &DynamicObject) -> Result<(String, String), String> {
        match &self.credentials {
            CredentialSource::Secrets(secrets) => secrets::credentials(
                secrets,
                profile.metadata.namespace.as_deref().unwrap_or_default(),
                profile.metadata.name.as_deref().unwrap_or_default(),
            ),
            CredentialSource::AccessProviders(providers) => {
                let access = providers
                    .access_for(profile)
                    .map_err(|err| err.to_string())?;
                let source = format!(
                    "ClusterProfile {}/{} access provider {:?}{}",
                    profile.metadata.namespace.as_deref().unwrap_or_default(),
                    profile.metadata.name.as_deref().unwrap_or_default(),
                    access.provider,
                    if access.deprecated_field {
                        " (listed only in the deprecated status.credentialProviders)"
                    } else {
                        ""
                    }
                );
                Ok((access.text(), source))
            }
        }
    }

    /// Looks at the profile `namespace/name`: everything that needs no new
    /// client is done here, in event order; a cluster to (re)build is
    /// returned.
    fn decide(&self, namespace: &str, name: &str) -> Decision {
        let fleet_name = ClusterName::from(format!("{namespace}/{name}"));
        let profile = self
            .profiles
            .dynamic(&self.resource)
            .get(Some(namespace), name);
        let Some(profile) = profile.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
            self.failures.clear(&fleet_name);
            if self.clusters.remove(&fleet_name) {
                tracing::info!(cluster = %fleet_name, "ClusterProfile deleted; removed from the fleet");
            }
            return Decision::Done(Outcome::Settled);
        };
        if !self.ready(&profile) {
            if self.clusters.get(&fleet_name).is_ok() {
                tracing::warn!(cluster = %fleet_name, "ClusterProfile is not ready; keeping the engaged cluster");
            } else {
                tracing::debug!(cluster = %fleet_name, "ClusterProfile is not ready yet");
            }
            return Decision::Done(Outcome::Waiting);
        }
        let (text, source) = match self.credentials(&profile) {
            Ok(found) => found,
            Err(reason) => {
                self.failures.record(&fleet_name, reason, "no-credentials");
                return Decision::Done(Outcome::Waiting);
            }
        };
        let wanted = KubeconfigCluster {
            name: fleet_name,
            text,
            source,
            stable_id: stable_id(&profile),
        };
        if self.clusters.is_current(&wanted) {
            self.failures.clear(&wanted.name);
            return Decision::Done(Outcome::Settled);
        }
        Decision::Build(wanted)
    }

    /// Puts a built cluster into the fleet, or records why it failed.
    fn apply(&self, wanted: &KubeconfigCluster, built: Result<Cluster, Error>) -> Outcome {
        let name = &wanted.name;
        match built {
            Ok(cluster) => {
                if self
                    .clusters
                    .add_or_replace(name.clone(), cluster, wanted.fingerprint())
                {
                    tracing::info!(cluster = %name, "ClusterProfile engaged from {}", wanted.source);
                }
                self.failures.clear(name);
                Outcome::Settled
            }
            Err(err) if self.failures.record_build_error(name, &err) => Outcome::Failed,
            Err(_) => Outcome::Waiting,
        }
    }

    /// Decides on `key` and starts a build if one is needed (or lets the
    /// key wait for room, or marks a running build stale).
    fn look(&self, key: ProfileKey, builds: &mut Builds, retries: &mut Retries<ProfileKey>) {
        if builds.mark_if_running(&key) {
            return;
        }
        match self.decide(&key.0, &key.1) {
            Decision::Done(outcome) => follow_up(outcome, key, retries),
            Decision::Build(wanted) => {
                builds.start(
                    key,
                    Box::pin(async move {
                        let built = wanted.build(&Default::default()).await;
                        (wanted, built)
                    }),
                );
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

impl ClusterSetProvider for ClusterProfileProvider {
    fn cluster_set(&self) -> &Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for ClusterProfileProvider {
    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        self.clusters.start(shutdown.clone(), aware)?;
        // Profiles are only looked at once the Secrets they may need are
        // listed, so a Secret that exists is never reported missing.
        let mut secret_events = match &self.credentials {
            CredentialSource::Secrets(secrets) => {
                let secrets = secrets.informer::<Secret>();
                let events = secrets.subscribe();
                tracing::debug!("waiting for the credentials Secrets to be listed");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    () = secrets.wait_ready() => {}
                }
                events.boxed()
            }
            CredentialSource::AccessProviders(_) => futures::stream::pending().boxed(),
        };
        let mut profile_events = self.profiles.dynamic(&self.resource).subscribe();
        let mut retries = Retries::new(self.options.retry);
        let mut builds: Builds = InFlight::new(self.options.max_concurrent_builds);
        loop {
            while let Some(key) = builds.next_waiting() {
                self.look(key, &mut builds, &mut retries);
            }
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
                    Some(event) => secrets::profile_of(&event),
                    None => return Err(Error::Other("the credentials Secret watch stopped".into())),
                },
                key = retries.next() => Some(key),
                done = builds.next() => {
                    if done.stale {
                        // The profile changed meanwhile: look at it afresh.
                        Some(done.key)
                    } else {
                        let (wanted, built) = done.result;
                        follow_up(self.apply(&wanted, built), done.key, &mut retries);
                        None
                    }
                }
            };
            if let Some(key) = key {
                self.look(key, &mut builds, &mut retries);
            }
        }
    }
}

/// Schedules another attempt at `key` after a failure, or forgets its
/// failures.
fn follow_up(outcome: Outcome, key: ProfileKey, retries: &mut Retries<ProfileKey>) {
    match outcome {
        Outcome::Settled | Outcome::Waiting => retries.forget(&key),
        Outcome::Failed => {
            let profile = format!("{}/{}", key.0, key.1);
            let delay = retries.failed(key);
            tracing::debug!(%profile, ?delay, "trying the ClusterProfile again later");
        }
    }
}
