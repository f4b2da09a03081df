//! Helpers for testing controllers and providers across several clusters
//! in tests of your own: a recorder of reconciles, a controller
//! that records, waits on what the process tells ([`wait_for_fleet`],
//! [`wait_on`], [`Recorder::wait_until`]) and, for state that lives
//! elsewhere, polling with a deadline ([`eventually`], which asks where).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cache::CachedResource;
use crate::controller::{Action, Controller, Request, Watch};
use crate::error::Error;
use multicluster_core::ClusterName;

/// How long [`eventually`] waits by default.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// The smallest runnable provider: a cluster set the test fills and
/// empties by hand ([`Clusters::add`](crate::provider::clusters::Clusters::add),
/// [`remove`](crate::provider::clusters::Clusters::remove)).
#[derive(Clone, Debug, Default)]
pub struct TestProvider {
    /// The clusters this provider engages.
    pub clusters: crate::provider::clusters::Clusters,
}

impl crate::provider::clusters::ClusterSetProvider for TestProvider {
    fn cluster_set(&self) -> &crate::provider::clusters::Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl crate::multicluster::RunnableProvider for TestProvider {
    async fn start(
        &self,
        context: crate::multicluster::ProviderContext,
    ) -> Result<crate::multicluster::InventoryEngaged, Error> {
        // The clusters are added by the test, before or after the start:
        // the inventory is what the set holds when it starts.
        let engaged = self.clusters.start(&context)?;
        context.shutdown.cancelled().await;
        Ok(engaged)
    }
}

/// An [`Aware`](crate::multicluster::Aware) that notes the name of every
/// cluster engaged with it, for tests of a provider started on its own
/// ([`RunnableProvider::start`](crate::multicluster::RunnableProvider::start)
/// with a context of their own).
#[derive(Debug, Default)]
pub struct EngagedNames {
    names: Mutex<Vec<ClusterName>>,
}

impl EngagedNames {
    /// The names engaged so far, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        let mut names = multicluster_core::lock(&self.names).clone();
        names.sort();
        names
    }
}

impl crate::multicluster::Aware for EngagedNames {
    fn engage(
        &self,
        _lifetime: tokio_util::sync::CancellationToken,
        name: ClusterName,
        _cluster: crate::cluster::Cluster,
    ) -> Result<(), Error> {
        multicluster_core::lock(&self.names).push(name);
        Ok(())
    }
}

/// A provider started on its own by [`engaged_when_inventory_is`].
#[derive(Debug)]
pub struct StartedProvider {
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl StartedProvider {
    /// Stops the provider and returns how its start ended.
    pub async fn stop(self) -> Result<(), Error> {
        self.shutdown.cancel();
        self.task.await.unwrap_or_else(|err| {
            Err(Error::TaskFailed {
                task: "the provider",
                source: err,
            })
        })
    }
}

/// Starts `provider` on its own, engaging with an [`EngagedNames`], and
/// waits (at most [`DEFAULT_DEADLINE`]) until it says the inventory it
/// first found is engaged
/// ([`ProviderContext::inventory_engaged`](crate::multicluster::ProviderContext::inventory_engaged)):
/// the names engaged by then, sorted, and the running provider. Panics if
/// it never says so.
pub async fn engaged_when_inventory_is<P>(provider: Arc<P>) -> (Vec<ClusterName>, StartedProvider)
where
    P: crate::multicluster::RunnableProvider + 'static,
{
    let engaged = Arc::new(EngagedNames::default());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let context = crate::multicluster::ProviderContext::new(
        shutdown.clone(),
        engaged.clone(),
        crate::metrics::Metrics::default(),
    );
    let task = tokio::spawn({
        let context = context.clone();
        async move { provider.start(context).await.map(drop) }
    });
    let said = tokio::time::timeout(DEFAULT_DEADLINE, context.when_inventory_engaged()).await;
    assert!(
        said.is_ok(),
        "the provider did not say its inventory was engaged within {DEFAULT_DEADLINE:?}"
    );
    (engaged.names(), StartedProvider { shutdown, task })
}

/// A change counter for state a test keeps itself (what its reconciler
/// saw, what its log layer caught): whoever changes that state calls
/// [`Changes::tell`] after each change, and the test waits with
/// [`Changes::wait_until`] rather than polling it.
#[derive(Clone, Debug)]
pub struct Changes(Arc<tokio::sync::watch::Sender<u64>>);

impl Default for Changes {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl Changes {
    /// Tells every waiter that the state changed.
    pub fn tell(&self) {
        self.0.send_modify(|count| *count = count.wrapping_add(1));
    }

