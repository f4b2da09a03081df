//! The fleet as the manager tracks it: each engaged cluster's way from
//! syncing to ready (or unreachable and retried), its state following its
//! health afterwards, and the per-state counts, changed in one place.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Manager;
use super::progress::{Moment, Progress};
use crate::cluster::Cluster;
use crate::engagements::{Arrival, Engagements, when_ended};
use crate::error::Error;
use crate::metrics::{ClusterAge, Metrics};
use crate::multicluster::Aware;
use multicluster_core::ClusterName;
use multicluster_core::ClusterState;
use multicluster_core::health::repeats::{Repeats, Telling};
use multicluster_core::lock;
use multicluster_core::redact::Redacted;

/// How often engaged clusters' health is looked at.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How often a cluster whose connections have no pings is probed, and how
/// long its answer may take: an HTTP/2 connection's ping interval and
/// timeout (client-go's), so that a silent partition is found in the same
/// time over HTTP/1.1.
const LIVENESS_INTERVAL: Duration = Duration::from_secs(30);
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(15);

/// The engaged clusters and their states: the one owner of both, so that
/// every change of state goes through [`States::move_to`].
pub(super) struct Tracked {
    pub(super) clusters: Engagements<Progress>,
    pub(super) states: States,
    /// Set when a health walk found every engaged cluster well: the
    /// failure changes then. Until they move (or a cluster is engaged),
    /// walking again would find the same.
    pub(super) quiet_at: Option<u64>,
    /// Engaged clusters not checked yet (see `Progress::unchecked`).
    pub(super) unchecked: usize,
    /// Told when `unchecked` falls to zero.
    pub(super) all_checked: Arc<tokio::sync::Notify>,
    /// The handed-over clusters by when each is next looked at for a
    /// liveness probe (`Progress::next_liveness_probe`; an entry that no
    /// longer matches it, or whose cluster is gone, is dropped when due).
    pub(super) liveness: BTreeSet<(Instant, ClusterName)>,
}

impl Tracked {
    pub(super) fn new(metrics: Metrics) -> Self {
        Self {
            clusters: Engagements::default(),
            states: States {
                counts: [0; 4],
                metrics,
            },
            quiet_at: None,
            unchecked: 0,
            all_checked: Arc::new(tokio::sync::Notify::new()),
            liveness: BTreeSet::new(),
        }
    }

    /// Records that a check of `name`'s engagement of `generation` failed
    /// while it is brought up, the next due at `next`; false when that
    /// engagement is gone.
    fn check_failed(
        &mut self,
        name: &ClusterName,
        generation: u64,
        reason: Redacted,
        next: Instant,
    ) -> bool {
        let Some(held) = self.clusters.current_mut(name, generation) else {
            return false;
        };
        held.data.check_failed(next);
        self.states
            .move_to(name, &mut held.data, ClusterState::Unreachable(reason));
        checked(&mut self.unchecked, &self.all_checked, &mut held.data);
        true
    }
}

/// `progress` was checked (handed over, found unreachable) or is gone: no
/// longer counted in `unchecked`, and `all_checked` told when none is left.
fn checked(unchecked: &mut usize, all_checked: &tokio::sync::Notify, progress: &mut Progress) {
    if std::mem::take(&mut progress.unchecked) {
        *unchecked -= 1;
        if *unchecked == 0 {
            all_checked.notify_waiters();
        }
    }
}

/// How many engaged clusters are in each state (kept as states change, so
/// publishing the counts never walks the fleet), and what a change tells.
pub(super) struct States {
    counts: [i64; 4],
    metrics: Metrics,
}

impl States {
    /// `name` was engaged (replacing an instance in `replaced`, if any):
    /// it starts syncing.
    fn engaged(&mut self, name: &ClusterName, replaced: Option<&ClusterState>) {
        match replaced {
            Some(old) => self.counts[old.index()] -= 1,
            None => self.metrics.cluster_engaged(),
        }
        self.counts[ClusterState::Syncing.index()] += 1;
        self.metrics
            .cluster_state(name, ClusterState::Syncing.label());
        self.publish();
    }

    /// `name`'s engagement ended in `state`.
    fn ended(&mut self, name: &ClusterName, state: &ClusterState) {
        self.counts[state.index()] -= 1;
        self.metrics.cluster_gone(name);
        self.publish();
    }

