//! One engaged cluster's way through its states, as the manager tracks it:
//! the rule that decides its next state once it is handed to the
//! components, and the history `/clusters` and the metrics report.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::ManagerOptions;
use crate::cluster::Cluster;
use multicluster_core::redact::Redacted;
use multicluster_core::{ClusterState, ClusterStatus};

/// A moment by the runtime's clock (to measure) and the wall clock (to show).
#[derive(Clone, Copy, Debug)]
pub(super) struct Moment {
    pub(super) at: Instant,
    pub(super) wall: SystemTime,
}

impl Moment {
    pub(super) fn now() -> Self {
        Self {
            at: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// `instant` on the wall clock, taking this moment as now.
    fn wall_time_of(&self, instant: Instant) -> SystemTime {
        if instant >= self.at {
            self.wall + (instant - self.at)
        } else {
            self.wall - (self.at - instant)
        }
    }
}

pub(super) struct Progress {
    pub(super) state: ClusterState,
    /// When it entered its state.
    entered: Moment,
    /// When it was handed to the components (its API server had answered);
    /// from then on the health walk follows it.
    handed_at: Option<Instant>,
    /// While it is brought up: the checks of its API server that failed in
    /// a row, and when the next is due.
    checks_failed: u32,
    next_check: Option<Instant>,
    /// When an unhealthy engaged cluster is probed next, and the delay
    /// after that.
    pub(super) next_probe: Option<(Instant, Duration)>,
    /// When it is next looked at, once handed over, for a probe of
    /// whether it answers (made if its connections have no pings): its
    /// entry in `Tracked::liveness`.
    pub(super) next_liveness_probe: Option<Instant>,
    /// Not checked yet: neither handed to the coordinator nor found
    /// unreachable (counted in `Tracked::unchecked`).
    pub(super) unchecked: bool,
}

impl Progress {
    /// A cluster just engaged by the provider.
    pub(super) fn syncing() -> Self {
        Self {
            state: ClusterState::Syncing,
            entered: Moment::now(),
            handed_at: None,
            checks_failed: 0,
            next_check: None,
            next_probe: None,
            next_liveness_probe: None,
            unchecked: true,
        }
    }

    /// Whether it was handed to the components.
    pub(super) fn handed(&self) -> bool {
        self.handed_at.is_some()
    }

    /// It is being handed to the components now.
    pub(super) fn hand_over(&mut self) {
        self.handed_at = Some(Instant::now());
        self.checks_failed = 0;
        self.next_check = None;
    }

    /// A check of its API server while it is brought up failed; the next
    /// is due at `next`.
    pub(super) fn check_failed(&mut self, next: Instant) {
        self.checks_failed = self.checks_failed.saturating_add(1);
        self.next_check = Some(next);
    }

    /// The state a handed-over cluster is due to move to, if any: a
    /// failure of its client or watches that lasted `unhealthy_after`
    /// decides it; without one, it is ready once every watch its
    /// components started has listed, and unreachable when they have not
    /// within `sync_timeout` of the hand-over. A watch started later (a
    /// component added, a source turned on) that has not listed yet does
    /// not take a ready cluster out of ready unless it fails.
    pub(super) fn due(
        &self,
        cluster: &Cluster,
        now: Instant,
        options: &ManagerOptions,
    ) -> Option<ClusterState> {
        let state = match cluster.failure() {
            Some(failure) if now.duration_since(failure.since) >= options.unhealthy_after => {
                ClusterState::from(failure.health())
            }
            // Too young to tell a lasting failure from a passing one.
            Some(_) => return None,
            None if cluster.cache().is_synced() => ClusterState::Ready,
            None => {
                let handed_at = self.handed_at?;
                if self.state != ClusterState::Syncing
                    || now.duration_since(handed_at) < options.sync_timeout
                {
                    return None;
                }
                ClusterState::Unreachable(Redacted::new(format!(
                    "its watches have not listed within {:?}",
                    options.sync_timeout
                )))
            }
        };
        (state != self.state).then_some(state)
    }

    /// Takes `state` ([`States::move_to`](super::tracking::States::move_to)
    /// is the only caller, and keeps the counts): a new state (not a new
    /// reason for the same one) starts its time.
    pub(super) fn enter(&mut self, state: ClusterState) {
        if state.label() != self.state.label() {
            self.entered = Moment::now();
        }
        self.state = state;
    }

    /// How long it has been in its state.
    pub(super) fn time_in_state(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.entered.at)
    }

    /// Its state and history, `cluster` being the cluster it tracks.
    pub(super) fn status(&self, cluster: &Cluster, now: Moment) -> ClusterStatus {
        let (failed_attempts, next) = match &self.state {
            ClusterState::Unreachable(_) if !self.handed() => (self.checks_failed, self.next_check),
            ClusterState::Degraded(_) | ClusterState::Unreachable(_) => {
                // The failure that decides the state may be a request's,
                // which is tried again when its caller asks; what is known
                // ahead is when a watch is retried and when the server is
                // probed.
                let attempts = cluster.failure().map_or(0, |failure| failure.attempts);
                let probe = self.next_probe.map(|(due, _)| due);
                let retry = cluster.cache().next_retry();
                (attempts, retry.into_iter().chain(probe).min())
            }
            _ => (0, None),
        };
        ClusterStatus::from_parts(
            self.state.clone(),
            self.entered.wall,
            failed_attempts,
            next.map(|at| now.wall_time_of(at)),
        )
    }
}