    /// Waits until `that` holds, looking again after each
    /// [`Changes::tell`]; panics naming `what` after [`DEFAULT_DEADLINE`].
    pub async fn wait_until(&self, what: &str, that: impl FnMut() -> bool) {
        self.wait_until_within(DEFAULT_DEADLINE, what, that).await;
    }

    /// Like [`Changes::wait_until`] with a deadline of `within`, for
    /// behaviour that promises a bound.
    pub async fn wait_until_within(
        &self,
        within: Duration,
        what: &str,
        mut that: impl FnMut() -> bool,
    ) {
        let mut changes = self.0.subscribe();
        match tokio::time::timeout(within, changes.wait_for(|_| that())).await {
            Ok(Ok(_)) => {}
            // The sender lives as long as `self`.
            Ok(Err(_)) => unreachable!("the counter outlives its own wait"),
            Err(_) => panic!("timed out after {within:?} waiting for {what}"),
        }
    }
}

/// Every reconcile a recording controller saw, in order, with the time;
/// a test waits on it with [`Recorder::wait_until`].
#[derive(Clone, Default)]
pub struct Recorder {
    seen: Arc<Mutex<Vec<(Request, Instant)>>>,
    recorded: Changes,
}

impl Recorder {
    fn seen(&self) -> std::sync::MutexGuard<'_, Vec<(Request, Instant)>> {
        multicluster_core::lock(&self.seen)
    }

    /// Notes a reconcile of `request` now.
    pub fn record(&self, request: &Request) {
        self.seen().push((request.clone(), Instant::now()));
        self.recorded.tell();
    }

    /// How often `request` was reconciled.
    pub fn count(&self, request: &Request) -> usize {
        self.seen().iter().filter(|(r, _)| r == request).count()
    }

    /// When `request` was reconciled.
    pub fn times(&self, request: &Request) -> Vec<Instant> {
        self.seen()
            .iter()
            .filter(|(r, _)| r == request)
            .map(|(_, t)| *t)
            .collect()
    }

    /// Reconciles of any object in `cluster`.
    pub fn for_cluster(&self, cluster: &str) -> usize {
        self.seen()
            .iter()
            .filter(|(r, _)| r.cluster.as_str() == cluster)
            .count()
    }

