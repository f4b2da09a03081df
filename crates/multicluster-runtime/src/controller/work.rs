//! Keyed work with a controller's guarantees, for work that is not a
//! reconcile of an object in an engaged cluster: a provider's client builds
//! (one per kubeconfig context, say), which can take a credential plugin's
//! time.
//!
//! A [`WorkQueue`] is the queue and the runner of every [`super::Controller`]:
//! keys are [`Request`]s, at most `max_concurrent` run at once and never two
//! of one key, duplicates collapse, a key added while it runs runs once more
//! afterwards, failures back off per key, [`Action::requeue`] is honoured and
//! keys are served in turn by their `cluster` field. A slow key holds only
//! its own slot.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::queue::{Outcome, Queue};
use super::settings::{Chosen, ControllerSettings, FixedOnce};
use super::{Action, Backoff, ReconcileError, Request};
use crate::metrics::Metrics;
use multicluster_core::health::repeats::{Repeats, Telling};
use multicluster_core::lock;
use multicluster_core::redact::Redacted;

/// A queue of keyed work and its runner. Cheap to clone; clones share the
/// queue.
#[derive(Clone)]
pub struct WorkQueue {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    /// The queue, and the settings: items running at once across every key
    /// (`max_concurrent_reconciles_total`; `None`: no limit but the queue's
    /// per-cluster one) and the timeout.
    queue: Arc<Queue>,
    error_policy: Option<ErrorPolicy>,
    /// Set by the builder, else by a manager, else a private registry on
    /// first use.
    metrics: OnceLock<Metrics>,
    /// What was logged of each failing key's failures since it last
    /// succeeded: a key that keeps failing for one reason is a warning,
    /// then a reminder every five minutes ([`multicluster_core::health::repeats`]), not
    /// a warning per retry.
    told: Mutex<HashMap<Request, Repeats>>,
    /// Set by a manager: a flag its signal handler raises, so that no item
    /// starts once SIGTERM is received, before the runtime has run
    /// anything that could cancel `shutdown`.
    closed: OnceLock<Arc<AtomicBool>>,
}

/// Builds a [`WorkQueue`].
#[derive(Debug)]
pub struct WorkQueueBuilder {
    name: String,
    max_concurrent: usize,
    backoff: Backoff,
    metrics: Option<Metrics>,
    timeout: Option<Duration>,
    error_policy: Option<ErrorPolicy>,
}

/// Decides what follows a failed work item (see
/// [`WorkQueueBuilder::error_policy`]).
#[derive(Clone)]
pub(crate) struct ErrorPolicy(pub(crate) PolicyFn);

/// An error policy's function.
pub(crate) type PolicyFn = Arc<dyn Fn(&Request, &ReconcileError) -> Option<Action> + Send + Sync>;

impl std::fmt::Debug for ErrorPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ErrorPolicy(..)")
    }
}

/// An error that is reported and counted (with the result `terminal`) but
/// not retried: the key runs again only when it is queued again (for a
/// controller, when the object or something mapped to it changes). For
/// errors that retrying cannot fix, such as an invalid spec.
#[derive(Debug)]
pub struct Terminal(pub ReconcileError);

impl Terminal {
    /// `error`, not to be retried.
    pub fn new(error: impl Into<ReconcileError>) -> Self {
        Self(error.into())
    }
}

impl std::fmt::Display for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Terminal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl WorkQueueBuilder {
    /// Decides, for each failed item, what follows: `Some(action)` replaces
    /// the backoff (`Action::requeue(after)` runs it again after `after`;
    /// `Action::await_change()` not until it is queued again), `None` keeps
    /// the backoff. [`Terminal`] errors are never retried, whatever the
    /// policy says. The failure is counted with the result `error` either
    /// way.
    #[must_use]
    pub fn error_policy(
        mut self,
        policy: impl Fn(&Request, &ReconcileError) -> Option<Action> + Send + Sync + 'static,
    ) -> Self {
        self.error_policy = Some(ErrorPolicy(Arc::new(policy)));
        self
    }

