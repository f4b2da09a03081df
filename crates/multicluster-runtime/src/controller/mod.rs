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
//!
//! # One event, end to end
//!
//! 1. `cache/mod.rs`: the first source that asks for a type in a cluster
//!    creates the cluster's informer for it (`Cache::informer`, one per
//!    cluster and type, shared by every controller); `cache/informer.rs`:
//!    the informer (`Informer::spawn`) reads kube-runtime's `watcher`
//!    (restarted and backed off by `cache/retry.rs`, its failures recorded
//!    for the cluster's health), applies each event to its store and field
//!    indexes (`Informer::apply`), then sends it to every subscriber; one
//!    that subscribes late gets the store's contents first
//!    (`Informer::subscribe`).
//! 2. `controller/source.rs`: each source the controller's builder made
//!    (`InformerSource`) subscribed when its cluster was engaged
//!    (`Source::start`), if the source's clusters include that one
//!    (`controller/selection.rs`: the fleet, the local cluster, names,
//!    labels); it filters the event (`Filter`, `filters`) and maps it to
//!    [`Request`]s, in its own cluster or, for a mapper that reaches
//!    across, any engaged cluster (`MapContext`). Requests also come from
//!    outside the watches: `controller/triggers.rs` (`reconcile_on`,
//!    `reconcile_all_on`), and what a cluster is owed when it joins,
//!    leaves or is relabelled (the builder's `owed_on_engage`,
//!    `owed_on_disengage`, `owed_on_relabel`, run by
//!    `Controller::engage`).
//! 3. `controller/queue.rs`: `Queue::add` collapses duplicates and marks a
//!    running request dirty; `Queue::next` serves clusters in turn, each
//!    within its own slots.
//! 4. `controller/work.rs`: `WorkQueue::drive` takes the next request,
//!    spawns its reconcile under the deadline
//!    (`ControllerSettings::reconcile_timeout`), and reports the outcome
//!    back (`Queue::done`: per-request backoff after an error, the
//!    requeue an `Action` asks for, the dirty run once more); a request
//!    whose reconciles keep failing is logged once, then reminded of.
//! 5. This file: `Controller::run` turns a request into its reconcile with
//!    the cluster it names (`Inner::start_reconcile`), or drops it if that
//!    cluster left meanwhile (its queued requests were dropped when it
//!    did: `Controller::engage`'s lifetime).

mod builder;
pub mod finalizer;
pub mod map;
mod primary;
mod queue;
mod request;
mod selection;
mod settings;
mod source;
mod triggers;
mod work;

pub use builder::{ControllerBuilder, Watch};
pub use request::{Action, Request};

use crate::engagements::{Engagements, when_ended};
use multicluster_core::lock;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

pub use queue::Backoff;
pub use settings::ControllerSettings;
pub use source::{ClusterScope, Filter, MapContext, filters};
pub use work::{Terminal, WorkQueue, WorkQueueBuilder};

use crate::cluster::Cluster;
use crate::coordinator::{Coordinator, Replicas};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::multicluster::Aware;
use builder::Owed;
use multicluster_core::ClusterName;
use source::Source;

/// How long a reconcile may run by default before it is cancelled.
pub(crate) const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(300);

/// The error type reconcilers return, boxed.
pub type ReconcileError = Box<dyn std::error::Error + Send + Sync>;

type Reconciler = Arc<
    dyn Fn(Request, Cluster) -> BoxFuture<'static, Result<Action, ReconcileError>> + Send + Sync,
>;

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
    /// Sources, per cluster, that have not yet passed on every event of
    /// their informer's first list, and a signal when one has.
    behind: Mutex<HashMap<ClusterName, usize>>,
    caught_up: tokio::sync::Notify,
    owed: Option<Owed>,
    owed_on_disengage: Option<Owed>,
    /// Requests owed to a cluster whose labels changed.
    owed_on_relabel: Option<Owed>,
    /// The primary type's operations (for `reconcile_all_on`).
    primary: Option<primary::Primary>,
    /// The primary watch's selector over cluster labels: clusters entering
    /// or leaving it are owed requests as if engaged or disengaged.
    primary_labels: Option<kube::core::Selector>,
    /// Streams asking for reconciles, taken by the first `run`.
    triggers: Mutex<triggers::Triggers>,
    /// See [`ControllerBuilder::local_on_every_replica`].
    local_on_every_replica: bool,
    /// The coordinator of the manager the controller was added to.
    coordinator: std::sync::OnceLock<Arc<dyn Coordinator>>,
}

impl Inner {
    /// A source starts following `cluster`.
    fn catching_up(&self, cluster: &ClusterName) {
        *lock(&self.behind).entry(cluster.clone()).or_default() += 1;
    }

