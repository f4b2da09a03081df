//! What the ClusterProfile provider is told: credentials strategy, scope,
//! readiness, retries.

use std::sync::Arc;

use kube::api::DynamicObject;
use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::controller::Backoff;
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::provider::discovery::Discovered;
use multicluster_runtime::provider::member::Members;

use crate::access::ProviderFile;

/// How the provider gets credentials for a profile.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Credentials {
    /// A Secret per profile for the consumer `consumer`.
    Secret {
        /// This consumer's name (value of `x-k8s.io/cluster-inventory-consumer`).
        consumer: String,
    },
    /// Exec credential plugins chosen per profile from the consumer's
    /// provider file (KEP-5339).
    AccessProviders(ProviderFile),
}

/// Decides whether a profile is ready to be engaged.
pub type Readiness = Arc<dyn Fn(&DynamicObject) -> bool + Send + Sync>;

/// Options of the ClusterProfile provider.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClusterProfileOptions {
    /// This instance's name (default `cluster-inventory-api`): the label `provider` of
    /// its metrics, and its controller's name with `-provider` appended
    /// (logs and spans carry it). Give instances in one process (two in a
    /// multi provider, say) different names, so their figures stay apart.
    pub name: String,
    /// Where credentials come from.
    pub credentials: Credentials,
    /// Watch profiles (and Secrets) in this namespace only.
    pub namespace: Option<String>,
    /// Only profiles labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// Overrides the default readiness (`ControlPlaneHealthy` is `True`).
    pub readiness: Option<Readiness>,
    /// How long to wait before building a failed profile's client again
    /// (default: 1 s, doubling per failure up to 5 min).
    pub retry: Backoff,
    /// Where engagement failures and the provider's reconciles (controller
    /// `cluster-inventory-api-provider`) are counted. Default: the registry
    /// of the manager that runs the provider.
    pub metrics: Option<Metrics>,
    /// How many profiles' clients are built at once (default
    /// [`Discovered::DEFAULT_MAX_CONCURRENT_BUILDS`]). Building runs the credential
    /// plugin, which can take a second or more; the rest of the profiles are
    /// looked at meanwhile.
    pub max_concurrent_builds: usize,
    /// How each member's clients and cache are built: the same for every
    /// member, or adjusted per member from its ClusterProfile
    /// ([`Members::per_member`]). A `ClientOptions`, `CacheOptions` or
    /// `MemberOptions` converts into it.
    pub members: Members<DynamicObject>,
    /// What may be used of the kubeconfigs read from the hub (default
    /// [`KubeconfigPolicy::untrusted`]): the Secret strategy's Secrets, and
    /// with access providers the profile's `cluster` entry (a CA file path,
    /// `insecure-skip-tls-verify`, `proxy-url`). An access provider's
    /// plugin comes from your provider file, not from the hub, and runs
    /// whatever `exec` says.
    pub kubeconfig_policy: KubeconfigPolicy,
}

multicluster_runtime::option_setters!(ClusterProfileOptions {
    name: impl Into<String>,
    credentials: Credentials,
    namespace: impl Into<Option<String>>,
    watch_filter: impl Into<Option<String>>,
    retry: Backoff,
    metrics: impl Into<Option<Metrics>>,
    max_concurrent_builds: usize,
    members: impl Into<Members<DynamicObject>>,
    kubeconfig_policy: KubeconfigPolicy,
});

impl ClusterProfileOptions {
    /// Sets [`ClusterProfileOptions::readiness`]: `ready` decides whether a
    /// profile's cluster is engaged, instead of the default rule.
    #[must_use]
    pub fn readiness(
        mut self,
        ready: impl Fn(&DynamicObject) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.readiness = Some(Arc::new(ready));
        self
    }

    /// Options for the Secret strategy with everything else at defaults.
    pub fn with_secrets(consumer: impl Into<String>) -> Self {
        Self::with_credentials(Credentials::Secret {
            consumer: consumer.into(),
        })
    }

    /// Options for the access-provider strategy with everything else at
    /// defaults.
    pub fn with_access_providers(providers: ProviderFile) -> Self {
        Self::with_credentials(Credentials::AccessProviders(providers))
    }

    fn with_credentials(credentials: Credentials) -> Self {
        Self {
            name: "cluster-inventory-api".to_string(),
            credentials,
            namespace: None,
            watch_filter: None,
            readiness: None,
            retry: Discovered::DEFAULT_BACKOFF,
            metrics: None,
            max_concurrent_builds: Discovered::DEFAULT_MAX_CONCURRENT_BUILDS,
            members: Members::default(),
            kubeconfig_policy: KubeconfigPolicy::untrusted(),
        }
    }
}

impl std::fmt::Debug for ClusterProfileOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterProfileOptions")
            .field("name", &self.name)
            .field("credentials", &self.credentials)
            .field("namespace", &self.namespace)
            .field("watch_filter", &self.watch_filter)
            .field("custom_readiness", &self.readiness.is_some())
            .field("retry", &self.retry)
            .field("metrics", &self.metrics.is_some())
            .field("max_concurrent_builds", &self.max_concurrent_builds)
            .field("members", &self.members)
            .field("kubeconfig_policy", &self.kubeconfig_policy)
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
