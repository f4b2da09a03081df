//! The manager: the local cluster, a provider, and the cluster-aware
//! components (controllers) that every engaged cluster reaches.
//!
//! Each engagement runs as one ordered sequence for its cluster: check that
//! the API server answers, hand the cluster to the coordinator, which
//! engages the components (their watches start), and report it
//! [`ClusterState::Ready`] once those watches have listed. A cluster that
//! does not answer in time is not dropped (Go removes it and forgets it): it
//! is reported [`ClusterState::Unreachable`], retried with backoff, and
//! engaged once it answers, while the rest of the fleet carries on. One
//! whose watches are refused is reported degraded and never ready until
//! they list.
//!
//! Once ready, a cluster's state follows what its client and cache see
//! ([`crate::health`]): a failure that lasts `unhealthy_after` makes it
//! [`ClusterState::Degraded`] or [`ClusterState::Unreachable`] with the
//! (redacted) reason, and it is ready again once the failure clears. Its
//! components stay engaged meanwhile; a cluster failing on requests is probed
//! with backoff, so it is seen to recover even when nothing else asks it.
//!
//! Providers run on every replica, leader or not, so any replica can answer
//! for any cluster; the coordinator decides which components engage.

#[cfg(feature = "health")]
mod endpoints;
mod options;
mod progress;
mod run;
mod signals;

mod tracking;

pub use multicluster_core::{ClusterState, ClusterStatus};
pub use options::ManagerOptions;
use tracking::Tracked;

use multicluster_core::lock;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cache::FieldIndex;
use crate::cluster::Cluster;
use crate::controller::Controller;
use crate::coordinator::{Coordinator, EngageAll};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::multicluster::{Aware, Provider, RunnableProvider};
use multicluster_core::ClusterName;

/// How long the coordinator and the provider may take to stop after the
/// shutdown grace period.
const STOP_ALLOWANCE: Duration = Duration::from_secs(3);

/// Runs controllers over the local cluster and a provider's fleet.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Inner>,
}

struct Inner {
    local: Cluster,
    provider: Option<Arc<dyn Provider>>,
    runnable: Option<Arc<dyn RunnableProvider>>,
    coordinator: Arc<dyn Coordinator>,
    options: ManagerOptions,
    metrics: Metrics,
    components: Mutex<Vec<Arc<dyn Aware>>>,
    controllers: Mutex<Controllers>,
    clusters: Mutex<Tracked>,
    /// Whether [`Manager::run`] has started everything (it never goes back).
    started: tokio::sync::watch::Sender<bool>,
    /// Cancelled when the manager ends every cluster's lifetime because it
    /// stops: those clusters are released, not gone from the fleet.
    stopping: CancellationToken,
    /// Raised by the signal handler [`Manager::run_until_signal`] installs,
    /// in the handler itself: controllers start no reconcile once it is up,
    /// although the runtime has not yet run the task that stops them.
    signalled: Arc<std::sync::atomic::AtomicBool>,
}

/// The controllers added, and while the manager runs, how to start one
/// added late.
#[derive(Default)]
struct Controllers {
    added: Vec<Controller>,
    start: Option<tokio::sync::mpsc::UnboundedSender<Controller>>,
}

/// Builds a [`Manager`]: the local cluster, then whatever else it needs.
#[must_use]
pub struct ManagerBuilder {
    local: Cluster,
    provider: Option<Arc<dyn Provider>>,
    runnable: Option<Arc<dyn RunnableProvider>>,
    coordinator: Arc<dyn Coordinator>,
    metrics: Option<Metrics>,
    options: ManagerOptions,
}