    /// Names of the clusters seen, sorted and without repeats.
    pub fn clusters(&self) -> Vec<ClusterName> {
        let mut names: Vec<_> = self.seen().iter().map(|(r, _)| r.cluster.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// All reconciles so far.
    pub fn total(&self) -> usize {
        self.seen().len()
    }

    /// Waits until `request` has been reconciled more than `before` times;
    /// panics after [`DEFAULT_DEADLINE`].
    pub async fn wait_for_more(&self, request: &Request, before: usize) {
        self.wait_until(&format!("a reconcile of {request}"), |recorder| {
            recorder.count(request) > before
        })
        .await;
    }

    /// Waits until what was recorded satisfies `that`, looking again at
    /// each new recording (no clock); panics naming `what` after
    /// [`DEFAULT_DEADLINE`].
    pub async fn wait_until(&self, what: &str, that: impl FnMut(&Recorder) -> bool) {
        self.wait_until_within(DEFAULT_DEADLINE, what, that).await;
    }

    /// Like [`Recorder::wait_until`] with a deadline of `within`, for
    /// behaviour that promises a bound.
    pub async fn wait_until_within(
        &self,
        within: Duration,
        what: &str,
        mut that: impl FnMut(&Recorder) -> bool,
    ) {
        self.recorded
            .wait_until_within(within, what, || that(self))
            .await;
    }
}

/// A controller for `K` over `watch` that records every reconcile and does
/// nothing else.
pub fn recording_controller<K: CachedResource>(
    name: &str,
    watch: Watch<K>,
    recorder: &Recorder,
) -> Result<Controller, Error> {
    #[derive(Debug, thiserror::Error)]
    #[error("unreachable")]
    struct Never;
    let recorder = recorder.clone();
    Controller::builder(name)
        .for_resource(watch)
        .max_concurrent_reconciles(4)
        .build(move |request, _cluster| {
            let recorder = recorder.clone();
            async move {
                recorder.record(&request);
                Ok::<_, Never>(Action::await_change())
            }
        })
}

/// A manager over `provider`'s fleet (and `local`) with one controller,
/// named `recorder`, that records every ConfigMap reconcile in the returned
/// [`Recorder`].
pub fn recording_manager<P: crate::multicluster::RunnableProvider + 'static>(
    local: crate::cluster::Cluster,
    provider: Arc<P>,
    options: crate::manager::ManagerOptions,
) -> (crate::manager::Manager, Recorder) {
    recording_manager_from(
        crate::manager::Manager::builder(local)
            .provider(provider)
            .options(options),
    )
}

/// Like [`recording_manager`], for a manager built by `builder` (with a
/// coordinator, metrics, ...).
pub fn recording_manager_from(
    builder: crate::manager::ManagerBuilder,
) -> (crate::manager::Manager, Recorder) {
    let manager = builder.build();
    let recorder = Recorder::default();
    let controller = recording_controller(
        "recorder",
        Watch::<k8s_openapi::api::core::v1::ConfigMap>::new(),
        &recorder,
    )
    .unwrap_or_else(|err| panic!("building the recording controller: {err}"));
    manager
        .add_controller(controller)
        .unwrap_or_else(|err| panic!("adding the recording controller: {err}"));
    (manager, recorder)
}

/// Where the state a test waits for lives, when nothing in the test's
/// process tells of its changes: the reason [`eventually`] polls it
/// rather than waiting on a signal. State the process does tell of is
/// waited on instead: the fleet with [`wait_for_fleet`] and
/// [`wait_for_state`], reconciles with [`Recorder::wait_until`], anything
/// behind a `watch` with [`wait_on`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Polled {
    /// On an API server: objects and their status written by a controller
    /// or by the API server's own controllers, RBAC taking effect, a
    /// Lease, Events, a webhook registration. The test does not watch
    /// them, and a watch would only move the polling into the test.
    ApiServer,
    /// In another process: an example binary (its HTTP endpoints or its
    /// output), a credential plugin or CLI stand-in (the calls it writes
    /// down), the API server's audit log.
    OtherProcess,
    /// In the kernel: the sockets open to a port.
    Kernel,
    /// In this process, but told of nowhere: a metric in the registry,
    /// what a client sends or a server answers over the network. The call
    /// says in a comment why no signal fits.
    Unsignalled,
}

/// Polls `check` every 50 ms until it holds, for state that lives where
/// `polled` says; panics naming `what` after [`DEFAULT_DEADLINE`].
pub async fn eventually<F, Fut>(polled: Polled, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(DEFAULT_DEADLINE, polled, what, check).await;
}

/// Waits until the value `receiver` follows satisfies `that` (up to the
/// default deadline of [`eventually`]), for state the process tells
/// through a `watch`: nothing is polled, and the wait ends the moment it
/// holds.
pub async fn wait_on<T>(
    what: &str,
    receiver: &mut tokio::sync::watch::Receiver<T>,
    that: impl FnMut(&T) -> bool,
) {
    match tokio::time::timeout(DEFAULT_DEADLINE, receiver.wait_for(that)).await {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => panic!("{what}: nothing tells of it any more"),
        Err(_) => panic!("timed out after {DEFAULT_DEADLINE:?} waiting for {what}"),
    }
}

/// Like [`eventually`] with a deadline of `within`, for behaviour that
/// promises a bound (a cluster engaged within seconds of an outage's end).
pub async fn eventually_within<F, Fut>(within: Duration, polled: Polled, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_until_some(within, polled, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
}

/// Like [`eventually`] for a check that finds something (the error a
/// request finally gets): polls until `find` returns `Some`, and returns
/// what it found.
pub async fn eventually_some<T, F, Fut>(polled: Polled, what: &str, find: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_until_some(DEFAULT_DEADLINE, polled, what, find).await
}

async fn poll_until_some<T, F, Fut>(within: Duration, polled: Polled, what: &str, mut find: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let looked = poll_within(within, polled, || {
        let found = find();
        async move { found.await.ok_or_else(String::new) }
    })
    .await;
    looked.unwrap_or_else(|_| {
        panic!("timed out after {within:?} waiting for {what} ({polled:?}, polled)")
    })
}

/// Polls `look` every 50 ms until it returns `Ok` (at most `within`), for
/// state that lives where `polled` says; at the deadline, the last look's
/// `Err` (what was seen instead), for a caller that reports it or goes on.
pub async fn poll_within<T, F, Fut>(within: Duration, polled: Polled, look: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll_every(Duration::from_millis(50), within, polled, look).await
}

/// Like [`poll_within`], looking every `every`: for a look that costs
/// (files other processes write, read while a benchmark runs).
pub async fn poll_every<T, F, Fut>(
    every: Duration,
    within: Duration,
    polled: Polled,
    mut look: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        let seen = match look().await {
            Ok(found) => return Ok(found),
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            return Err(format!("{seen} (after {within:?}, {polled:?}, polled)"));
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits until the object `name` of `api` satisfies `that` (`None`: it
/// does not exist), watching it (kube-runtime's `await_condition`: a
/// watch of the one object, retried with backoff while its server does
/// not answer), up to [`DEFAULT_DEADLINE`]; returns the object as it then
/// was. Panics naming `what` at the deadline.
pub async fn wait_for_object<K>(
    api: &kube::Api<K>,
    name: &str,
    what: &str,
    that: impl Fn(Option<&K>) -> bool,
) -> Option<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let waited = tokio::time::timeout(
        DEFAULT_DEADLINE,
        kube::runtime::wait::await_condition(api.clone(), name, that),
    )
    .await;
    match waited {
        Ok(Ok(object)) => object,
        Ok(Err(err)) => panic!("waiting for {what}: {err}"),
        Err(_) => panic!("timed out after {DEFAULT_DEADLINE:?} waiting for {what} (watched)"),
    }
}

/// Asserts that the object `name` of `api` satisfies `that` (`None`: it
/// does not exist) now and at every change for `duration`, watching it:
/// a change that breaks it fails at once, even one undone before a poll
/// would have looked.
pub async fn object_holds_throughout<K>(
    api: &kube::Api<K>,
    name: &str,
    duration: Duration,
    what: &str,
    that: impl Fn(Option<&K>) -> bool,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher::watcher(api.clone(), config));
    // The object as the watch last told it, from its first list on; a
    // relist's answer replaces it once complete.
    let mut current: Option<K> = None;
    let mut listed: Option<K> = None;
    let watched = tokio::time::timeout(duration, async {
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => {
                    listed = None;
                    continue;
                }
                Ok(Event::InitApply(object)) => {
                    listed = Some(object);
                    continue;
                }
                Ok(Event::InitDone) => current = listed.take(),
                Ok(Event::Apply(object)) => current = Some(object),
                Ok(Event::Delete(_)) => current = None,
                // The watch starts again by itself: only what it tells
                // counts.
                Err(_) => continue,
            }
            assert!(that(current.as_ref()), "{what}: broken by {current:?}");
        }
    })
    .await;
    assert!(watched.is_err(), "{what}: the watch ended");
}

/// Asserts that the value `receiver` follows satisfies `that` now and at
/// every change for `duration`: a change that breaks it fails at once.
pub async fn holds_throughout<T: std::fmt::Debug>(
    what: &str,
    receiver: &mut tokio::sync::watch::Receiver<T>,
    duration: Duration,
    mut that: impl FnMut(&T) -> bool,
) {
    let broken = tokio::time::timeout(duration, receiver.wait_for(|value| !that(value))).await;
    match broken {
        Err(_) => {}
        Ok(Ok(value)) => panic!("{what}: broken by {:?}", *value),
        Ok(Err(_)) => panic!("{what}: nothing tells of it any more"),
    }
}

/// A cluster whose client points at a loopback port where nothing listens:
/// for tests that need a `Cluster` but no API server. Needs a tokio runtime.
pub fn offline_cluster(name: &str) -> crate::cluster::Cluster {
    // Port 1 is privileged and unused on test machines.
    let config = kube::Config::new(http::Uri::from_static("https://127.0.0.1:1"));
    let client = kube::Client::try_from(config)
        .unwrap_or_else(|err| panic!("building an offline client: {err}"));
    crate::cluster::Cluster::new(name, client)
}

/// Waits until `check` holds, looking again at every change of
/// `manager`'s fleet ([`Manager::watch_fleet`](crate::manager::Manager::watch_fleet):
/// any cluster's state or reason, unusable inventory, duplicates), not on
/// a clock; panics naming `what` after [`DEFAULT_DEADLINE`].
pub async fn wait_for_fleet(
    manager: &crate::manager::Manager,
    what: &str,
    check: impl FnMut() -> bool,
) {
    wait_for_fleet_within(manager, DEFAULT_DEADLINE, what, check).await;
}

/// Like [`wait_for_fleet`] with a deadline of `within`, for behaviour that
/// promises a bound.
pub async fn wait_for_fleet_within(
    manager: &crate::manager::Manager,
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
) {
    let mut changes = manager.watch_fleet();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        changes.borrow_and_update();
        if check() {
            return;
        }
        let changed = tokio::time::timeout_at(deadline, changes.changed()).await;
        assert!(
            matches!(changed, Ok(Ok(()))),
            "timed out after {within:?} waiting for {what}"
        );
    }
}

