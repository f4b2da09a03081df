//! Multi-cluster controllers.
//!
//! A controller watches a primary resource (and optionally owned and other
//! resources) in every engaged cluster its sources select, turns events into
//! [`Request`]s — (cluster, namespace, name) — and runs a reconciler for each
//! with a handle to that cluster.
//!
//! Guarantees, per controller:
//!
//! - each cluster has slots of its own: at most `max_concurrent_reconciles`
//!   reconciles of one cluster at once (default 1, controller-runtime's
//!   default, per cluster), and never two of one request. A cluster's
//!   requests wait only for that cluster's slots, so members whose
//!   reconciles hang, one or most of the fleet, never hold up a healthy
//!   member's. No limit across clusters applies unless
//!   `max_concurrent_reconciles_total` sets one (controller-runtime's
//!   strict "one at a time" is a total of 1), and hung clusters can then
//!   hold every slot of it;
//! - a reconcile that runs past `reconcile_timeout` (5 minutes by default) is
//!   cancelled, counted with the result `timeout`, and backed off;
//! - duplicate requests collapse, and a request that arrives while it is being
//!   reconciled runs once more afterwards;
//! - errors back off per request, exponentially ([`Backoff`]);
//!   [`Action::requeue`] is honoured;
//! - clusters are served in turn, so a busy cluster cannot starve a quiet one;
//! - when a cluster is disengaged its sources stop, its queued requests are
//!   dropped and no new reconcile starts for it;
//! - a slow or unreachable cluster holds only its own requests: watches and
//!   backoffs are per cluster, and nothing waits for every cluster to sync.

pub mod map;
mod queue;
mod source;
mod work;

use crate::engagements::{Arrival, Engagements, when_ended};
use crate::sync::lock;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject};
use tokio_util::sync::CancellationToken;

pub use queue::Backoff;
pub use source::{Clusters, Filter, MapContext, filters};
pub use work::{Terminal, WorkQueue, WorkQueueBuilder};

use crate::cache::CachedResource;
use crate::metrics::Metrics;
use crate::{Aware, Cluster, ClusterName, Error};
use source::{InformerSource, Source, in_same_cluster};

/// What to reconcile: an object in a cluster.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    /// The cluster ([`ClusterName::local`] for the local cluster).
    pub cluster: ClusterName,
    /// The object's namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl Request {
    /// A request for `namespace/name` in `cluster`.
    pub fn new(
        cluster: impl Into<ClusterName>,
        namespace: Option<&str>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}/{}", self.cluster, ns, self.name),
            None => write!(f, "{}/{}", self.cluster, self.name),
        }
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What to do after a successful reconcile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile again after `after`, even without a change.
    pub fn requeue(after: Duration) -> Self {
        Self {
            requeue_after: Some(after),
        }
    }

    /// Reconcile again only when something changes.
    pub fn await_change() -> Self {
        Self::default()
    }

    /// The requeue delay, if any.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// How long a reconcile may run by default before it is cancelled.
pub const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(300);

/// The error type reconcilers return, boxed.
pub type ReconcileError = Box<dyn std::error::Error + Send + Sync>;

type Reconciler = Arc<
    dyn Fn(Request, Cluster) -> BoxFuture<'static, Result<Action, ReconcileError>> + Send + Sync,
>;

/// Which clusters and events a watch covers; used with the builder's
/// `for_resource`, `owns` and `watches`.
pub struct Watch<K> {
    clusters: Clusters,
    filters: Vec<Filter<K>>,
}

impl<K> Default for Watch<K> {
    fn default() -> Self {
        Self {
            clusters: Clusters::Fleet,
            filters: Vec::new(),
        }
    }
}

impl<K> Watch<K> {
    /// The fleet, every event.
    pub fn new() -> Self {
        Self::default()
    }

    /// Watch these clusters instead of the fleet.
    #[must_use]
    pub fn clusters(mut self, clusters: Clusters) -> Self {
        self.clusters = clusters;
        self
    }

    fn into_parts(self) -> (Clusters, Vec<Filter<K>>) {
        (self.clusters, self.filters)
    }

    /// Only events passing `filter` (all filters must pass).
    #[must_use]
    pub fn filter(mut self, filter: Filter<K>) -> Self {
        self.filters.push(filter);
        self
    }

