//! The manager: the local cluster, a provider, and the cluster-aware
//! components (controllers) that every engaged cluster reaches.
//!
//! Each engagement runs as one ordered sequence for its cluster: check that
//! the API server answers and the cluster's cache has synced, then hand the
//! cluster to the coordinator, which engages the components. A cluster that
//! does not answer in time is not dropped (Go removes it and forgets it): it
//! is reported [`ClusterState::Unreachable`], retried with backoff, and
//! engaged once it answers, while the rest of the fleet carries on.
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

use crate::engagements::{Arrival, Engagements, when_ended};
use crate::sync::lock;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cache::FieldIndex;
use crate::controller::Controller;
use crate::coordinator::{Coordinator, EngageAll};
use crate::metrics::Metrics;
use crate::redact::Redacted;
use crate::{Aware, Cluster, ClusterName, Error, Provider, RunnableProvider};

/// How long the coordinator and the provider may take to stop after the
/// shutdown grace period.
const STOP_ALLOWANCE: Duration = Duration::from_secs(3);

/// How often engaged clusters' health is looked at.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Where a cluster stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterState {
    /// Engaged by the provider; waiting for the API server and cache.
    Syncing,
    /// Handed to the components, and working.
    Ready,
    /// Handed to the components, but some of its watches keep failing with
    /// an answer from the server (a `403` after lost RBAC, say); the reason
    /// says which. Ready again once they work.
    Degraded(Redacted),
    /// The API server cannot be reached, does not answer in time, or the
    /// cache did not sync; the reason is the last error. Before the cluster
    /// is handed to the components, the check is retried with backoff; after,
    /// it is probed with backoff and is ready again once it answers.
    Unreachable(Redacted),
    /// Not a cluster yet: the provider found it in its inventory but cannot
    /// make a cluster of it (a Secret without its key, a kubeconfig naming a
    /// user it lacks, a credential plugin that fails); the reason says why.
    /// A cluster already engaged under the name keeps its own state.
    Unusable(Redacted),
}

impl ClusterState {
    /// The state's name as `/clusters` and `mcr_clusters{state}` show it.
    pub fn label(&self) -> &'static str {
        match self {
            ClusterState::Syncing => "syncing",
            ClusterState::Ready => "ready",
            ClusterState::Degraded(_) => "degraded",
            ClusterState::Unreachable(_) => "unreachable",
            ClusterState::Unusable(_) => "unusable",
        }
    }

    /// The state's place in the engaged clusters' counts (the order of
    /// [`crate::metrics`]'s `cluster_states`); an engaged cluster is never
    /// unusable.
    fn index(&self) -> usize {
        match self {
            ClusterState::Syncing => 0,
            ClusterState::Ready => 1,
            ClusterState::Degraded(_) => 2,
            ClusterState::Unreachable(_) | ClusterState::Unusable(_) => 3,
        }
    }
}

impl From<crate::health::Health> for ClusterState {
    fn from(health: crate::health::Health) -> Self {
        match health {
            crate::health::Health::Healthy => ClusterState::Ready,
            crate::health::Health::Degraded(reason) => ClusterState::Degraded(reason),
            crate::health::Health::Unreachable(reason) => ClusterState::Unreachable(reason),
        }
    }
}

/// Manager settings: [`Default`], then the setters.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ManagerOptions {
    /// How long a newly engaged cluster may take to answer and sync before
    /// it is reported unreachable (default 30 s).
    pub sync_timeout: Duration,
    /// First retry delay for unreachable clusters, doubling up to
    /// `max_retry_delay` (default 1 s).
    pub retry_delay: Duration,
    /// Longest retry delay (default 60 s).
    pub max_retry_delay: Duration,
    /// How long a failure of a ready cluster must last before it is reported
    /// degraded or unreachable (default 3 s), so that one error retried at
    /// once does not make its state flap.
    pub unhealthy_after: Duration,
    /// How long running reconciles may take to finish at shutdown (default
    /// 30 s). The whole shutdown — reconciles, the coordinator handing its
    /// clusters over, the provider stopping (and its credential plugins
    /// with it) — ends within this plus 3 s: whatever still runs then is
    /// dropped.
    pub shutdown_grace: Duration,
    /// Where to serve `/healthz`, `/readyz`, `/metrics` and `/clusters`;
    /// `None` (the default) serves nothing. Needs the `health` feature (a
    /// default one); without it, [`Manager::run`] refuses an address.
    pub health_address: Option<SocketAddr>,
    /// Raise the process's soft limit on open files to its hard limit when
    /// [`Manager::run`] starts (default true; see
    /// [`crate::provider::process::raise_open_files_limit`]). A cluster that cannot
    /// connect for want of file descriptors says so in its reason.
    pub raise_open_files_limit: bool,
}

