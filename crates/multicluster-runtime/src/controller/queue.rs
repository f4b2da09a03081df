//! The work queue of one controller.
//!
//! Requests wait in one FIFO per cluster, and clusters are served in turn, so
//! a cluster with thousands of pending requests cannot starve one with a
//! single request (Go's queue is a single FIFO for the whole fleet). A request
//! is either waiting, running, or running-and-dirty; duplicates collapse, and
//! a request added while it runs runs once more afterwards. Delayed requests
//! (requeue-after, error backoff) wait in a timer heap until due.
//!
//! Each cluster runs at most its own number of requests at once (a
//! controller's `max_concurrent_reconciles`): a cluster's requests wait
//! only for that cluster's slots, so clusters whose requests hang, however
//! many, hold up nobody else's.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::Request;
use super::settings::FixedOnce;
use crate::telemetry::Cause;
use multicluster_core::ClusterName;

/// Per-request exponential backoff after errors.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// Delay after the first error (default 5 ms, as controller-runtime).
    pub base: Duration,
    /// Longest delay (default 1000 s, as controller-runtime).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive errors (1 = first error).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.base.saturating_mul(factor).min(self.max)
    }
}

/// What follows a reconcile, for [`Queue::done`].
pub(crate) enum Outcome {
    /// No backoff: run again after the delay if one is given, else only
    /// when queued again. A success, a terminal error, or an error whose
    /// policy chose what follows.
    Finished(Option<Duration>),
    /// An error: back off, longer after each one in a row.
    BackOff,
}

#[derive(Default)]
struct State {
    /// Clusters whose requests are accepted.
    engaged: HashSet<ClusterName>,
    waiting: HashMap<ClusterName, VecDeque<Request>>,
    /// Clusters with waiting requests and a free slot, in serving order.
    turn: VecDeque<ClusterName>,
    /// Clusters with waiting requests whose slots are all taken: out of
    /// the turn until one of their reconciles ends, so that finding work
    /// never walks past them (with most of a large fleet busy, it would
    /// walk the fleet for every request).
    full: HashSet<ClusterName>,
    queued: HashSet<Request>,
    running: HashSet<Request>,
    /// How many requests run now, per cluster.
    running_per_cluster: HashMap<ClusterName, usize>,
    dirty: HashSet<Request>,
    delayed: BinaryHeap<Reverse<(Instant, u64, Request)>>,
    /// The earliest due time per delayed request; heap entries with another
    /// time are stale (a request is delayed at most once, at its earliest).
    due: HashMap<Request, Instant>,
    sequence: u64,
    failures: HashMap<Request, u32>,
    /// What caused requests queued from a reconcile (see
    /// [`Queue::add_caused`]): the span their reconcile is a child of.
    /// Empty unless traces are exported.
    causes: HashMap<Request, Cause>,
}

pub(crate) struct Queue {
    state: Mutex<State>,
    changed: Notify,
    /// Told whenever a reconcile ends with nothing queued or running.
    idle: Notify,
    /// Backoff, requests of one cluster at once
    /// (`max_concurrent_reconciles`), debounce; the runner's settings too.
    settings: FixedOnce,
    /// Whether only requests of engaged clusters are taken (a controller's
    /// queue) or any (a [`super::WorkQueue`] of its own).
    gated: bool,
}

impl Queue {
    /// A queue that takes requests of engaged clusters only.
    pub(crate) fn new(settings: FixedOnce) -> Self {
        Self {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            idle: Notify::new(),
            settings,
            gated: true,
        }
    }

    /// A queue that takes requests of any cluster.
    pub(crate) fn open(settings: FixedOnce) -> Self {
        Self {
            gated: false,
            ..Self::new(settings)
        }
    }

    pub(crate) fn settings(&self) -> &FixedOnce {
        &self.settings
    }

    fn takes(&self, state: &State, cluster: &ClusterName) -> bool {
        !self.gated || state.engaged.contains(cluster)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        multicluster_core::lock(&self.state)
    }