    /// Work items running at once (default 1).
    #[must_use]
    pub fn max_concurrent(mut self, limit: usize) -> Self {
        self.max_concurrent = limit.max(1);
        self
    }

    /// Backoff after a failure, per key (default [`Backoff::default`]).
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Cancels a work item that runs longer than `timeout` (default: none),
    /// counting it under the result `timeout` and backing its key off.
    /// Cancelling drops the item's future: whatever it awaited is abandoned
    /// at that point, so work must be safe to stop at any `.await` (as work
    /// that may crash must be anyway).
    #[must_use]
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// Records durations, results and queue depth in `metrics`, under the
    /// queue's name as `controller`.
    #[must_use]
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// A queue that takes keys of any `cluster`.
    pub fn build(self) -> WorkQueue {
        let settings = ControllerSettings::default()
            .max_concurrent_reconciles(usize::MAX)
            .max_concurrent_reconciles_total(Some(self.max_concurrent))
            .reconcile_timeout(self.timeout)
            .backoff(self.backoff);
        let queue = Queue::open(FixedOnce::fixed(settings));
        self.build_with(queue)
    }

    /// A queue that takes keys only of the clusters engaged on it, with the
    /// settings `chosen` and defaults for the rest (see [`FixedOnce`]); the
    /// builder's own backoff and timeout are not used.
    pub(crate) fn build_gated(self, chosen: Chosen) -> WorkQueue {
        let queue = Queue::new(FixedOnce::chosen(chosen));
        self.build_with(queue)
    }

    fn build_with(self, queue: Queue) -> WorkQueue {
        WorkQueue {
            inner: Arc::new(Inner {
                name: self.name,
                queue: Arc::new(queue),
                error_policy: self.error_policy,
                metrics: self.metrics.map(OnceLock::from).unwrap_or_default(),
                told: Mutex::default(),
                closed: OnceLock::new(),
            }),
        }
    }
}

