//! Building blocks for providers that discover clusters, as Go's providers
//! do: discovery is a reconciler over an inventory, on our own queue.
//!
//! Providers whose inventory is objects in a management cluster (kubeconfig
//! Secrets, Cluster API Clusters, ClusterProfiles) run a [`crate::controller::Controller`] over
//! those objects with [`Discovered::run`]; providers whose inventory is elsewhere (files,
//! a CLI) run a [`crate::controller::WorkQueue`] keyed by cluster name. Either
//! way discovery gets the queue's guarantees: one reconcile per inventory
//! object at a time, at most [`Discovered::DEFAULT_MAX_CONCURRENT_BUILDS`] (or the
//! provider's setting) at once, per-object backoff for failures worth
//! retrying (a credential plugin that failed or timed out), and requeues. A
//! slow object — a plugin waiting for a login that never comes — holds only
//! its own slot until its plugin's deadline; objects created after it are
//! engaged meanwhile, deleted ones removed.
//!
//! A provider keeps what it found in [`Discovered`]: its reconciler works out
//! the [`KubeconfigCluster`] an object calls for and hands it to
//! [`Discovered::engage`], or calls [`Discovered::remove`] when the object is gone.

use std::future::Future;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::controller::{Action, Backoff, ControllerBuilder, Request};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::multicluster::{Aware, InventoryEngaged, ProviderContext};
use crate::provider::clusters::Clusters;
use crate::provider::failures::Failures;
#[cfg(feature = "kubeconfig")]
use crate::provider::kubeconfig::KubeconfigCluster;
use multicluster_core::ClusterName;
use tokio_util::sync::CancellationToken;

/// What a discovering provider keeps: the clusters it engaged, why others
/// could not be, and how it builds clients.
#[derive(Debug)]
pub struct Discovered {
    clusters: Clusters,
    failures: Failures,
    /// The client builds under way, by cluster name, each with what stops
    /// it ([`Discovered::abandon`]).
    building: std::sync::Mutex<std::collections::HashMap<ClusterName, (u64, CancellationToken)>>,
}

/// A build's entry in [`Discovered::building`], taken out when it ends.
#[cfg(feature = "kubeconfig")]
struct Build<'a> {
    discovered: &'a Discovered,
    name: ClusterName,
    id: u64,
    stop: CancellationToken,
}

#[cfg(feature = "kubeconfig")]
impl Drop for Build<'_> {
    fn drop(&mut self) {
        let mut building = multicluster_core::lock(&self.discovered.building);
        if building
            .get(&self.name)
            .is_some_and(|(id, _)| *id == self.id)
        {
            building.remove(&self.name);
        }
    }
}