    /// Only events for which `passes` holds: [`Watch::filter`] with a
    /// closure, whose argument type is then known.
    #[must_use]
    pub fn filter_by(
        self,
        passes: impl Fn(&crate::cache::CacheEvent<K>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.filter(Arc::new(passes))
    }
}

type OwnedSource = Box<dyn FnOnce(&(String, String)) -> Arc<dyn Source> + Send>;

/// Builds a [`Controller`].
pub struct ControllerBuilder {
    name: String,
    primary: Option<(String, String)>,
    sources: Vec<Arc<dyn Source>>,
    /// Owned-type sources wait for the primary's (apiVersion, kind).
    owned: Vec<OwnedSource>,
    max_concurrent_reconciles: usize,
    max_concurrent_reconciles_total: Option<usize>,
    reconcile_timeout: Option<Duration>,
    backoff: Backoff,
    metrics: Option<Metrics>,
    owed: Option<Owed>,
    error_policy: Option<ErrorPolicyFn>,
}

type ErrorPolicyFn = work::PolicyFn;

/// What a cluster is owed when it is engaged.
type Owed = Arc<dyn Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync>;

impl ControllerBuilder {
    /// Reconcile objects of `K`: each event of a `K` requests its own
    /// reconcile.
    #[must_use]
    pub fn for_resource<K: CachedResource>(mut self, watch: Watch<K>) -> Self {
        self.primary = Some((K::api_version(&()).into_owned(), K::kind(&()).into_owned()));
        self.sources.push(Arc::new(InformerSource::typed(
            watch,
            in_same_cluster(Arc::new(|obj: &K| {
                vec![(
                    obj.meta().namespace.clone(),
                    obj.meta().name.clone().unwrap_or_default(),
                )]
            })),
        )));
        self
    }

    /// Reconcile the controlling owner (of the primary kind) of every `O` that
    /// changes.
    #[must_use]
    pub fn owns<O: CachedResource>(mut self, watch: Watch<O>) -> Self {
        self.owned.push(Box::new(move |(api_version, kind)| {
            let (api_version, kind) = (api_version.clone(), kind.clone());
            Arc::new(InformerSource::typed(
                watch,
                in_same_cluster(Arc::new(move |obj: &O| {
                    obj.meta()
                        .owner_references
                        .iter()
                        .flatten()
                        .filter(|owner| {
                            owner.controller == Some(true)
                                && owner.kind == kind
                                && owner.api_version == api_version
                        })
                        .map(|owner| (obj.meta().namespace.clone(), owner.name.clone()))
                        .collect()
                })),
            )) as Arc<dyn Source>
        }));
        self
    }

    /// Reconcile whatever `mapper` maps each changed `W` to (in the same
    /// cluster).
    #[must_use]
    pub fn watches<W: CachedResource>(
        mut self,
        watch: Watch<W>,
        mapper: impl Fn(&W) -> Vec<(Option<String>, String)> + Send + Sync + 'static,
    ) -> Self {
        self.sources.push(Arc::new(InformerSource::typed(
            watch,
            in_same_cluster(Arc::new(mapper)),
        )));
        self
    }