impl ManagerBuilder {
    /// The fleet comes from `provider`, which discovers clusters itself;
    /// [`Manager::run`] starts it.
    pub fn provider<P: RunnableProvider + 'static>(mut self, provider: Arc<P>) -> Self {
        self.runnable = Some(provider.clone());
        self.provider = Some(provider);
        self
    }

    /// The fleet comes from a provider that is only looked up: its clusters
    /// are engaged by whoever drives it.
    pub fn lookup_provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.provider = Some(provider);
        self.runnable = None;
        self
    }

    /// Who engages which cluster with the components (by default every
    /// replica engages every cluster):
    /// `multicluster_coordinator::leader_election::LeaderElection`
    /// or `multicluster_coordinator::sharding::ShardedCoordinator`
    /// for several replicas.
    pub fn coordinator(mut self, coordinator: Arc<dyn Coordinator>) -> Self {
        self.coordinator = coordinator;
        self
    }

    /// The metrics registry (default: a new one without per-cluster
    /// labels), for example one with per-cluster labels or one shared with
    /// a provider.
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The manager's settings (default [`ManagerOptions::default`]).
    pub fn options(mut self, options: ManagerOptions) -> Self {
        self.options = options;
        self
    }

    /// The manager.
    pub fn build(self) -> Manager {
        let metrics = self.metrics.unwrap_or_default();
        let manager = Manager {
            inner: Arc::new(Inner {
                local: self.local,
                provider: self.provider,
                runnable: self.runnable,
                coordinator: self.coordinator,
                options: self.options,
                metrics: metrics.clone(),
                components: Mutex::new(Vec::new()),
                controllers: Mutex::default(),
                clusters: Mutex::new(Tracked::new(metrics)),
                started: tokio::sync::watch::Sender::new(false),
                stopping: CancellationToken::new(),
                signalled: Arc::default(),
            }),
        };
        // Weak: the registry outlives a manager it was given to.
        let weak = Arc::downgrade(&manager.inner);
        manager.inner.metrics.report_ages(Box::new(move || {
            weak.upgrade()
                .map(|inner| Manager { inner }.cluster_ages())
                .unwrap_or_default()
        }));
        manager
    }
}

impl Manager {
    /// Starts building a manager for the local cluster `local`, the one it
    /// runs against. The fleet knows it as [`ClusterName::local`] whatever
    /// it is called; build it with [`Cluster::local`] so that its own name
    /// (in its spans and its cache's logs) is the same.
    pub fn builder(local: Cluster) -> ManagerBuilder {
        ManagerBuilder {
            local,
            provider: None,
            runnable: None,
            coordinator: Arc::new(EngageAll),
            metrics: None,
            options: ManagerOptions::default(),
        }
    }

    pub(crate) fn coordinator(&self) -> Arc<dyn Coordinator> {
        self.inner.coordinator.clone()
    }

    /// The provider the fleet comes from, if any.
    pub fn provider(&self) -> Option<&Arc<dyn Provider>> {
        self.inner.provider.as_ref()
    }

    /// Registers a field index on the local cluster and on every cluster
    /// of the provider, now and later.
    pub async fn index_field(&self, index: FieldIndex) -> Result<(), Error> {
        self.inner.local.cache().index_field(&index);
        if let Some(provider) = &self.inner.provider {
            provider.index_field(index).await?;
        }
        Ok(())
    }

    /// The manager's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The local cluster.
    pub fn local_cluster(&self) -> &Cluster {
        &self.inner.local
    }

    /// The cluster of that name: the local cluster for the empty name,
    /// otherwise the provider's, if this replica works on it.
    ///
    /// A cluster the coordinator gives to another replica (sharding), or to
    /// none while this one stands by (leader election), is refused with
    /// [`Error::NotOwned`]: a reconciler that reads a hub object naming a
    /// member must not write to that member from a replica that does not
    /// own it. The local cluster is always handed out: every replica works
    /// with the hub its members are reconciled against.
    pub async fn get_cluster(&self, name: &ClusterName) -> Result<Cluster, Error> {
        if name.is_local() {
            return Ok(self.inner.local.clone());
        }
        let cluster = match &self.inner.provider {
            Some(provider) => provider.get(name).await?,
            None => return Err(Error::ClusterNotFound(name.clone())),
        };
        if !self.coordinator().owns(name) {
            return Err(Error::NotOwned(name.clone()));
        }
        Ok(cluster)
    }