impl WorkQueue {
    /// Starts building a queue named `name` (used in logs and metrics).
    pub fn builder(name: impl Into<String>) -> WorkQueueBuilder {
        WorkQueueBuilder {
            name: name.into(),
            max_concurrent: 1,
            backoff: Backoff::default(),
            metrics: None,
            timeout: None,
            error_policy: None,
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Queues `key` to run as soon as possible. Queued from a reconcile,
    /// its reconcile is that reconcile's child in a trace
    /// ([`crate::telemetry`]).
    pub fn enqueue(&self, key: Request) {
        self.inner.queue.add_caused(key);
    }

    /// Queues `key` to run after `delay`.
    pub fn enqueue_after(&self, key: Request, delay: Duration) {
        self.inner.queue.add_after(key, delay);
    }

    /// Keys waiting to run now (not delayed, not running).
    pub fn depth(&self) -> usize {
        self.inner.queue.depth()
    }

    /// Completes once no key waits to run now and none runs (keys delayed,
    /// by backoff or [`WorkQueue::enqueue_after`], are not waited for): a
    /// provider that queued its whole inventory knows each key was tried.
    pub async fn idle(&self) {
        self.inner.queue.idle().await;
    }

    pub(crate) fn queue(&self) -> &Arc<Queue> {
        &self.inner.queue
    }

    /// `cluster` left: its keys are dropped, and what was told of their
    /// failures with them.
    pub(crate) fn disengage(&self, cluster: &multicluster_core::ClusterName) {
        self.inner.queue.disengage(cluster);
        lock(&self.inner.told).retain(|key, _| key.cluster != *cluster);
    }

    /// How to tell `key`'s failure for `reason`.
    fn tell_failure(&self, key: &Request, reason: &Redacted) -> Telling {
        lock(&self.inner.told)
            .entry(key.clone())
            .or_default()
            .tell(reason, std::time::Instant::now())
    }

    /// `key` ended without failing: its next failure is news.
    fn settled(&self, key: &Request) {
        let mut told = lock(&self.inner.told);
        if !told.is_empty() {
            told.remove(key);
        }
    }

    /// Records metrics in `metrics` unless the queue already has a registry.
    pub(crate) fn use_metrics(&self, metrics: &Metrics) {
        let _ = self.inner.metrics.set(metrics.clone());
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        self.inner.metrics.get_or_init(Metrics::default)
    }

    /// Starts no item once `closed` is raised (the manager's signal flag);
    /// the first flag given stays.
    pub(crate) fn close_on(&self, closed: &Arc<AtomicBool>) {
        let _ = self.inner.closed.set(closed.clone());
    }

    /// Whether the flag given to [`WorkQueue::close_on`] is raised.
    fn is_closed(&self) -> bool {
        self.inner
            .closed
            .get()
            .is_some_and(|closed| closed.load(Ordering::SeqCst))
    }

    /// Runs `work` for each key until `shutdown` fires, then lets running
    /// work finish for at most `grace` before dropping it (which stops what
    /// it started: a credential plugin, a CLI). An error backs the key off;
    /// a panic counts as an error.
    pub async fn run<F, Fut, E>(&self, shutdown: CancellationToken, grace: Duration, work: F)
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Into<ReconcileError>,
    {
        self.drive(shutdown, grace, |key| {
            Some(
                work(key.clone())
                    .map(|result| result.map_err(Into::into))
                    .boxed(),
            )
        })
        .await;
    }

    /// What a reconcile of `key` that ended with `result` (`None`: it ran
    /// past `timeout`) means: the metrics label, and what the queue does
    /// with the key next. Failures are logged by the once-then-reminder
    /// rule.
    fn judge(
        &self,
        key: &Request,
        result: Option<std::thread::Result<Result<Action, ReconcileError>>>,
        timeout: Option<Duration>,
        elapsed: Duration,
        policy: Option<ErrorPolicy>,
    ) -> (&'static str, Outcome) {
        match result {
            Some(Ok(Ok(action))) => {
                tracing::debug!(?elapsed, ?action, "reconciled");
                self.settled(key);
                ("success", Outcome::Finished(action.requeue_after()))
            }
            Some(Ok(Err(err))) if is_terminal(err.as_ref()) => {
                // With every cause: a wrapper (the finalizer
                // helper's, say) says little by itself.
                let error = Redacted::error(err.as_ref());
                tracing::error!(%error, "reconcile failed; not retried until queued again");
                self.settled(key);
                ("terminal", Outcome::Finished(None))
            }
            Some(Ok(Err(err))) => {
                let error = Redacted::error(err.as_ref());
                match self.tell_failure(key, &error) {
                    Telling::New => tracing::warn!(%error, "reconcile failed"),
                    Telling::Reminder(attempts) => {
                        tracing::warn!(%error, attempts, "reconcile still failing");
                    }
                    Telling::Repeat(attempts) => {
                        tracing::debug!(%error, attempts, "reconcile failed again");
                    }
                }
                match policy.and_then(|policy| (policy.0)(key, &err)) {
                    Some(action) => ("error", Outcome::Finished(action.requeue_after())),
                    None => ("error", Outcome::BackOff),
                }
            }
            Some(Err(_)) => {
                tracing::error!("reconciler panicked");
                ("error", Outcome::BackOff)
            }
            None => {
                let reason = Redacted::new(format!(
                    "it ran past its deadline ({:?})",
                    timeout.unwrap_or_default()
                ));
                match self.tell_failure(key, &reason) {
                    Telling::New | Telling::Reminder(_) => {
                        tracing::warn!(?elapsed, "reconcile cancelled: it ran past its deadline");
                    }
                    Telling::Repeat(attempts) => {
                        tracing::debug!(
                            ?elapsed,
                            attempts,
                            "reconcile cancelled again: it ran past its deadline"
                        );
                    }
                }
                ("timeout", Outcome::BackOff)
            }
        }
    }

    /// The runner behind [`WorkQueue::run`] and the controller: `start`
    /// turns a key into its work, or `None` to drop the key (its cluster
    /// left the fleet).
    pub(crate) async fn drive(
        &self,
        shutdown: CancellationToken,
        grace: Duration,
        mut start: impl FnMut(&Request) -> Option<BoxFuture<'static, Result<Action, ReconcileError>>>,
    ) {
        let queue = self.inner.queue.clone();
        let slots = queue
            .settings()
            .get()
            .max_concurrent_reconciles_total
            .map(|limit| Arc::new(Semaphore::new(limit)));
        let mut running = JoinSet::new();
        loop {
            let slot = match &slots {
                Some(slots) => tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break,
                    slot = slots.clone().acquire_owned() => match slot { Ok(slot) => Some(slot), Err(_) => break },
                },
                None => None,
            };
            let Some(key) = next_key(&queue, &shutdown, || self.is_closed()).await else {
                break;
            };
            self.metrics().queue_depth(self.name(), queue.depth());
            while running.try_join_next().is_some() {}
            let Some(work) = start(&key) else {
                queue.done(&key, Outcome::Finished(None));
                continue;
            };
            let span = tracing::info_span!(
                "reconcile",
                controller = %self.inner.name,
                cluster = %key.cluster,
                namespace = key.namespace.as_deref().unwrap_or(""),
                name = %key.name,
            );
            queue.take_cause(&key).adopt(&span);
            let this = self.clone();
            let timeout = queue.settings().get().reconcile_timeout;
            let policy = self.inner.error_policy.clone();
            running.spawn(
                async move {
                    // A reconcile starts when its task first runs (the
                    // reconciler is called then): one whose task had not
                    // run yet when the signal came never starts.
                    if this.is_closed() {
                        this.inner.queue.done(&key, Outcome::Finished(None));
                        return;
                    }
                    let started = tokio::time::Instant::now();
                    let work = AssertUnwindSafe(work).catch_unwind();
                    let result = match timeout {
                        Some(timeout) => tokio::time::timeout(timeout, work).await.ok(),
                        None => Some(work.await),
                    };
                    let elapsed = started.elapsed();
                    let (label, outcome) = this.judge(&key, result, timeout, elapsed, policy);
                    let metrics = this.metrics();
                    metrics.reconciled(this.name(), &key.cluster, label, elapsed);
                    this.inner.queue.done(&key, outcome);
                    metrics.queue_depth(this.name(), this.inner.queue.depth());
                    drop(slot);
                }
                .instrument(span),
            );
        }
        // What is still running after the grace period is dropped, which
        // stops what it started.
        let what = format!("the work of {}", self.inner.name);
        crate::sync::stop_within(&mut running, tokio::time::Instant::now() + grace, &what).await;
    }
}

/// Whether `err`, or an error it wraps, is [`Terminal`].
fn is_terminal(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |err| err.source()).any(|err| err.is::<Terminal>())
}