    /// Reconcile whatever requests `mapper` returns for each changed `W`,
    /// in any cluster: the form for controllers that work across clusters,
    /// such as propagating a hub object to every member
    /// ([`map::to_every_member`]) or reporting a member object's change to
    /// its owner on the hub ([`map::to_owner`]). The [`MapContext`] names
    /// the cluster the event came from and the clusters engaged now;
    /// requests for clusters that are not engaged are dropped (see
    /// [`ControllerBuilder::owed_on_engage`] for those that join later).
    #[must_use]
    pub fn watches_across<W: CachedResource>(
        mut self,
        watch: Watch<W>,
        mapper: impl Fn(&MapContext<'_>, &W) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self {
        self.sources
            .push(Arc::new(InformerSource::typed(watch, Arc::new(mapper))));
        self
    }

    /// When a cluster is engaged, queue the requests `owed` returns for it,
    /// so a cluster that joins late converges without waiting for an event
    /// elsewhere (for example every hub object for a new member:
    /// [`map::local_objects`]). `owed` gets the new cluster's name and the
    /// controller (to read other clusters' caches); it must not block.
    #[must_use]
    pub fn owed_on_engage(
        mut self,
        owed: impl Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self {
        self.owed = Some(Arc::new(owed));
        self
    }

    /// Like [`ControllerBuilder::watches`] for a resource known at run time.
    #[must_use]
    pub fn watches_dynamic(
        mut self,
        resource: ApiResource,
        watch: Watch<DynamicObject>,
        mapper: impl Fn(&DynamicObject) -> Vec<(Option<String>, String)> + Send + Sync + 'static,
    ) -> Self {
        self.sources.push(Arc::new(InformerSource::dynamic(
            resource,
            watch,
            in_same_cluster(Arc::new(mapper)),
        )));
        self
    }

    /// Reconciles of one cluster running at once (default 1, as
    /// controller-runtime runs one controller's: each cluster has that many
    /// slots of its own). A cluster's requests never wait for another
    /// cluster's slots, so members whose reconciles hang cannot hold up the
    /// rest of the fleet.
    #[must_use]
    pub fn max_concurrent_reconciles(mut self, limit: usize) -> Self {
        self.max_concurrent_reconciles = limit.max(1);
        self
    }

    /// Reconciles running at once across every cluster (default: no limit
    /// beyond each cluster's own slots). `1` gives controller-runtime's
    /// strict one reconcile at a time for the whole controller. A limit
    /// here is shared: clusters whose reconciles hang can hold all of it
    /// until the reconcile deadline frees them, and healthy members wait
    /// meanwhile. Reach for it to cap work on a shared resource (the local
    /// cluster, an external API), not for isolation.
    #[must_use]
    pub fn max_concurrent_reconciles_total(mut self, limit: usize) -> Self {
        self.max_concurrent_reconciles_total = Some(limit.max(1));
        self
    }

    /// How long a reconcile may run (default [`DEFAULT_RECONCILE_TIMEOUT`],
    /// 5 minutes; `None`: as long as it takes). One that runs longer is
    /// cancelled, counted as an error with the result `timeout`, and backed
    /// off like any error.
    ///
    /// Cancelling drops the reconcile's future: it stops at the `.await` it
    /// was waiting on, and whatever it had done until then stays done. A
    /// reconciler must therefore be safe to stop at any `.await` — which it
    /// must be anyway, since the process can stop at any point — and converge
    /// when run again.
    #[must_use]
    pub fn reconcile_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.reconcile_timeout = timeout;
        self
    }

    /// Error backoff (default 5 ms doubling up to 1000 s).
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Record reconcile metrics in `metrics` (the manager passes its own).
    #[must_use]
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Decides what follows a failed reconcile: `Some(action)` replaces
    /// the backoff (`Action::requeue(after)` retries after `after`,
    /// `Action::await_change()` waits for the next event), `None` keeps
    /// the backoff. A [`Terminal`] error is never retried. See
    /// [`WorkQueueBuilder::error_policy`].
    #[must_use]
    pub fn error_policy(
        mut self,
        policy: impl Fn(&Request, &ReconcileError) -> Option<Action> + Send + Sync + 'static,
    ) -> Self {
        self.error_policy = Some(Arc::new(policy));
        self
    }

    /// Builds the controller around `reconcile`, which gets each request,
    /// its cluster and `context` (shared state: clients of other clusters,
    /// settings, a recorder), as kube-runtime's `Controller::run` does.
    pub fn build_with_context<C, F, Fut, E>(
        self,
        context: Arc<C>,
        reconcile: F,
    ) -> Result<Controller, Error>
    where
        C: Send + Sync + 'static,
        F: Fn(Request, Cluster, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Into<ReconcileError> + 'static,
    {
        self.build(move |request, cluster| reconcile(request, cluster, context.clone()))
    }

    /// Builds the controller around `reconcile`. Its error may be any type
    /// that converts into a boxed error (an error type of one's own,
    /// `Box<dyn Error + Send + Sync>`, `anyhow::Error`); wrap it in
    /// [`Terminal`] when retrying cannot help.
    pub fn build<F, Fut, E>(self, reconcile: F) -> Result<Controller, Error>
    where
        F: Fn(Request, Cluster) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Into<ReconcileError> + 'static,
    {
        let mut sources = self.sources;
        if !self.owned.is_empty() {
            let primary = self.primary.as_ref().ok_or_else(|| Error::InvalidOptions {
                component: format!("controller {}", self.name),
                reason: "owns() needs for_resource() to name the owner kind".to_string(),
            })?;
            sources.extend(self.owned.into_iter().map(|make| make(primary)));
        }
        if sources.is_empty() {
            return Err(Error::InvalidOptions {
                component: format!("controller {}", self.name),
                reason: "it watches nothing".to_string(),
            });
        }
        let reconcile = Arc::new(reconcile);
        let reconciler: Reconciler = Arc::new(move |request, cluster| {
            let reconcile = reconcile.clone();
            async move { reconcile(request, cluster).await.map_err(Into::into) }.boxed()
        });
        let mut work = WorkQueue::builder(self.name.clone())
            .backoff(self.backoff)
            .timeout(self.reconcile_timeout);
        if let Some(metrics) = self.metrics {
            work = work.metrics(metrics);
        }
        if let Some(policy) = self.error_policy {
            work = work.error_policy(move |request, error| policy(request, error));
        }
        Ok(Controller {
            inner: Arc::new(Inner {
                name: self.name,
                sources,
                reconciler,
                work: work.build_gated(
                    self.max_concurrent_reconciles,
                    self.max_concurrent_reconciles_total,
                ),
                clusters: Mutex::new(Engagements::default()),
                running: Mutex::new(HashMap::new()),
                finished: tokio::sync::Notify::new(),
                owed: self.owed,
            }),
        })
    }
}

/// A multi-cluster controller. Engage it with clusters (the manager does
/// this for every component) and drive it with [`Controller::run`].
#[derive(Clone)]
pub struct Controller {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    sources: Vec<Arc<dyn Source>>,
    reconciler: Reconciler,
    /// The queue (taking requests of engaged clusters only) and its runner.
    work: WorkQueue,
    clusters: Mutex<Engagements<()>>,
    /// Reconciles running now, per cluster, and a signal when one ends.
    running: Mutex<HashMap<ClusterName, usize>>,
    finished: tokio::sync::Notify,
    owed: Option<Owed>,
}

impl Inner {
    /// The cluster `request` is for, if it is engaged and its work has not
    /// been stopped; counted as running one more reconcile until the
    /// returned guard drops. Looked up and counted under one lock, so once
    /// a cluster's lifetime ends no reconcile starts that
    /// [`Aware::settled`] would miss.
    fn start_reconcile(self: &Arc<Self>, request: &Request) -> Option<(Cluster, Running)> {
        let clusters = lock(&self.clusters);
        let cluster = clusters.live(&request.cluster)?.cluster.clone();
        *lock(&self.running)
            .entry(request.cluster.clone())
            .or_default() += 1;
        Some((
            cluster,
            Running {
                inner: self.clone(),
                cluster: request.cluster.clone(),
            },
        ))
    }

    fn running(&self, cluster: &ClusterName) -> usize {
        lock(&self.running).get(cluster).copied().unwrap_or(0)
    }
}

/// One running reconcile of a cluster, uncounted when dropped.
struct Running {
    inner: Arc<Inner>,
    cluster: ClusterName,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = lock(&self.inner.running);
        if let Some(count) = running.get_mut(&self.cluster) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.cluster);
            }
        }
        drop(running);
        self.inner.finished.notify_waiters();
    }
}