/// Like [`wait_for_fleet`] for a check that awaits (a provider's `get`,
/// a cluster's cache).
pub async fn wait_for_fleet_async<F, Fut>(
    manager: &crate::manager::Manager,
    what: &str,
    mut check: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut changes = manager.watch_fleet();
    let deadline = tokio::time::Instant::now() + DEFAULT_DEADLINE;
    loop {
        changes.borrow_and_update();
        if check().await {
            return;
        }
        let changed = tokio::time::timeout_at(deadline, changes.changed()).await;
        assert!(
            matches!(changed, Ok(Ok(()))),
            "timed out after {DEFAULT_DEADLINE:?} waiting for {what}"
        );
    }
}

/// Waits at most `within` for `cluster`'s state to be one `wanted` accepts
/// (`None`: not in the fleet), looking again at every change of the fleet,
/// and returns it; panics naming every state it went through meanwhile.
pub async fn wait_for_state(
    manager: &crate::manager::Manager,
    cluster: &str,
    within: Duration,
    wanted: impl Fn(Option<&multicluster_core::ClusterState>) -> bool,
) -> Option<multicluster_core::ClusterState> {
    let name = ClusterName::from(cluster);
    let mut changes = manager.watch_fleet();
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        changes.borrow_and_update();
        let state = manager.cluster_state(&name);
        if wanted(state.as_ref()) {
            return state;
        }
        if seen.last() != Some(&state) {
            seen.push(state);
        }
        let changed = tokio::time::timeout_at(deadline, changes.changed()).await;
        assert!(
            matches!(changed, Ok(Ok(()))),
            "{cluster} did not reach the state waited for within {within:?}; its states: {seen:?}"
        );
    }
}