/// The next key to run, or `None` once `shutdown` fires or `closed` is
/// raised.
async fn next_key(
    queue: &Queue,
    shutdown: &CancellationToken,
    closed: impl Fn() -> bool,
) -> Option<Request> {
    loop {
        let changed = queue.changed();
        let next_due = match queue.next() {
            Ok(key) => {
                if shutdown.is_cancelled() || closed() {
                    // Left for the queue to drop with the controller.
                    queue.done(&key, Outcome::Finished(None));
                    return None;
                }
                return Some(key);
            }
            Err(next_due) => next_due,
        };
        let wait_due = async {
            match next_due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            () = changed => {}
            () = wait_due => {}
        }
    }
}

impl std::fmt::Debug for WorkQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue")
            .field("name", &self.inner.name)
            .field("settings", self.inner.queue.settings())
            .field("depth", &self.depth())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn key(name: &str) -> Request {
        Request::new(name, None, "")
    }

    /// Runs `queue` with `work` in the background until the returned token
    /// is cancelled.
    fn spawn_run<F, Fut>(
        queue: &WorkQueue,
        work: F,
    ) -> (CancellationToken, tokio::task::JoinHandle<()>)
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    {
        let shutdown = CancellationToken::new();
        let queue = queue.clone();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move { queue.run(stop, Duration::ZERO, work).await });
        (shutdown, task)
    }

    async fn until(what: &str, check: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !check() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_key_that_hangs_holds_only_its_own_slot() {
        let queue = WorkQueue::builder("test").max_concurrent(2).build();
        let done = Arc::new(Mutex::new(Vec::new()));
        let seen = done.clone();
        let (shutdown, task) = spawn_run(&queue, move |key| {
            let seen = seen.clone();
            async move {
                if key.cluster.as_str() == "hung" {
                    std::future::pending::<()>().await;
                }
                seen.lock().expect("lock").push(key.cluster.to_string());
                Ok(Action::await_change())
            }
        });
        queue.enqueue(key("hung"));
        for name in ["a", "b", "c"] {
            queue.enqueue(key(name));
        }
        until("the others to run", || {
            done.lock().expect("lock").len() == 3
        })
        .await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the hung key does not hold up the shutdown")
            .expect("task");
    }

    #[tokio::test(start_paused = true)]
    async fn work_past_its_deadline_is_cancelled_counted_and_retried() {
        let metrics = Metrics::default();
        let queue = WorkQueue::builder("deadline")
            .timeout(Some(Duration::from_secs(5)))
            .backoff(Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(1),
            })
            .metrics(metrics.clone())
            .build();
        let runs = Arc::new(Mutex::new(0));
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        let seen = runs.clone();
        let (shutdown, task) = spawn_run(&queue, move |_| {
            let seen = seen.clone();
            let dropped = dropped_tx.clone();
            async move {
                *seen.lock().expect("lock") += 1;
                // Tells the test when this future is dropped.
                struct OnDrop(std::sync::mpsc::Sender<()>);
                impl Drop for OnDrop {
                    fn drop(&mut self) {
                        let _ = self.0.send(());
                    }
                }
                let _guard = OnDrop(dropped);
                std::future::pending::<Result<Action, ReconcileError>>().await
            }
        });
        queue.enqueue(key("hangs"));
        until("a second run", || *runs.lock().expect("lock") >= 2).await;
        assert!(dropped_rx.try_recv().is_ok(), "the first run was dropped");
        let text = metrics.encode();
        assert!(
            text.lines().any(
                |line| line.starts_with("controller_runtime_reconcile_total{")
                    && line.contains("result=\"timeout\"")
                    && !line.ends_with(" 0")
            ),
            "{text}"
        );
        shutdown.cancel();
        task.await.expect("task");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_and_requeues_are_honoured() {
        let queue = WorkQueue::builder("test")
            .backoff(Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(60),
            })
            .build();
        let times = Arc::new(Mutex::new(Vec::new()));
        let seen = times.clone();
        let started = tokio::time::Instant::now();
        let (shutdown, task) = spawn_run(&queue, move |key| {
            let seen = seen.clone();
            async move {
                let mut seen = seen.lock().expect("lock");
                seen.push(started.elapsed().as_secs());
                match (key.cluster.as_str(), seen.len()) {
                    ("k", 1 | 2) => Err("not yet".into()),
                    ("k", 3) => Ok(Action::requeue(Duration::from_secs(10))),
                    _ => Ok(Action::await_change()),
                }
            }
        });
        queue.enqueue(key("k"));
        until("four runs", || times.lock().expect("lock").len() == 4).await;
        // Failed at 0 s, retried after 1 s, failed, retried after 2 s,
        // requeued 10 s later.
        assert_eq!(*times.lock().expect("lock"), [0, 1, 3, 13]);
        shutdown.cancel();
        task.await.expect("task");
    }
}