impl Controller {
    /// Starts building a controller named `name` (used in logs and metrics).
    pub fn builder(name: impl Into<String>) -> ControllerBuilder {
        ControllerBuilder {
            name: name.into(),
            primary: None,
            sources: Vec::new(),
            owned: Vec::new(),
            max_concurrent_reconciles: 1,
            max_concurrent_reconciles_total: None,
            reconcile_timeout: Some(DEFAULT_RECONCILE_TIMEOUT),
            backoff: Backoff::default(),
            metrics: None,
            owed: None,
            error_policy: None,
        }
    }

    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The engaged cluster of that name (the local cluster under
    /// [`ClusterName::local`] when it is engaged).
    pub fn cluster(&self, name: &ClusterName) -> Option<Cluster> {
        lock(&self.inner.clusters)
            .live(name)
            .map(|engaged| engaged.cluster.clone())
    }

    /// Names of the clusters the controller works on, sorted.
    pub fn engaged_clusters(&self) -> Vec<ClusterName> {
        lock(&self.inner.clusters).names()
    }

    /// Records metrics in `metrics` unless the controller already has a
    /// registry; the manager calls this with its own.
    pub fn use_metrics(&self, metrics: &Metrics) {
        self.inner.work.use_metrics(metrics);
    }

    /// Queues a reconcile of `request` by hand (ignored for clusters that are
    /// not engaged).
    pub fn enqueue(&self, request: Request) {
        self.inner.work.enqueue(request);
    }

    /// Queues a reconcile of `request` after `delay`.
    pub fn enqueue_after(&self, request: Request, delay: Duration) {
        self.inner.work.enqueue_after(request, delay);
    }

    /// Runs reconciles until `shutdown` fires, then lets running reconciles
    /// finish for at most `grace` before abandoning them (their futures are
    /// dropped).
    pub async fn run(&self, shutdown: CancellationToken, grace: Duration) {
        let inner = self.inner.clone();
        self.inner
            .work
            .drive(shutdown, grace, move |request| {
                // Disengaged between queueing and now: dropped.
                let (cluster, running) = inner.start_reconcile(request)?;
                let reconcile = (inner.reconciler)(request.clone(), cluster);
                Some(
                    async move {
                        let result = reconcile.await;
                        drop(running);
                        result
                    }
                    .boxed(),
                )
            })
            .await;
    }

    fn disengage(&self, name: &ClusterName, generation: u64) {
        if lock(&self.inner.clusters).end(name, generation).is_some() {
            self.inner.work.queue().disengage(name);
            tracing::info!(controller = %self.inner.name, cluster = %name, "controller stopped watching the cluster");
        }
    }
}

impl Aware for Controller {
    fn settled(&self, name: &ClusterName) -> BoxFuture<'static, ()> {
        let inner = self.inner.clone();
        let name = name.clone();
        async move {
            loop {
                let finished = inner.finished.notified();
                tokio::pin!(finished);
                // Registered before counting, so an end between the count
                // and the wait still wakes it.
                finished.as_mut().enable();
                if inner.running(&name) == 0 {
                    return;
                }
                finished.await;
            }
        }
        .boxed()
    }

    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
    ) -> Result<(), Error> {
        let (stop, generation) = {
            let mut clusters = lock(&self.inner.clusters);
            if clusters.arrival(&name, &cluster, &lifetime) != Arrival::New {
                return Ok(());
            }
            // A new instance under a known name (e.g. rotated credentials)
            // ends the old one's sources; queued requests stay and run
            // against the new instance.
            let (engaged, _) = clusters.insert(name.clone(), cluster.clone(), &lifetime, ());
            let held = (engaged.lifetime.clone(), engaged.generation);
            self.inner.work.queue().engage(name.clone());
            held
        };
        for source in self
            .inner
            .sources
            .iter()
            .filter(|source| source.clusters().includes(&name))
        {
            source.start(
                name.clone(),
                &cluster,
                self.inner.work.queue().clone(),
                stop.clone(),
            );
        }
        tracing::info!(controller = %self.inner.name, cluster = %name, "controller watches the cluster");
        if let Some(owed) = &self.inner.owed {
            for request in owed(&name, self) {
                self.inner.work.enqueue(request);
            }
        }
        let this = self.clone();
        when_ended(&stop, move || this.disengage(&name, generation));
        Ok(())
    }

    /// Starts the informers of every source that watches `name`, so a
    /// standby replica's caches are in sync when it takes over.
    fn warm(&self, name: &ClusterName, cluster: &Cluster) {
        for source in self
            .inner
            .sources
            .iter()
            .filter(|source| source.clusters().includes(name))
        {
            source.warm(cluster);
        }
    }
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.inner.name)
            .field("clusters", &self.engaged_clusters())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("never")]
    struct Never;

    #[test]
    fn settings_that_cannot_work_are_typed_errors_naming_the_controller() {
        let nothing = Controller::builder("idle")
            .build(|_, _| async { Ok::<_, Never>(Action::await_change()) });
        assert!(
            matches!(&nothing, Err(Error::InvalidOptions { component, reason })
                if component == "controller idle" && reason.contains("watches nothing")),
            "{:?}",
            nothing.err()
        );
        let orphan = Controller::builder("orphan")
            .owns(Watch::<k8s_openapi::api::core::v1::ConfigMap>::new())
            .build(|_, _| async { Ok::<_, Never>(Action::await_change()) });
        assert!(
            matches!(&orphan, Err(Error::InvalidOptions { reason, .. }) if reason.contains("for_resource")),
            "{:?}",
            orphan.err()
        );
    }
}