    /// The clusters whose requests are taken, sorted.
    pub(crate) fn engaged(&self) -> Vec<ClusterName> {
        let mut engaged: Vec<ClusterName> = self.lock().engaged.iter().cloned().collect();
        engaged.sort();
        engaged
    }

    /// Accepts requests for `cluster` from now on.
    pub(crate) fn engage(&self, cluster: ClusterName) {
        self.lock().engaged.insert(cluster);
    }

    /// Drops everything queued or delayed for `cluster` and refuses its
    /// requests until it is engaged again. Running reconciles finish but are
    /// not requeued.
    pub(crate) fn disengage(&self, cluster: &ClusterName) {
        let mut state = self.lock();
        state.engaged.remove(cluster);
        state.waiting.remove(cluster);
        state.turn.retain(|name| name != cluster);
        state.full.remove(cluster);
        state.queued.retain(|req| &req.cluster != cluster);
        state.dirty.retain(|req| &req.cluster != cluster);
        state.failures.retain(|req, _| &req.cluster != cluster);
        state.due.retain(|req, _| &req.cluster != cluster);
        state.causes.retain(|req, _| &req.cluster != cluster);
        let delayed = std::mem::take(&mut state.delayed);
        state.delayed = delayed
            .into_iter()
            .filter(|Reverse((_, _, req))| &req.cluster != cluster)
            .collect();
    }

    /// Adds a request to run as soon as possible: at once, or, with a
    /// debounce, once that long has passed without it being added again
    /// (each addition restarts the wait, as kube-runtime's debounce does;
    /// one added while it runs runs again right after).
    pub(crate) fn add(&self, request: Request) {
        let debounce = self.settings.get().debounce;
        let mut state = self.lock();
        if !self.takes(&state, &request.cluster) {
            return;
        }
        if debounce.is_zero() || state.running.contains(&request) {
            if !Self::enqueue(&mut state, request) {
                return;
            }
        } else if state.queued.contains(&request) {
            return;
        } else {
            Self::delay_until(&mut state, request, Instant::now() + debounce);
        }
        drop(state);
        self.changed.notify_one();
    }

    /// Adds a request as [`Queue::add`] does, caused by the span this is
    /// called in: its next reconcile is that span's child in a trace. A
    /// request already waiting keeps the cause it has.
    pub(crate) fn add_caused(&self, request: Request) {
        let cause = Cause::current();
        if !cause.is_empty() {
            let mut state = self.lock();
            if self.takes(&state, &request.cluster) {
                state.causes.entry(request.clone()).or_insert(cause);
            }
        }
        self.add(request);
    }

    /// What caused `request`, taken as its reconcile starts.
    pub(crate) fn take_cause(&self, request: &Request) -> Cause {
        // Without traces there is never a cause: no lock per reconcile.
        if !cfg!(feature = "opentelemetry") {
            return Cause::default();
        }
        let mut state = self.lock();
        if state.causes.is_empty() {
            return Cause::default();
        }
        state.causes.remove(request).unwrap_or_default()
    }

    fn enqueue(state: &mut State, request: Request) -> bool {
        if state.running.contains(&request) {
            state.dirty.insert(request);
            return false;
        }
        if !state.queued.insert(request.clone()) {
            return false;
        }
        let cluster = request.cluster.clone();
        let waiting = state.waiting.entry(cluster.clone()).or_default();
        waiting.push_back(request);
        if waiting.len() == 1 {
            state.turn.push_back(cluster);
        }
        true
    }

    /// Adds a request to run after `delay`.
    pub(crate) fn add_after(&self, request: Request, delay: Duration) {
        let mut state = self.lock();
        if !self.takes(&state, &request.cluster) {
            return;
        }
        Self::delay(&mut state, request, delay);
        drop(state);
        self.changed.notify_one();
    }