/// Waits until `manager` reports `cluster` unreachable (engaged, but its
/// caches cannot sync).
pub async fn wait_until_unreachable(manager: &crate::manager::Manager, cluster: &str) {
    wait_for_state(manager, cluster, DEFAULT_DEADLINE, |state| {
        matches!(state, Some(multicluster_core::ClusterState::Unreachable(_)))
    })
    .await;
}

/// Serves `manager`'s health endpoints (`/clusters` among them) on a free
/// loopback port until `stop`, and returns the address.
#[cfg(feature = "health")]
pub async fn serve_health(
    manager: &crate::manager::Manager,
    stop: tokio_util::sync::CancellationToken,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("its address");
    manager.serve_health(listener, stop);
    address
}

/// Waits until `manager` shows every cluster of `names` unusable (found by
/// its provider, but not made a cluster), and returns their reasons,
/// having checked that `/clusters` at `address` (the manager's health
/// endpoint) shows the same.
pub async fn wait_until_unusable(
    manager: &crate::manager::Manager,
    address: std::net::SocketAddr,
    names: &[ClusterName],
) -> std::collections::BTreeMap<ClusterName, String> {
    use multicluster_core::ClusterState;
    let reasons = || {
        names
            .iter()
            .filter_map(|name| match manager.cluster_state(name) {
                Some(ClusterState::Unusable(reason)) => {
                    Some((name.clone(), reason.as_str().to_string()))
                }
                _ => None,
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    wait_for_fleet(manager, "every cluster named to be shown unusable", || {
        reasons().len() == names.len()
    })
    .await;
    let reasons = reasons();
    let (_, clusters) = http_get(address, "/clusters").await.expect("/clusters");
    for (name, reason) in &reasons {
        assert!(
            clusters
                .lines()
                .any(|line| line.starts_with(&format!("{name}\tunusable: {reason}\t"))),
            "{name} on /clusters:\n{clusters}"
        );
    }
    reasons
}

/// Waits until `manager` reports `cluster` ready. A reconcile in a cluster
/// is no sign that it is: its controllers' watches deliver as they list,
/// and the cluster turns ready once all of them have.
pub async fn wait_until_ready(manager: &crate::manager::Manager, cluster: &str) {
    wait_for_state(manager, cluster, DEFAULT_DEADLINE, |state| {
        state == Some(&multicluster_core::ClusterState::Ready)
    })
    .await;
}

/// Waits until `manager` no longer has `cluster` (it left the fleet).
pub async fn wait_until_left(manager: &crate::manager::Manager, cluster: &str) {
    wait_for_state(manager, cluster, DEFAULT_DEADLINE, |state| state.is_none()).await;
}

/// Runs `manager` in the background until the returned token is cancelled.
pub fn run_manager(
    manager: &crate::manager::Manager,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), Error>>,
) {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    let manager = manager.clone();
    let task = tokio::spawn(async move { manager.run(stop).await });
    (shutdown, task)
}

/// This process's resident memory in MiB (Linux; NaN elsewhere), for
/// benchmarks that report memory per cluster.
pub fn resident_memory_mib() -> f64 {
    resident_memory_mib_of("self")
}

/// The resident memory in MiB of `process` (a PID, or `self`), as
/// [`resident_memory_mib`].
pub fn resident_memory_mib_of(process: impl std::fmt::Display) -> f64 {
    std::fs::read_to_string(format!("/proc/{process}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The CPU time this process has used so far, all threads, in seconds, to
/// the nanosecond (`CLOCK_PROCESS_CPUTIME_ID`): fine enough for the idle
/// figures of a fleet, a few hundredths of a second, which
/// [`cpu_seconds_of`]'s clock ticks only round.
pub fn process_cpu_seconds() -> f64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

/// The CPU time `process` (a PID, or `self`) has used so far, all threads,
/// in seconds (Linux: `utime` + `stime` from `/proc/<process>/stat`, in the
/// kernel's USER_HZ of 100 ticks a second; 0 elsewhere).
pub fn cpu_seconds_of(process: impl std::fmt::Display) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{process}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    (ticks(11) + ticks(12)) / 100.0
}

/// How many TCP connections this process holds to `port` on any address
/// (Linux: read from `/proc`; 0 elsewhere). Tells how many connections
/// clients keep to an API server.
pub fn connections_to(port: u16) -> usize {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mine: std::collections::HashSet<String> = fds
        .filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    // remote address "ADDR:PORT" in hex, state 01 = established.
                    let remote_port = fields.get(2)?.rsplit(':').next()?;
                    let remote_port = u16::from_str_radix(remote_port, 16).ok()?;
                    let inode = fields.get(9)?;
                    (remote_port == port && fields.get(3) == Some(&"01")).then(|| inode.to_string())
                })
                .collect::<Vec<_>>()
        })
        .filter(|inode| mine.contains(inode))
        .count()
}

/// Fetches `path` from the manager's health endpoint at `address` (see
/// [`crate::ManagerOptions::health_address`]): the status line and the body.
pub async fn http_get(
    address: std::net::SocketAddr,
    path: &str,
) -> std::io::Result<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, body.to_string()))
}

/// Raises this process's soft limit on open files to its hard limit (what
/// the manager does when it starts, by default), for benches that open
/// many connections without a manager. Returns the soft limit before and
/// after.
pub fn raise_open_files_limit() -> std::io::Result<(Option<u64>, Option<u64>)> {
    crate::open_files::raise_open_files_limit()
}