crate::option_setters!(ManagerOptions {
    sync_timeout: Duration,
    retry_delay: Duration,
    max_retry_delay: Duration,
    unhealthy_after: Duration,
    shutdown_grace: Duration,
    health_address: Option<SocketAddr>,
    raise_open_files_limit: bool,
});

impl Default for ManagerOptions {
    fn default() -> Self {
        Self {
            sync_timeout: crate::cache::DEFAULT_SYNC_TIMEOUT,
            retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(60),
            unhealthy_after: Duration::from_secs(3),
            shutdown_grace: Duration::from_secs(30),
            health_address: None,
            raise_open_files_limit: true,
        }
    }
}

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
    started: CancellationToken,
    /// Cancelled when the manager ends every cluster's lifetime because it
    /// stops: those clusters are released, not gone from the fleet.
    stopping: CancellationToken,
}

/// The controllers added, and while the manager runs, how to start one
/// added late.
#[derive(Default)]
struct Controllers {
    added: Vec<Controller>,
    start: Option<tokio::sync::mpsc::UnboundedSender<Controller>>,
}

/// The engaged clusters, and how many are in each state (kept as states
/// change, so publishing the counts never walks the fleet).
#[derive(Default)]
struct Tracked {
    clusters: Engagements<Progress>,
    counts: [i64; 4],
    /// Set when a health walk found every engaged cluster well: the
    /// failure changes then. Until they move (or a cluster is engaged),
    /// walking again would find the same.
    quiet_at: Option<u64>,
}

struct Progress {
    state: ClusterState,
    /// Whether it was handed to the components (it became ready once).
    engaged: bool,
    /// When an unhealthy engaged cluster is probed next, and the delay
    /// after that.
    next_probe: Option<(tokio::time::Instant, Duration)>,
}

impl Tracked {
    fn count(&mut self, state: &ClusterState, by: i64) {
        self.counts[state.index()] += by;
    }

    /// Moves `name`'s engagement of `generation` to `state`; false when
    /// that engagement is gone.
    fn set_state(&mut self, name: &ClusterName, generation: u64, state: ClusterState) -> bool {
        let Some(held) = self.clusters.current_mut(name, generation) else {
            return false;
        };
        let old = std::mem::replace(&mut held.data.state, state.clone());
        self.count(&old, -1);
        self.count(&state, 1);
        true
    }
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

    /// Who engages which cluster with the components (default
    /// [`EngageAll`]): [`LeaderElection`](crate::coordinator::leader_election::LeaderElection)
    /// or [`ShardedCoordinator`](crate::coordinator::sharding::ShardedCoordinator) for
    /// several replicas.
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
        Manager {
            inner: Arc::new(Inner {
                local: self.local,
                provider: self.provider,
                runnable: self.runnable,
                coordinator: self.coordinator,
                options: self.options,
                metrics: self.metrics.unwrap_or_default(),
                components: Mutex::new(Vec::new()),
                controllers: Mutex::default(),
                clusters: Mutex::default(),
                started: CancellationToken::new(),
                stopping: CancellationToken::new(),
            }),
        }
    }
}

impl Manager {
    /// Starts building a manager for the local cluster `local`.
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

    /// A manager for the local cluster `local`, without a provider.
    pub fn new(local: Cluster) -> Self {
        Self::builder(local).build()
    }