    fn delay(state: &mut State, request: Request, delay: Duration) {
        let due = Instant::now() + delay;
        if state
            .due
            .get(&request)
            .is_some_and(|earlier| *earlier <= due)
        {
            return;
        }
        Self::delay_until(state, request, due);
    }

    /// Delays `request` until `due`, whenever it was due before.
    fn delay_until(state: &mut State, request: Request, due: Instant) {
        state.due.insert(request.clone(), due);
        state.sequence += 1;
        let entry = (due, state.sequence, request);
        state.delayed.push(Reverse(entry));
    }

    /// Takes the next request to run, serving clusters in turn, and marks it
    /// running. Returns the time the next delayed request is due when none is
    /// ready.
    pub(crate) fn next(&self) -> Result<Request, Option<Instant>> {
        let per_cluster = self.settings.get().max_concurrent_reconciles;
        let mut state = self.lock();
        let now = Instant::now();
        while state
            .delayed
            .peek()
            .is_some_and(|Reverse((due, _, _))| *due <= now)
        {
            if let Some(Reverse((due, _, request))) = state.delayed.pop()
                && state.due.get(&request) == Some(&due)
            {
                state.due.remove(&request);
                Self::enqueue(&mut state, request);
            }
        }
        // Each cluster in turn at most once; one using all its slots leaves
        // the turn until a slot frees.
        for _ in 0..state.turn.len() {
            let Some(cluster) = state.turn.pop_front() else {
                break;
            };
            let running = state
                .running_per_cluster
                .get(&cluster)
                .copied()
                .unwrap_or(0);
            if running >= per_cluster {
                state.full.insert(cluster);
                continue;
            }
            let Some(waiting) = state.waiting.get_mut(&cluster) else {
                continue;
            };
            let Some(request) = waiting.pop_front() else {
                continue;
            };
            if waiting.is_empty() {
                state.waiting.remove(&cluster);
            } else if running + 1 >= per_cluster {
                state.full.insert(cluster.clone());
            } else {
                state.turn.push_back(cluster.clone());
            }
            state.queued.remove(&request);
            state.running.insert(request.clone());
            *state.running_per_cluster.entry(cluster).or_default() += 1;
            return Ok(request);
        }
        Err(state.delayed.peek().map(|Reverse((due, _, _))| *due))
    }

    /// Waits until something may have become ready.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Records the end of a reconcile of `request`.
    pub(crate) fn done(&self, request: &Request, outcome: Outcome) {
        let mut state = self.lock();
        if state.running.remove(request)
            && let Some(count) = state.running_per_cluster.get_mut(&request.cluster)
        {
            *count -= 1;
            if *count == 0 {
                state.running_per_cluster.remove(&request.cluster);
            }
            // A slot is free: a cluster waiting for one takes its turn again.
            if state.full.remove(&request.cluster) {
                state.turn.push_back(request.cluster.clone());
            }
        }
        let engaged = self.takes(&state, &request.cluster);
        let delay = match outcome {
            Outcome::Finished(after) => {
                state.failures.remove(request);
                after
            }
            Outcome::BackOff if engaged => {
                let failures = state.failures.entry(request.clone()).or_default();
                *failures = failures.saturating_add(1);
                Some(self.settings.get().backoff.delay(*failures))
            }
            Outcome::BackOff => None,
        };
        let dirty = state.dirty.remove(request);
        if engaged {
            if dirty {
                Self::enqueue(&mut state, request.clone());
            }
            if let Some(delay) = delay {
                Self::delay(&mut state, request.clone(), delay);
            }
        }
        let idle = state.queued.is_empty() && state.running.is_empty();
        drop(state);
        self.changed.notify_one();
        if idle {
            self.idle.notify_waiters();
        }
    }