    /// The one place an engaged cluster's state changes: the counts and
    /// their gauges, the cluster's own gauge, `mcr_cluster_state_changes`
    /// when it enters another state (a new reason for the same state is no
    /// change there, nor a new start of its time in it), and, once it was
    /// handed to the components, the log line (before, bring-up tells its
    /// failed checks itself, repeats folded).
    fn move_to(&mut self, name: &ClusterName, progress: &mut Progress, to: ClusterState) {
        let from = &progress.state;
        if progress.handed() {
            match &to {
                ClusterState::Ready if *from == ClusterState::Syncing => {
                    tracing::info!(cluster = %name, "cluster ready");
                }
                ClusterState::Ready if *from != ClusterState::Ready => {
                    tracing::info!(cluster = %name, "cluster works again");
                }
                ClusterState::Degraded(reason) | ClusterState::Unreachable(reason)
                    if *from != to =>
                {
                    tracing::warn!(cluster = %name, state = to.label(), %reason, "cluster is not healthy");
                }
                _ => {}
            }
        }
        if from.label() != to.label() {
            self.metrics.state_changed(to.label());
        }
        self.counts[from.index()] -= 1;
        self.counts[to.index()] += 1;
        self.metrics.cluster_state(name, to.label());
        progress.enter(to);
        self.publish();
    }

    /// Updates the per-state cluster gauges (and the fleet summary).
    fn publish(&self) {
        self.metrics.cluster_states(self.counts);
    }
}

impl Manager {
    /// Brings an engaged cluster through syncing to ready: waits until its
    /// API server answers (reported unreachable and retried with backoff
    /// meanwhile), hands it to the coordinator, whose components start
    /// their watches, and reports it ready once those have listed.
    async fn bring_up(self, name: ClusterName, generation: u64) {
        let options = self.inner.options.clone();
        let mut delay = options.retry_delay;
        let mut told = Repeats::default();
        let unreachable_since = Instant::now();
        let (cluster, lifetime) = loop {
            let Some((cluster, lifetime)) = self.tracked(&name, generation) else {
                return;
            };
            let check = tokio::time::timeout(options.sync_timeout, probe_server(&cluster));
            let reason = tokio::select! {
                () = lifetime.cancelled() => return,
                result = check => match result {
                    Ok(Ok(())) => break (cluster, lifetime),
                    Ok(Err(reason)) => reason,
                    Err(_) => Redacted::new(format!("no answer within {:?}", options.sync_timeout)),
                },
            };
            match told.tell(&reason, std::time::Instant::now()) {
                Telling::New => {
                    tracing::warn!(cluster = %name, %reason, retry_in = ?delay, "cluster unreachable");
                }
                Telling::Reminder(attempts) => {
                    tracing::warn!(cluster = %name, %reason, attempts, retry_in = ?delay, "cluster still unreachable");
                }
                Telling::Repeat(attempts) => {
                    tracing::debug!(cluster = %name, %reason, attempts, retry_in = ?delay, "cluster unreachable");
                }
            }
            if !self.check_failed(&name, generation, reason, Instant::now() + delay) {
                return;
            }
            tokio::select! {
                () = lifetime.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            let cap = options
                .long_outage
                .cap(unreachable_since.elapsed(), options.max_retry_delay);
            delay = (delay * 2).min(cap);
        };
        if !self.hand_over(&name, generation, &cluster, &lifetime) {
            return;
        }
        // The watches the components started now have `sync_timeout` to
        // list; the health walk reports a refused one meanwhile, and the
        // cluster ready once they all have (see `Progress::due`).
        let synced = tokio::time::timeout(options.sync_timeout, cluster.cache().synced());
        tokio::select! {
            () = lifetime.cancelled() => return,
            _ = synced => {}
        }
        let mut guard = lock(&self.inner.clusters);
        let tracked = &mut *guard;
        if let Some(held) = tracked.clusters.current_mut(&name, generation) {
            let now = Instant::now();
            if let Some(state) = held.data.due(&held.cluster, now, &options) {
                tracked.states.move_to(&name, &mut held.data, state);
            }
        }
    }

    /// Hands the cluster to the coordinator, which engages the components
    /// (their informers are created before it returns); false when that
    /// engagement is gone.
    fn hand_over(
        &self,
        name: &ClusterName,
        generation: u64,
        cluster: &Cluster,
        lifetime: &CancellationToken,
    ) -> bool {
        {
            let mut guard = lock(&self.inner.clusters);
            let tracked = &mut *guard;
            let Some(held) = tracked.clusters.current_mut(name, generation) else {
                return false;
            };
            held.data.hand_over();
            let look = Instant::now() + first_look(name);
            held.data.next_liveness_probe = Some(look);
            tracked.liveness.insert((look, name.clone()));
            tracked
                .states
                .move_to(name, &mut held.data, ClusterState::Syncing);
            // A failure recorded before the cluster was handed over moved
            // nothing since the last walk.
            tracked.quiet_at = None;
        }
        let components = lock(&self.inner.components).clone();
        if let Err(err) =
            self.coordinator()
                .engage(lifetime.clone(), name.clone(), cluster.clone(), &components)
        {
            tracing::error!(cluster = %name, error = %err, "engaging components failed");
        }
        let mut guard = lock(&self.inner.clusters);
        let tracked = &mut *guard;
        if let Some(held) = tracked.clusters.current_mut(name, generation) {
            checked(&mut tracked.unchecked, &tracked.all_checked, &mut held.data);
        }
        true
    }

    fn tracked(&self, name: &ClusterName, generation: u64) -> Option<(Cluster, CancellationToken)> {
        lock(&self.inner.clusters)
            .clusters
            .current_mut(name, generation)
            .map(|held| (held.cluster.clone(), held.lifetime.clone()))
    }

    fn check_failed(
        &self,
        name: &ClusterName,
        generation: u64,
        reason: Redacted,
        next: Instant,
    ) -> bool {
        lock(&self.inner.clusters).check_failed(name, generation, reason, next)
    }

    /// Each engaged cluster's state, time in it and failed attempts, for
    /// the metrics read at each scrape.
    pub(super) fn cluster_ages(&self) -> Vec<ClusterAge> {
        let now = Moment::now();
        lock(&self.inner.clusters)
            .clusters
            .iter()
            .map(|(name, held)| ClusterAge {
                name: name.clone(),
                state: held.data.state.label(),
                in_state: held.data.time_in_state(now.at),
                failed_attempts: held.data.status(&held.cluster, now).failed_attempts,
            })
            .collect()
    }

    /// Brings each engaged cluster's state in line with its health every
    /// [`HEALTH_CHECK_INTERVAL`], and probes the clusters whose connections
    /// nothing checks every [`LIVENESS_INTERVAL`] each, until `stop` fires.
    pub(super) async fn watch_health(self, stop: CancellationToken) {
        let mut ticks = tokio::time::interval(HEALTH_CHECK_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {
                    self.check_health();
                    self.probe_liveness();
                }
            }
        }
    }