impl Discovered {
    /// The providers' default backoff for clusters whose credentials could
    /// not be obtained (a credential plugin failed or timed out): 1 s,
    /// doubling per failure up to 5 minutes.
    pub const DEFAULT_BACKOFF: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };

    /// How many clients a provider builds at once by default. Building
    /// runs the credential plugin, which can take a second or more.
    pub const DEFAULT_MAX_CONCURRENT_BUILDS: usize = 8;

    /// The name the management cluster has in a provider's controller, as
    /// its logs and spans show it.
    pub const MANAGEMENT: &'static str = "management";

    /// Nothing discovered yet by `provider` (its label in
    /// `mcr_cluster_engagement_failures`), counting failures in `metrics`.
    pub fn new(provider: impl Into<std::sync::Arc<str>>, metrics: Option<Metrics>) -> Self {
        Self {
            clusters: Clusters::new(),
            failures: Failures::new(provider, metrics),
            building: std::sync::Mutex::default(),
        }
    }

    /// Stops the client build under way for `name`, if any, at once: its
    /// credential plugin (and whatever it started) is stopped, and nothing
    /// is engaged. For a provider to call when it sees the inventory object
    /// gone while the object's reconcile still waits on its build (the
    /// reconcile that removes it comes only after), from the watch of those
    /// objects.
    pub fn abandon(&self, name: &ClusterName) {
        if let Some((_, stop)) = multicluster_core::lock(&self.building).get(name) {
            stop.cancel();
        }
    }

    #[cfg(feature = "kubeconfig")]
    fn build_started(&self, name: &ClusterName) -> Build<'_> {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stop = CancellationToken::new();
        multicluster_core::lock(&self.building).insert(name.clone(), (id, stop.clone()));
        Build {
            discovered: self,
            name: name.clone(),
            id,
            stop,
        }
    }

    /// The clusters engaged so far.
    pub fn clusters(&self) -> &Clusters {
        &self.clusters
    }

    /// Why clusters found could not be engaged.
    pub fn failures(&self) -> &Failures {
        &self.failures
    }

    /// The registry the provider records in, if any yet.
    pub fn metrics(&self) -> Option<&Metrics> {
        self.failures.metrics()
    }

    /// Engages `wanted`: builds its client unless the set already holds it
    /// unchanged, then adds or replaces it, and clears its failure. A
    /// failed build is recorded (named, never quoting the kubeconfig); when
    /// another attempt may help (a credential plugin failed or timed out)
    /// the error is returned, so the queue backs the object off and tries
    /// again; otherwise the object waits for a change.
    ///
    /// `still_wanted` is asked once the client is built, with what is
    /// wanted now: when the object changed meanwhile, the stale cluster is
    /// not engaged (the queue reconciles the object again, since it
    /// changed).
    #[cfg(feature = "kubeconfig")]
    pub async fn engage(
        &self,
        wanted: KubeconfigCluster,
        still_wanted: impl FnOnce() -> Option<KubeconfigCluster>,
    ) -> Result<Action, Error> {
        // Computed once: it digests the whole kubeconfig and the options.
        // Equal to the held one: building again would change nothing.
        let fingerprint = wanted.fingerprint();
        if self.clusters.fingerprint(&wanted.name).as_deref() == Some(fingerprint.as_str()) {
            self.failures.clear(&wanted.name);
            // Labels and properties alone changed (or nothing did): the
            // cluster keeps its client, cache and engagement.
            if let Ok(cluster) = self.clusters.get(&wanted.name)
                && cluster.set_inventory(wanted.inventory)
            {
                tracing::debug!(cluster = %wanted.name, "labels or properties of the cluster updated from {}", wanted.source);
            }
            return Ok(Action::await_change());
        }
        // A cluster not held yet is shown syncing while its client is built
        // (one held keeps its own state meanwhile), until this returns: by
        // then its failure or the cluster itself is there instead.
        let _building = self.clusters.get(&wanted.name).is_err().then(|| {
            self.failures.building(
                &wanted.name,
                format!("building its client from {}", wanted.source),
            )
        });
        let build = self.build_started(&wanted.name);
        let built = tokio::select! {
            built = wanted.build() => built,
            () = build.stop.cancelled() => {
                // Dropping the build stops its plugin's process group.
                tracing::info!(cluster = %wanted.name, "its inventory object is gone: the build of its client stopped");
                return Ok(Action::await_change());
            }
        };
        drop(build);
        let built = match built {
            Ok(built) => built,
            Err(err) if self.failures.record_build_error(&wanted.name, &err) => return Err(err),
            Err(_) => return Ok(Action::await_change()),
        };
        let Some(now) = still_wanted().filter(|now| now.fingerprint() == fingerprint) else {
            tracing::debug!(cluster = %wanted.name, "changed while its client was built; building again");
            return Ok(Action::await_change());
        };
        // Labels may have changed meanwhile; they need no new client.
        built.set_inventory(now.inventory);
        let replaced = self.clusters.get(&wanted.name).is_ok();
        // Cleared first: whoever sees the new cluster must not find the
        // failure it replaces still reported.
        self.failures.clear(&wanted.name);
        if self
            .clusters
            .add_or_replace(wanted.name.clone(), built, fingerprint)
        {
            if replaced {
                tracing::info!(cluster = %wanted.name, "cluster replaced in the fleet from {}", wanted.source);
            } else {
                tracing::info!(cluster = %wanted.name, "cluster added to the fleet from {}", wanted.source);
            }
        }
        Ok(Action::await_change())
    }

    /// Removes `name` (its inventory object is gone or being deleted) and
    /// forgets its failure and duplicates; `why` is logged.
    pub fn remove(&self, name: &ClusterName, why: &str) {
        self.failures.clear(name);
        self.failures.set_duplicates(name, Default::default());
        if self.clusters.remove(name) {
            tracing::info!(cluster = %name, "cluster removed from the fleet: {why}");
        }
    }

    /// Builds the controller `builder` describes (its sources, concurrency
    /// and backoff set), recording in the provider's registry, around
    /// `reconcile`, and runs it over the objects `management`'s cache holds
    /// until `context.shutdown` fires. Reconciles still running then
    /// (client builds) are dropped at once, which stops their credential
    /// plugins: nobody will use the clients.
    ///
    /// Says the inventory is engaged
    /// ([`ProviderContext::inventory_engaged`]) once `management`'s cache
    /// has listed what the controller watches and the queue has run dry:
    /// every object listed was tried once (those backing off are not
    /// waited for).
    pub async fn run<F, Fut>(
        &self,
        builder: ControllerBuilder,
        management: Cluster,
        context: &ProviderContext,
        reconcile: F,
    ) -> Result<InventoryEngaged, Error>
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, Error>> + Send + 'static,
    {
        let builder = match self.metrics() {
            Some(metrics) => builder.metrics(metrics.clone()),
            None => builder,
        };
        let controller = builder.build(move |request, _management| reconcile(request))?;
        let shutdown = context.shutdown.clone();
        let management_name = ClusterName::from(Self::MANAGEMENT);
        controller.engage(shutdown.child_token(), management_name.clone(), management)?;
        let first_pass = async {
            controller.caught_up(&management_name).await;
            controller.idle().await;
        };
        let running = controller.run(shutdown, Duration::ZERO);
        tokio::pin!(running);
        let engaged = tokio::select! {
            () = &mut running => return Ok(context.stopped_before_engaged()),
            () = first_pass => context.inventory_engaged(),
        };
        running.await;
        Ok(engaged)
    }

    /// Starts the cluster set with what the provider was started with:
    /// clusters are engaged with `context.aware` until `context.shutdown`
    /// ([`Clusters::start_discovering`]; [`Discovered::run`] says when the
    /// inventory is engaged), and failures and duplicates are recorded in
    /// `context.metrics` unless it was given a registry of its own,
    /// so they show on the manager's `/clusters`.
    pub fn start(&self, context: &ProviderContext) -> Result<(), Error> {
        self.failures.use_metrics(&context.metrics);
        self.clusters.start_discovering(context)
    }
}