    /// A manager whose fleet comes from a provider that discovers clusters
    /// itself (short for the [builder](Manager::builder) with `provider`
    /// and `options`).
    pub fn with_provider<P: RunnableProvider + 'static>(
        local: Cluster,
        provider: Arc<P>,
        options: ManagerOptions,
    ) -> Self {
        Self::builder(local)
            .provider(provider)
            .options(options)
            .build()
    }

    /// A manager with a provider that is only looked up (short for the
    /// [builder](Manager::builder) with `lookup_provider` and `options`).
    pub fn with_lookup_provider(
        local: Cluster,
        provider: Arc<dyn Provider>,
        options: ManagerOptions,
    ) -> Self {
        Self::builder(local)
            .lookup_provider(provider)
            .options(options)
            .build()
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
    /// otherwise the provider's.
    pub async fn get_cluster(&self, name: &ClusterName) -> Result<Cluster, Error> {
        if name.is_local() {
            return Ok(self.inner.local.clone());
        }
        match &self.inner.provider {
            Some(provider) => provider.get(name).await,
            None => Err(Error::ClusterNotFound(name.clone())),
        }
    }

    /// Whether the manager is stopping: from before it ends the lifetimes
    /// of the clusters it holds at shutdown, so a component whose lifetime
    /// ends can tell "the process stops" from "the cluster left the fleet"
    /// (see [`Aware::engage`]).
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.is_cancelled()
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
            .filter(|(_, held)| held.data.engaged)
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

    /// Each engaged cluster and its state, and each inventory object the
    /// provider could not make a cluster of ([`ClusterState::Unusable`]),
    /// sorted by name.
    pub fn cluster_states(&self) -> Vec<(ClusterName, ClusterState)> {
        let mut states: std::collections::BTreeMap<ClusterName, ClusterState> =
            lock(&self.inner.clusters)
                .clusters
                .iter()
                .map(|(name, held)| (name.clone(), held.data.state.clone()))
                .collect();
        for (name, _, reason) in self.inner.metrics.fleet().unusable_inventory() {
            states.entry(name).or_insert(ClusterState::Unusable(reason));
        }
        states.into_iter().collect()
    }

    /// The state of `name`: an engaged cluster's, or
    /// [`ClusterState::Unusable`] for an inventory object that could not
    /// become one; `None` when the fleet has no such name.
    pub fn cluster_state(&self, name: &ClusterName) -> Option<ClusterState> {
        let engaged = lock(&self.inner.clusters)
            .clusters
            .get(name)
            .map(|held| held.data.state.clone());
        engaged.or_else(|| {
            self.inner
                .metrics
                .fleet()
                .unusable_inventory()
                .into_iter()
                .find(|(unusable, _, _)| unusable == name)
                .map(|(_, _, reason)| ClusterState::Unusable(reason))
        })
    }

    /// The fleet in numbers, told of every change: how many clusters are
    /// syncing, ready, degraded, unreachable, and how many inventory objects
    /// are unusable. Wait on it (`changed().await`) instead of polling
    /// [`Manager::cluster_states`].
    pub fn watch_fleet(&self) -> tokio::sync::watch::Receiver<crate::fleet::FleetSummary> {
        self.inner.metrics.fleet().subscribe()
    }

    /// Whether [`Manager::run`] has engaged the local cluster and started
    /// the provider (the readiness endpoint reports this).
    pub fn is_started(&self) -> bool {
        self.inner.started.is_cancelled()
    }

    /// Runs until `shutdown` fires: engages the local cluster, starts the
    /// provider and every controller; at shutdown stops taking work and
    /// lets running reconciles finish for up to the shutdown grace period.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), Error> {
        if self.inner.options.raise_open_files_limit {
            match crate::provider::process::raise_open_files_limit() {
                Ok((before, after)) if before != after => {
                    tracing::info!(?before, ?after, "raised the open-files limit");
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "could not raise the open-files limit");
                }
            }
        }
        if let Some(address) = self.inner.options.health_address {
            self.bind_health(address, &shutdown).await?;
        }
        // `stop` ends reconciling (on shutdown, or when the provider fails);
        // `components_stop` ends cluster lifetimes and the provider, only
        // after running reconciles have finished with their clusters.
        let stop = shutdown.child_token();
        let components_stop = CancellationToken::new();
        let coordinator = self.coordinator();
        let coordinator_stop = components_stop.clone();
        let mut coordinator_task =
            tokio::spawn(async move { coordinator.run(coordinator_stop).await });
        self.engage(
            components_stop.child_token(),
            ClusterName::local(),
            self.inner.local.clone(),
        )?;

        let mut tasks = tokio::task::JoinSet::new();
        let grace = self.inner.options.shutdown_grace;
        // Controllers added from now on come through `late` (taken under the
        // same lock, so none is missed or run twice).
        let (start_late, mut late) = tokio::sync::mpsc::unbounded_channel();
        let controllers = {
            let mut controllers = lock(&self.inner.controllers);
            controllers.start = Some(start_late);
            controllers.added.clone()
        };
        for controller in controllers {
            let stop = stop.clone();
            tasks.spawn(async move { controller.run(stop, grace).await });
        }
        let mut provider_task = self.inner.runnable.clone().map(|provider| {
            provider.use_metrics(&self.inner.metrics);
            let aware: Arc<dyn Aware> = Arc::new(self.clone());
            let stop = components_stop.clone();
            tokio::spawn(async move { provider.start(stop, aware).await })
        });
        tokio::spawn(self.clone().watch_health(components_stop.clone()));
        self.inner.started.cancel();

        // A provider that ends on its own (it failed, or gave up) ends the
        // manager: carrying on without a fleet would hide the failure.
        let provider_ended = loop {
            let provider_ends = async {
                match provider_task.as_mut() {
                    Some(task) => task.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => break None,
                result = provider_ends => break Some(result),
                Some(controller) = late.recv() => {
                    let stop = stop.clone();
                    tasks.spawn(async move { controller.run(stop, grace).await });
                }
            }
        };
        lock(&self.inner.controllers).start = None;
        if provider_ended.is_some() {
            tracing::error!("the provider stopped; shutting down");
            stop.cancel();
        }
        // Nothing extends the shutdown past this: reconciles get the grace
        // period, the coordinator and the provider a little more.
        let deadline = tokio::time::Instant::now() + grace + STOP_ALLOWANCE;
        tracing::info!("shutting down: no new reconciles; waiting for running ones");
        let controllers_done = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout_at(deadline, controllers_done)
            .await
            .is_err()
        {
            tracing::warn!("controllers did not stop in time; dropping them");
            tasks.abort_all();
        }
        self.inner.stopping.cancel();
        components_stop.cancel();
        match tokio::time::timeout_at(deadline, &mut coordinator_task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => tracing::error!(error = %err, "the coordinator failed"),
            Ok(Err(err)) => tracing::error!(error = %err, "the coordinator task failed"),
            Err(_) => {
                tracing::warn!("the coordinator did not stop in time; dropping it");
                coordinator_task.abort();
            }
        }
        let provider_result = match (provider_ended, provider_task) {
            (Some(result), _) => result,
            (None, Some(mut task)) => match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!("the provider did not stop in time; dropping it");
                    task.abort();
                    Ok(Ok(()))
                }
            },
            (None, None) => Ok(Ok(())),
        };
        match provider_result {
            Ok(result) => result,
            Err(source) => Err(Error::TaskFailed {
                task: "the provider",
                source,
            }),
        }
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

    /// [`Manager::run`] until SIGTERM or Ctrl-C.
    pub async fn run_until_signal(&self) -> Result<(), Error> {
        let shutdown = CancellationToken::new();
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            trigger.cancel();
        });
        self.run(shutdown).await
    }

    /// Brings an engaged cluster through syncing to ready (or unreachable
    /// and retried), then hands it to the coordinator.
    async fn bring_up(self, name: ClusterName, generation: u64) {
        let options = self.inner.options.clone();
        let mut delay = options.retry_delay;
        loop {
            let Some((cluster, lifetime)) = self.tracked(&name, generation) else {
                return;
            };
            let check = tokio::time::timeout(options.sync_timeout, probe(&cluster));
            let failure = tokio::select! {
                () = lifetime.cancelled() => return,
                result = check => match result {
                    Ok(Ok(())) => None,
                    Ok(Err(err)) => Some(err),
                    Err(_) => Some(Redacted::ours(format!(
                        "no answer within {:?}",
                        options.sync_timeout
                    ))),
                },
            };
            match failure {
                None => {
                    if !self.set_state(&name, generation, ClusterState::Ready) {
                        return;
                    }
                    {
                        let mut tracked = lock(&self.inner.clusters);
                        if let Some(held) = tracked.clusters.current_mut(&name, generation) {
                            held.data.engaged = true;
                        }
                        // A failure recorded before the cluster was engaged
                        // moved nothing since the last walk.
                        tracked.quiet_at = None;
                    }
                    tracing::info!(cluster = %name, "cluster ready");
                    let components = lock(&self.inner.components).clone();
                    if let Err(err) =
                        self.coordinator()
                            .engage(lifetime, name.clone(), cluster, &components)
                    {
                        tracing::error!(cluster = %name, error = %err, "engaging components failed");
                    }
                    return;
                }
                Some(reason) => {
                    tracing::warn!(cluster = %name, %reason, retry_in = ?delay, "cluster unreachable");
                    if !self.set_state(&name, generation, ClusterState::Unreachable(reason)) {
                        return;
                    }
                    tokio::select! {
                        () = lifetime.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(options.max_retry_delay);
                }
            }
        }
    }

    fn tracked(&self, name: &ClusterName, generation: u64) -> Option<(Cluster, CancellationToken)> {
        lock(&self.inner.clusters)
            .clusters
            .current_mut(name, generation)
            .map(|held| (held.cluster.clone(), held.lifetime.clone()))
    }

    fn set_state(&self, name: &ClusterName, generation: u64, state: ClusterState) -> bool {
        let mut tracked = lock(&self.inner.clusters);
        let label = state.label();
        if !tracked.set_state(name, generation, state) {
            return false;
        }
        self.inner.metrics.cluster_state(name, label);
        self.publish_states(&tracked);
        true
    }

    /// Updates the per-state cluster gauge.
    fn publish_states(&self, tracked: &Tracked) {
        self.inner.metrics.cluster_states(tracked.counts);
    }

    /// Brings each engaged cluster's state in line with its health every
    /// [`HEALTH_CHECK_INTERVAL`] until `stop` fires.
    async fn watch_health(self, stop: CancellationToken) {
        let mut ticks = tokio::time::interval(HEALTH_CHECK_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => self.check_health(),
            }
        }
    }

    fn check_health(&self) {
        let options = &self.inner.options;
        let now = tokio::time::Instant::now();
        // Read before the walk: a change during it moves the number again.
        let changes = crate::health::failure_changes();
        let mut guard = lock(&self.inner.clusters);
        let tracked = &mut *guard;
        if tracked.quiet_at == Some(changes) {
            return;
        }
        let mut changed = false;
        let mut quiet = true;
        for (name, held) in tracked
            .clusters
            .iter_mut()
            .filter(|(_, held)| held.data.engaged)
        {
            let progress = &mut held.data;
            let failure = held.cluster.failure();
            quiet &= failure.is_none() && progress.state == ClusterState::Ready;
            let state = match failure {
                Some(failure) if now.duration_since(failure.since) >= options.unhealthy_after => {
                    ClusterState::from(failure.health())
                }
                // Too young to tell a lasting failure from a passing one.
                Some(_) => continue,
                None => ClusterState::Ready,
            };
            if state == ClusterState::Ready {
                progress.next_probe = None;
            } else {
                let (due, delay) = *progress
                    .next_probe
                    .get_or_insert((now, options.retry_delay));
                if due <= now {
                    // Something that asks, so that a server that comes back is
                    // seen even when nothing else talks to it.
                    let cluster = held.cluster.clone();
                    let timeout = options.sync_timeout;
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(timeout, probe_server(&cluster)).await;
                    });
                    progress.next_probe =
                        Some((now + delay, (delay * 2).min(options.max_retry_delay)));
                }
            }
            if progress.state == state {
                continue;
            }
            match &state {
                ClusterState::Ready => tracing::info!(cluster = %name, "cluster works again"),
                ClusterState::Degraded(reason) | ClusterState::Unreachable(reason) => {
                    tracing::warn!(cluster = %name, state = state.label(), %reason, "cluster is not healthy");
                }
                ClusterState::Syncing | ClusterState::Unusable(_) => {}
            }
            self.inner.metrics.cluster_state(name, state.label());
            tracked.counts[progress.state.index()] -= 1;
            tracked.counts[state.index()] += 1;
            progress.state = state;
            changed = true;
        }
        if changed {
            self.publish_states(tracked);
        }
        tracked.quiet_at = quiet.then_some(changes);
    }
}