    /// Asks each handed-over cluster that is ready or degraded, and whose
    /// client's connections have no pings (HTTP/1.1), whether its server
    /// answers, within [`LIVENESS_TIMEOUT`]. Over HTTP/1.1 a connection
    /// that silently stopped carrying anything (a partition, a middlebox
    /// that dropped it) holds its watch forever; the probe's missing answer
    /// is recorded as any request's, so the cluster turns unreachable as a
    /// member on HTTP/2 does when its ping goes unanswered. Unreachable
    /// clusters are probed by the health walk already.
    ///
    /// Each cluster is looked at on its own schedule, every
    /// [`LIVENESS_INTERVAL`] from a first look within that interval after
    /// its hand-over ([`first_look`]), and probed then if it needs
    /// it, so a fleet's probes spread over the interval rather than
    /// leaving together, and a tick touches only the clusters due: walking
    /// every cluster every second to find them was a fifth of a quiet
    /// fleet's CPU at 1,000 clusters. A cluster that comes to need probes
    /// (its answers now over HTTP/1.1, or ready again) is probed at its
    /// next look, within the interval, as a partition is found.
    fn probe_liveness(&self) {
        let now = Instant::now();
        let mut guard = lock(&self.inner.clusters);
        let tracked = &mut *guard;
        let mut due = Vec::new();
        while tracked
            .liveness
            .first()
            .is_some_and(|(look, _)| *look <= now)
        {
            let Some((look, name)) = tracked.liveness.pop_first() else {
                break;
            };
            let Some(held) = tracked.clusters.get_mut(&name) else {
                continue;
            };
            let progress = &mut held.data;
            if progress.next_liveness_probe != Some(look) {
                // Engaged again since: its new schedule has its own entry.
                continue;
            }
            let next = now + LIVENESS_INTERVAL;
            progress.next_liveness_probe = Some(next);
            tracked.liveness.insert((next, name));
            let watched = matches!(
                progress.state,
                ClusterState::Ready | ClusterState::Degraded(_)
            ) && held.cluster.lacks_pings();
            if watched {
                due.push(held.cluster.clone());
            }
        }
        drop(guard);
        for cluster in due {
            tokio::spawn(async move {
                // The request's own deadline ends it; this one only bounds
                // what a misbehaving client could hold.
                let _ = tokio::time::timeout(
                    LIVENESS_TIMEOUT * 2,
                    probe_server_within(&cluster, Some(LIVENESS_TIMEOUT)),
                )
                .await;
            });
        }
    }