    /// A source of `cluster` passed on its first list (or stopped).
    fn caught_up(&self, cluster: &ClusterName) {
        let mut behind = lock(&self.behind);
        if let Some(count) = behind.get_mut(cluster) {
            *count -= 1;
            if *count == 0 {
                behind.remove(cluster);
            }
        }
        drop(behind);
        self.caught_up.notify_waiters();
    }

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
        ControllerBuilder::new(name.into())
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

    /// This replica among the replicas sharing the fleet, when the
    /// manager the controller was added to has a coordinator that shares it
    /// ([`Coordinator::replicas`]); `None` otherwise.
    pub fn replicas(&self) -> Option<Replicas> {
        self.inner.coordinator.get()?.replicas()
    }

    /// Takes the coordinator of the manager the controller is added to
    /// (the first one, if added to several).
    pub(crate) fn use_coordinator(&self, coordinator: Arc<dyn Coordinator>) {
        let _ = self.inner.coordinator.set(coordinator);
    }

    /// Starts no reconcile once `closed` is raised: the manager's flag,
    /// raised by its signal handler itself.
    pub(crate) fn close_on(&self, closed: &Arc<std::sync::atomic::AtomicBool>) {
        self.inner.work.close_on(closed);
    }

    /// Records metrics in `metrics` unless the controller already has a
    /// registry; the manager calls this with its own.
    pub fn use_metrics(&self, metrics: &Metrics) {
        self.inner.work.use_metrics(metrics);
    }

    /// The registry the controller records in: the manager's once it was
    /// added to one (ask after that, from a reconcile: asked before, it
    /// keeps a registry of its own). For a component built on a controller
    /// to add its own metrics next to the controller's.
    pub fn metrics(&self) -> Metrics {
        self.inner.work.metrics().clone()
    }

    /// Queues a reconcile of `request` by hand (ignored for clusters that are
    /// not engaged). Queued from a reconcile, its reconcile is that
    /// reconcile's child in a trace ([`crate::telemetry`]).
    pub fn enqueue(&self, request: Request) {
        self.inner.work.enqueue(request);
    }

    /// Takes `defaults` for the settings its builder left unset; false
    /// when its settings were fixed already (it ran, or was added to
    /// another manager).
    pub(crate) fn take_defaults(&self, defaults: &ControllerSettings) -> bool {
        self.inner.work.queue().settings().take_defaults(defaults)
    }

    /// Queues a reconcile of `request` after `delay`.
    pub fn enqueue_after(&self, request: Request, delay: Duration) {
        self.inner.work.enqueue_after(request, delay);
    }

    /// Completes once no request waits to run now and none runs (delayed
    /// ones are not waited for).
    pub(crate) async fn idle(&self) {
        self.inner.work.idle().await;
    }

    /// Completes once every source started for `cluster` has listed its
    /// objects and queued the requests they map to.
    pub(crate) async fn caught_up(&self, cluster: &ClusterName) {
        loop {
            let told = self.inner.caught_up.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if !lock(&self.inner.behind).contains_key(cluster) {
                return;
            }
            told.await;
        }
    }

    /// Runs reconciles until `shutdown` fires, then lets running reconciles
    /// finish for at most `grace` before abandoning them (their futures are
    /// dropped).
    pub async fn run(&self, shutdown: CancellationToken, grace: Duration) {
        let triggers = std::mem::take(&mut *lock(&self.inner.triggers));
        self.follow_triggers(triggers, &shutdown);
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
            self.inner.work.disengage(name);
            tracing::info!(controller = %self.inner.name, cluster = %name, "controller stopped watching the cluster");
            if let Some(owed) = &self.inner.owed_on_disengage {
                for request in owed(name, self) {
                    self.inner.work.enqueue(request);
                }
            }
        }
    }
}

impl Aware for Controller {
    fn local_on_every_replica(&self) -> bool {
        self.inner.local_on_every_replica
    }

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
            // A new instance under a known name (e.g. rotated credentials)
            // ends the old one's sources; queued requests stay and run
            // against the new instance.
            let Some(held) = clusters.insert_new(&name, &cluster, &lifetime, ()) else {
                return Ok(());
            };
            self.inner.work.queue().engage(name.clone());
            held
        };
        let sources = self
            .inner
            .sources
            .iter()
            .filter(|source| source.clusters().includes(&name))
            .cloned()
            .collect();
        let selected = selection::Selection::begin(self, &name, &cluster, sources, &stop);
        tracing::info!(controller = %self.inner.name, cluster = %name, "controller watches the cluster");
        if let Some(owed) = self.inner.owed.as_ref().filter(|_| selected) {
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
            .filter(|source| selection::Selection::watches(source.as_ref(), name, cluster))
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