impl Aware for Manager {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
    ) -> Result<(), Error> {
        let (ended, generation) = {
            let mut tracked = lock(&self.inner.clusters);
            if tracked.clusters.arrival(&name, &cluster, &lifetime) != Arrival::New {
                return Ok(());
            }
            let progress = Progress {
                state: ClusterState::Syncing,
                engaged: false,
                next_probe: None,
            };
            // A replaced instance's lifetime ends here, so its components
            // let go even if the provider forgot to end it.
            let (held, replaced) =
                tracked
                    .clusters
                    .insert(name.clone(), cluster, &lifetime, progress);
            let engagement = (held.lifetime.clone(), held.generation);
            match replaced {
                Some(old) => tracked.count(&old.data.state, -1),
                None => self.inner.metrics.cluster_engaged(),
            }
            tracked.count(&ClusterState::Syncing, 1);
            self.inner.metrics.cluster_state(&name, "syncing");
            self.publish_states(&tracked);
            engagement
        };
        tokio::spawn(self.clone().bring_up(name.clone(), generation));
        let this = self.clone();
        when_ended(&ended, move || {
            let mut tracked = lock(&this.inner.clusters);
            if let Some(gone) = tracked.clusters.end(&name, generation) {
                tracked.count(&gone.data.state, -1);
                this.inner.metrics.cluster_gone(&name);
                this.publish_states(&tracked);
                if this.inner.stopping.is_cancelled() {
                    tracing::debug!(cluster = %name, "cluster released: the manager stops");
                } else {
                    this.inner.metrics.cluster_disengaged();
                    tracing::info!(cluster = %name, "cluster left the fleet");
                }
            }
        });
        Ok(())
    }
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("clusters", &self.cluster_states())
            .finish_non_exhaustive()
    }
}

/// Whether the cluster answers and its cache has synced.
async fn probe(cluster: &Cluster) -> Result<(), Redacted> {
    probe_server(cluster).await?;
    match cluster
        .cache()
        .wait_for_sync(Duration::from_secs(3600))
        .await
    {
        Err(Error::NotReady { reason, .. }) => Err(reason),
        Err(other) => Err(Redacted::error(&other)),
        Ok(()) => Ok(()),
    }
}

/// Whether the cluster's API server answers `/version`; the reason is
/// redacted (a failed credential plugin's settings never show). A server
/// that cannot be reached is named, as the cluster's request record names
/// it (clients built from kubeconfigs).
async fn probe_server(cluster: &Cluster) -> Result<(), Redacted> {
    let request = http::Request::get("/version")
        .body(Vec::new())
        .map_err(|err| Redacted::ours(format!("building the request: {err}")))?;
    cluster
        .client()
        .request_text(request)
        .await
        .map(|_| ())
        .map_err(|err| {
            cluster
                .failure()
                .filter(|failure| failure.unreachable)
                .map_or_else(|| Redacted::kube(&err), |failure| failure.reason)
        })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let Ok(mut terminate) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
