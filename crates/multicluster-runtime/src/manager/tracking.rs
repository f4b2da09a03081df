//! The fleet as the manager tracks it: each engaged cluster's way from
//! syncing to ready (or unreachable and retried), its state following its
//! health afterwards, and the per-state counts, changed in one place.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ClusterState, Manager};
use crate::engagements::{Arrival, Engagements, when_ended};
use crate::health::repeats::{Repeats, Telling};
use crate::redact::Redacted;
use crate::sync::lock;
use crate::{Aware, Cluster, ClusterName, Error};

/// How often engaged clusters' health is looked at.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The engaged clusters, and how many are in each state (kept as states
/// change, so publishing the counts never walks the fleet).
#[derive(Default)]
pub(super) struct Tracked {
    pub(super) clusters: Engagements<Progress>,
    pub(super) counts: [i64; 4],
    /// Set when a health walk found every engaged cluster well: the
    /// failure changes then. Until they move (or a cluster is engaged),
    /// walking again would find the same.
    pub(super) quiet_at: Option<u64>,
}

pub(super) struct Progress {
    pub(super) state: ClusterState,
    /// Whether it was handed to the components (it became ready once).
    pub(super) engaged: bool,
    /// When an unhealthy engaged cluster is probed next, and the delay
    /// after that.
    pub(super) next_probe: Option<(tokio::time::Instant, Duration)>,
}

impl Tracked {
    pub(super) fn count(&mut self, state: &ClusterState, by: i64) {
        self.counts[state.index()] += by;
    }

    /// Moves `name`'s engagement of `generation` to `state`: `None` when
    /// that engagement is gone, else whether its state (by label) changed.
    fn set_state(
        &mut self,
        name: &ClusterName,
        generation: u64,
        state: ClusterState,
    ) -> Option<bool> {
        let held = self.clusters.current_mut(name, generation)?;
        let changed = held.data.state.label() != state.label();
        held.data.move_to(state, &mut self.counts);
        Some(changed)
    }
}

impl Progress {
    /// The one place a state changes: the counts follow.
    fn move_to(&mut self, state: ClusterState, counts: &mut [i64; 4]) {
        counts[self.state.index()] -= 1;
        counts[state.index()] += 1;
        self.state = state;
    }
}

impl Manager {
    /// Brings an engaged cluster through syncing to ready (or unreachable
    /// and retried), then hands it to the coordinator.
    async fn bring_up(self, name: ClusterName, generation: u64) {
        let options = self.inner.options.clone();
        let mut delay = options.retry_delay;
        let mut told = Repeats::default();
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
                    // The cache did not sync in time: a watch's failure
                    // says why, if one failed.
                    Err(_) => Some(cluster.failure().map_or_else(
                        || Redacted::ours(format!("no answer within {:?}", options.sync_timeout)),
                        |failure| failure.reason,
                    )),
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
        let Some(changed) = tracked.set_state(name, generation, state) else {
            return false;
        };
        if changed {
            self.inner.metrics.state_changed(label);
        }
        self.inner.metrics.cluster_state(name, label);
        self.publish_states(&tracked);
        true
    }

    /// Updates the per-state cluster gauge.
    pub(super) fn publish_states(&self, tracked: &Tracked) {
        self.inner.metrics.cluster_states(tracked.counts);
    }

    /// Brings each engaged cluster's state in line with its health every
    /// [`HEALTH_CHECK_INTERVAL`] until `stop` fires.
    pub(super) async fn watch_health(self, stop: CancellationToken) {
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
        let Tracked {
            clusters, counts, ..
        } = tracked;
        for (name, held) in clusters.iter_mut().filter(|(_, held)| held.data.engaged) {
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
            self.inner.metrics.state_changed(state.label());
            self.inner.metrics.cluster_state(name, state.label());
            progress.move_to(state, counts);
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

/// Whether the cluster answers and its cache has synced.
async fn probe(cluster: &Cluster) -> Result<(), Redacted> {
    probe_server(cluster).await?;
    // Bounded by the caller's sync timeout.
    cluster.cache().synced().await;
    Ok(())
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