    /// Completes once no request waits to run now and none runs (delayed
    /// ones, by backoff or on purpose, are not waited for).
    pub(crate) async fn idle(&self) {
        loop {
            let told = self.idle.notified();
            tokio::pin!(told);
            // Registered before looking, so a reconcile ending between the
            // look and the wait still wakes it.
            told.as_mut().enable();
            {
                let state = self.lock();
                if state.queued.is_empty() && state.running.is_empty() {
                    return;
                }
            }
            told.await;
        }
    }

    /// Requests waiting to run now (not delayed, not running).
    pub(crate) fn depth(&self) -> usize {
        self.lock().queued.len()
    }

    /// Requests waiting for `cluster`.
    #[cfg(test)]
    pub(crate) fn depth_of(&self, cluster: &ClusterName) -> usize {
        self.lock().waiting.get(cluster).map_or(0, VecDeque::len)
    }
}

#[cfg(test)]
mod tests {
    use super::super::settings::ControllerSettings;
    use super::*;

    fn req(cluster: &str, name: &str) -> Request {
        Request::new(cluster, Some("default"), name)
    }

    fn queue(clusters: &[&str]) -> Queue {
        queue_with(
            clusters,
            ControllerSettings::default().max_concurrent_reconciles(usize::MAX),
        )
    }

    fn queue_with(clusters: &[&str], settings: ControllerSettings) -> Queue {
        let queue = Queue::new(FixedOnce::fixed(settings));
        for cluster in clusters {
            queue.engage((*cluster).into());
        }
        queue
    }

    #[test]
    fn duplicates_collapse() {
        let q = queue(&["a"]);
        q.add(req("a", "x"));
        q.add(req("a", "x"));
        assert_eq!(q.next().ok(), Some(req("a", "x")));
        assert!(q.next().is_err());
    }

    #[test]
    fn clusters_are_served_in_turn() {
        let q = queue(&["busy", "quiet"]);
        for i in 0..100 {
            q.add(req("busy", &format!("obj-{i}")));
        }
        q.add(req("quiet", "only"));
        let first_two: Vec<_> = (0..2).filter_map(|_| q.next().ok()).collect();
        assert!(first_two.contains(&req("quiet", "only")), "{first_two:?}");
    }

    #[test]
    fn a_request_added_while_running_runs_once_more_afterwards() {
        let q = queue(&["a"]);
        q.add(req("a", "x"));
        let running = q.next().expect("ready");
        q.add(req("a", "x"));
        q.add(req("a", "x"));
        assert!(q.next().is_err(), "never twice at once");
        q.done(&running, Outcome::Finished(None));
        assert_eq!(q.next().ok(), Some(req("a", "x")));
        q.done(&running, Outcome::Finished(None));
        assert!(q.next().is_err(), "only once more");
    }

    #[test]
    fn disengaging_drops_queued_and_delayed_requests_and_refuses_new_ones() {
        let q = queue(&["a", "b"]);
        q.add(req("a", "x"));
        q.add_after(req("a", "y"), Duration::ZERO);
        q.add(req("b", "z"));
        q.disengage(&"a".into());
        q.add(req("a", "late"));
        assert_eq!(q.depth_of(&"a".into()), 0);
        assert_eq!(q.next().ok(), Some(req("b", "z")));
        assert!(q.next().is_err());
    }

    #[test]
    fn a_cluster_whose_slots_are_taken_waits_out_of_turn_and_comes_back() {
        let q = queue_with(
            &["a", "b"],
            ControllerSettings::default().max_concurrent_reconciles(1),
        );
        q.add(req("a", "1"));
        q.add(req("a", "2"));
        let first = q.next().expect("a's first");
        assert_eq!(first, req("a", "1"));
        assert!(q.next().is_err(), "a's slot is taken");
        // A cluster that gets work while a is parked is served at once.
        q.add(req("b", "1"));
        assert_eq!(q.next().ok(), Some(req("b", "1")));
        assert!(q.next().is_err());
        // a's slot frees: a is back in turn with its waiting request.
        q.done(&first, Outcome::Finished(None));
        assert_eq!(q.next().ok(), Some(req("a", "2")));
        // Disengaging a parked cluster forgets it.
        q.add(req("a", "3"));
        q.disengage(&"a".into());
        q.done(&req("a", "2"), Outcome::Finished(None));
        assert!(q.next().is_err());
    }