    fn check_health(&self) {
        let options = &self.inner.options;
        let now = Instant::now();
        // Read before the walk: a change during it moves the number again.
        let changes = multicluster_core::health::failure_changes();
        let mut guard = lock(&self.inner.clusters);
        let tracked = &mut *guard;
        if tracked.quiet_at == Some(changes) {
            return;
        }
        let mut quiet = true;
        let Tracked {
            clusters, states, ..
        } = tracked;
        for (name, held) in clusters.iter_mut().filter(|(_, held)| held.data.handed()) {
            let progress = &mut held.data;
            let due = progress.due(&held.cluster, now, options);
            let state = due.as_ref().unwrap_or(&progress.state);
            quiet &= *state == ClusterState::Ready && held.cluster.failure().is_none();
            if matches!(
                state,
                ClusterState::Degraded(_) | ClusterState::Unreachable(_)
            ) {
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
                    // Unreachable for long: probed less and less often.
                    let unreachable_for = match &progress.state {
                        ClusterState::Unreachable(_) => progress.time_in_state(now),
                        _ => Duration::ZERO,
                    };
                    let cap = options
                        .long_outage
                        .cap(unreachable_for, options.max_retry_delay);
                    progress.next_probe = Some((now + delay, (delay * 2).min(cap)));
                }
            } else {
                progress.next_probe = None;
            }
            if let Some(state) = due {
                states.move_to(name, progress, state);
            }
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
            let mut guard = lock(&self.inner.clusters);
            let tracked = &mut *guard;
            if tracked.clusters.arrival(&name, &cluster, &lifetime) != Arrival::New {
                return Ok(());
            }
            let progress = Progress::syncing();
            // A replaced instance's lifetime ends here, so its components
            // let go even if the provider forgot to end it.
            let (held, replaced) =
                tracked
                    .clusters
                    .insert(name.clone(), cluster, &lifetime, progress);
            let engagement = (held.lifetime.clone(), held.generation);
            tracked.unchecked += 1;
            if let Some(mut old) = replaced {
                checked(&mut tracked.unchecked, &tracked.all_checked, &mut old.data);
                tracked.states.engaged(&name, Some(&old.data.state));
            } else {
                tracked.states.engaged(&name, None);
            }
            engagement
        };
        tokio::spawn(self.clone().bring_up(name.clone(), generation));
        let this = self.clone();
        when_ended(&ended, move || {
            let mut guard = lock(&this.inner.clusters);
            let tracked = &mut *guard;
            if let Some(mut gone) = tracked.clusters.end(&name, generation) {
                checked(&mut tracked.unchecked, &tracked.all_checked, &mut gone.data);
                tracked.states.ended(&name, &gone.data.state);
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

/// Whether the cluster's API server answers `/version`; the reason is
/// redacted (a failed credential plugin's settings never show). A server
/// that cannot be reached is named, as the cluster's request record names
/// it (clients built from kubeconfigs).
async fn probe_server(cluster: &Cluster) -> Result<(), Redacted> {
    probe_server_within(cluster, None).await
}

/// [`probe_server`], the request given `deadline` instead of the client's
/// (for clients whose requests are recorded, the failure is recorded too).
/// How long after its hand-over a cluster is first looked at for a
/// liveness probe: somewhere within [`LIVENESS_INTERVAL`], by a hash of its
/// name under this process's random seed. A fleet is handed over within a
/// second or two; its first probes (over HTTP/1.1, each opening the
/// cluster's second connection, the watch holding the first) left
/// together, 10,000 TLS handshakes at once.
fn first_look(name: &ClusterName) -> Duration {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let hash = SEED
        .get_or_init(std::collections::hash_map::RandomState::new)
        .hash_one(name);
    LIVENESS_INTERVAL.mul_f64((hash % 1_000 + 1) as f64 / 1_000.0)
}

async fn probe_server_within(
    cluster: &Cluster,
    deadline: Option<Duration>,
) -> Result<(), Redacted> {
    let mut request = http::Request::get("/version")
        .body(Vec::new())
        .map_err(|err| Redacted::new(format!("building the request: {err}")))?;
    if let Some(deadline) = deadline {
        request
            .extensions_mut()
            .insert(multicluster_core::health::RequestDeadline(deadline));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fleet handed over together is first looked at spread over the
    /// interval, each cluster within it.
    #[test]
    fn first_looks_spread_over_the_liveness_interval() {
        let looks: Vec<Duration> = (0..1_000)
            .map(|index| first_look(&ClusterName::from(format!("member-{index}"))))
            .collect();
        assert!(
            looks
                .iter()
                .all(|look| !look.is_zero() && *look <= LIVENESS_INTERVAL)
        );
        // In each tenth of the interval, some (about 100 each).
        for tenth in 0..10 {
            let (from, to) = (
                LIVENESS_INTERVAL * tenth / 10,
                LIVENESS_INTERVAL * (tenth + 1) / 10,
            );
            let within = looks
                .iter()
                .filter(|look| **look > from && **look <= to)
                .count();
            assert!((50..=150).contains(&within), "{within} in tenth {tenth}");
        }
        // The same name, the same look (one seed per process).
        assert_eq!(
            first_look(&ClusterName::from("member-7")),
            first_look(&ClusterName::from("member-7"))
        );
    }
}