    /// Whether the manager is stopping: from before it ends the lifetimes
    /// of the clusters it holds at shutdown, so a component whose lifetime
    /// ends can tell "the process stops" from "the cluster left the fleet"
    /// (see [`Aware::engage`]).
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.is_cancelled()
    }

    /// How many handles to this manager exist: for tests that a component
    /// the manager holds does not keep the manager alive (feature
    /// `testing`).
    #[cfg(feature = "testing")]
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// What [`Manager::is_stopping`] reads, for components the manager
    /// holds (a handle to the manager itself would keep it alive).
    pub fn stopping_signal(&self) -> CancellationToken {
        self.inner.stopping.clone()
    }

    /// Adds a cluster-aware component; clusters already ready are engaged
    /// with it at once. A [`Controller`] given here is added as
    /// [`Manager::add_controller`] adds it, and run.
    pub fn add<A: Aware + 'static>(&self, component: Arc<A>) -> Result<(), Error> {
        let any: Arc<dyn std::any::Any + Send + Sync> = component.clone();
        if let Ok(controller) = any.downcast::<Controller>() {
            return self.add_controller(Controller::clone(&controller));
        }
        self.add_component(component)
    }

    fn add_component(&self, component: Arc<dyn Aware>) -> Result<(), Error> {
        lock(&self.inner.components).push(component.clone());
        let ready: Vec<_> = lock(&self.inner.clusters)
            .clusters
            .iter()
            .filter(|(_, held)| held.data.handed())
            .map(|(name, held)| (name.clone(), held.cluster.clone(), held.lifetime.clone()))
            .collect();
        for (name, cluster, lifetime) in ready {
            self.coordinator()
                .engage(lifetime, name, cluster, std::slice::from_ref(&component))?;
        }
        Ok(())
    }

    /// Adds a controller: it is engaged like any component and run by
    /// [`Manager::run`] — at once when the manager runs already.
    pub fn add_controller(&self, controller: Controller) -> Result<(), Error> {
        controller.use_metrics(&self.inner.metrics);
        controller.use_coordinator(self.coordinator());
        controller.close_on(&self.inner.signalled);
        if !controller.take_defaults(&self.inner.options.controller_defaults) {
            tracing::debug!(
                controller = controller.name(),
                "controller settings were fixed before it was added; the manager's controller defaults do not apply"
            );
        }
        {
            let mut controllers = lock(&self.inner.controllers);
            controllers.added.push(controller.clone());
            // Running already: started at once.
            if let Some(start) = &controllers.start {
                let _ = start.send(controller.clone());
            }
        }
        self.add_component(Arc::new(controller))
    }

    /// Each engaged cluster's status (state, since when, failed attempts,
    /// next attempt), each inventory object the provider could not make a
    /// cluster of ([`ClusterState::Unusable`]) and each describing a
    /// cluster held under another name ([`ClusterState::Duplicate`]),
    /// sorted by name.
    pub fn cluster_states(&self) -> Vec<(ClusterName, ClusterStatus)> {
        let now = progress::Moment::now();
        let mut states: std::collections::BTreeMap<ClusterName, ClusterStatus> =
            lock(&self.inner.clusters)
                .clusters
                .iter()
                .map(|(name, held)| (name.clone(), held.data.status(&held.cluster, now)))
                .collect();
        for (name, unusable) in self.inner.metrics.fleet().unusable_inventory() {
            states.entry(name).or_insert_with(|| unusable.status());
        }
        for (name, duplicate) in self.inner.metrics.fleet().duplicates() {
            states.entry(name).or_insert_with(|| duplicate.status());
        }
        for (name, building) in self.inner.metrics.fleet().in_building() {
            states.entry(name).or_insert_with(|| building.status());
        }
        states.into_iter().collect()
    }

    /// The state of `name`: an engaged cluster's,
    /// [`ClusterState::Unusable`] for an inventory object that could not
    /// become one, or [`ClusterState::Duplicate`]; `None` when the fleet
    /// has no such name.
    pub fn cluster_state(&self, name: &ClusterName) -> Option<ClusterState> {
        let engaged = lock(&self.inner.clusters)
            .clusters
            .get(name)
            .map(|held| held.data.state.clone());
        let fleet = self.inner.metrics.fleet();
        engaged
            .or_else(|| {
                fleet
                    .unusable_inventory()
                    .into_iter()
                    .find(|(unusable, _)| unusable == name)
                    .map(|(_, unusable)| ClusterState::Unusable(unusable.reason))
            })
            .or_else(|| {
                fleet
                    .duplicates()
                    .into_iter()
                    .find(|(duplicate, _)| duplicate == name)
                    .map(|(_, duplicate)| ClusterState::Duplicate(duplicate.of))
            })
            .or_else(|| fleet.is_building(name).then_some(ClusterState::Syncing))
    }

    /// The fleet in numbers, told of every change: how many clusters are
    /// syncing, ready, degraded, unreachable, and how many inventory objects
    /// are unusable. Wait on it (`changed().await`) instead of polling
    /// [`Manager::cluster_states`].
    pub fn watch_fleet(&self) -> tokio::sync::watch::Receiver<crate::fleet::FleetSummary> {
        self.inner.metrics.fleet().subscribe()
    }

    /// Completes once every engaged cluster was checked: handed to the
    /// coordinator (its API server answered) or found unreachable.
    async fn all_checked(&self) {
        let all_checked = lock(&self.inner.clusters).all_checked.clone();
        loop {
            let told = all_checked.notified();
            tokio::pin!(told);
            // Registered before looking, so a check ending between the
            // look and the wait still wakes it.
            told.as_mut().enable();
            if lock(&self.inner.clusters).unchecked == 0 {
                return;
            }
            told.await;
        }
    }

    /// Whether [`Manager::run`] has engaged the local cluster and started
    /// the provider (the readiness endpoint reports this).
    pub fn is_started(&self) -> bool {
        *self.inner.started.borrow()
    }

    /// Whether the process is ready to work, as `/readyz` says: started,
    /// and the local cluster's watches have listed (its state is ready,
    /// or degraded: its server answered and refused something, which
    /// `/clusters` names; a process not ready for that would never be).
    /// Members do not count: one of them down must not take the process
    /// out of service.
    pub fn is_ready(&self) -> bool {
        self.is_started()
            && matches!(
                self.cluster_state(&ClusterName::local()),
                Some(ClusterState::Ready | ClusterState::Degraded(_))
            )
    }

    /// Completes once [`Manager::is_started`] holds (at once if it does).
    pub async fn started(&self) {
        let mut started = self.inner.started.subscribe();
        // The sender lives as long as the manager borrowed here.
        let _ = started.wait_for(|started| *started).await;
    }

    /// Runs until `shutdown` fires: engages the local cluster, starts the
    /// provider and every controller; at shutdown lets the coordinator hand
    /// its clusters over (a sharded replica; see [`Coordinator::leave`]),
    /// then stops taking work and lets running reconciles finish, all
    /// within the shutdown grace period and a short allowance.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), Error> {
        self.raise_open_files_limit();
        if let Some(address) = self.inner.options.health_address {
            self.bind_health(address, &shutdown).await?;
        }
        let mut running = self.start(&shutdown)?;
        let provider_ended = running.serve(&shutdown).await;
        lock(&self.inner.controllers).start = None;
        // Nothing extends the shutdown past this: reconciles get the grace
        // period, the coordinator and the provider a little more.
        let grace = self.inner.options.shutdown_grace;
        let deadline = tokio::time::Instant::now() + grace + STOP_ALLOWANCE;
        if provider_ended.is_some() {
            tracing::error!("the provider stopped; shutting down");
        } else {
            self.leave(grace).await;
        }
        running.stop(self, provider_ended, deadline).await
    }

    #[cfg(feature = "health")]
    async fn bind_health(
        &self,
        address: SocketAddr,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|source| Error::Bind { address, source })?;
        self.serve_health(listener, shutdown.clone());
        Ok(())
    }

    #[cfg(not(feature = "health"))]
    async fn bind_health(&self, address: SocketAddr, _: &CancellationToken) -> Result<(), Error> {
        Err(Error::InvalidOptions {
            component: "manager options".to_string(),
            reason: format!(
                "health_address is {address}, but this build has no endpoints: enable the `health` feature of multicluster-runtime"
            ),
        })
    }

    /// Serves the health, readiness, metrics and cluster-state endpoints on
    /// `listener` until `shutdown` fires (what `health_address` does, for a
    /// listener the caller bound). Needs the `health` feature.
    #[cfg(feature = "health")]
    pub fn serve_health(&self, listener: tokio::net::TcpListener, shutdown: CancellationToken) {
        tokio::spawn(endpoints::serve(listener, self.clone(), shutdown));
    }

    /// [`Manager::run`] until SIGTERM or Ctrl-C (SIGINT). No reconcile
    /// starts once the signal is received: the signal handler itself closes
    /// the controllers' queues, before the runtime runs the task that shuts
    /// the manager down (under a burst of work that can take milliseconds).
    pub async fn run_until_signal(&self) -> Result<(), Error> {
        let mut signals = signals::Signals::install(&self.inner.signalled);
        let shutdown = CancellationToken::new();
        let run = self.run(shutdown.clone());
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => return result,
            () = signals.received() => shutdown.cancel(),
        }
        run.await
    }
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("clusters", &self.cluster_states())
            .finish_non_exhaustive()
    }
}