    #[test]
    fn a_cluster_runs_at_most_its_own_slots_and_others_have_theirs() {
        let q = queue_with(
            &["busy", "quiet", "other"],
            ControllerSettings::default().max_concurrent_reconciles(2),
        );
        for i in 0..5 {
            q.add(req("busy", &format!("obj-{i}")));
        }
        let first = q.next().expect("one");
        let _second = q.next().expect("two");
        assert!(q.next().is_err(), "busy uses both of its slots");
        q.add(req("quiet", "a"));
        q.add(req("quiet", "b"));
        q.add(req("other", "c"));
        let mut others: Vec<_> = (0..3).filter_map(|_| q.next().ok()).collect();
        others.sort();
        assert_eq!(
            others,
            [req("other", "c"), req("quiet", "a"), req("quiet", "b")]
        );
        q.done(&first, Outcome::Finished(None));
        assert_eq!(q.next().ok(), Some(req("busy", "obj-2")));

        // Alone, a cluster has its own slots and no more.
        let alone = queue_with(&["only"], ControllerSettings::default());
        alone.add(req("only", "x"));
        alone.add(req("only", "y"));
        assert!(alone.next().is_ok() && alone.next().is_err());
    }

    #[test]
    fn a_delayed_request_is_kept_once_at_its_earliest_time() {
        let q = queue(&["a"]);
        q.add_after(req("a", "x"), Duration::from_secs(600));
        q.add_after(req("a", "x"), Duration::ZERO);
        q.add_after(req("a", "x"), Duration::from_secs(300));
        assert_eq!(q.next().ok(), Some(req("a", "x")));
        assert_eq!(q.lock().due.len(), 0);
    }

    #[test]
    fn failures_back_off_exponentially_and_success_resets() {
        let backoff = Backoff::default();
        assert_eq!(backoff.delay(1), Duration::from_millis(5));
        assert_eq!(backoff.delay(2), Duration::from_millis(10));
        assert_eq!(backoff.delay(4), Duration::from_millis(40));
        assert_eq!(backoff.delay(100), Duration::from_secs(1000));

        let q = queue(&["a"]);
        q.add(req("a", "x"));
        let r = q.next().expect("ready");
        q.done(&r, Outcome::BackOff);
        q.done(&r, Outcome::BackOff);
        assert_eq!(q.lock().failures.get(&r), Some(&2));
        q.done(&r, Outcome::Finished(None));
        assert_eq!(q.lock().failures.get(&r), None);
    }

    /// A debounced request runs once the debounce has passed since it was
    /// last added, once however often it was added.
    #[tokio::test(start_paused = true)]
    async fn a_debounced_request_waits_until_it_is_left_alone() {
        let debounce = Duration::from_secs(1);
        let q = queue_with(&["a"], ControllerSettings::default().debounce(debounce));
        let start = Instant::now();
        q.add(req("a", "x"));
        assert_eq!(q.next().err(), Some(Some(start + debounce)), "not at once");
        tokio::time::advance(Duration::from_millis(600)).await;
        q.add(req("a", "x"));
        tokio::time::advance(Duration::from_millis(600)).await;
        let due = start + Duration::from_millis(1600);
        assert_eq!(q.next().err(), Some(Some(due)), "the wait started over");
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(q.next().ok(), Some(req("a", "x")));
        assert!(q.next().is_err(), "once");

        // Added while it runs: runs again right after, without waiting.
        q.add(req("a", "x"));
        q.done(&req("a", "x"), Outcome::Finished(None));
        assert_eq!(q.next().ok(), Some(req("a", "x")));
    }
}
