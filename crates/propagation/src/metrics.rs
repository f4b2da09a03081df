//! The propagation's own metrics, registered next to its controller's in
//! the manager's registry once it runs: members by state, a paced
//! rollout's progress, and how long a member takes from a new revision to
//! available. `config/monitoring/propagation.json` is their dashboard
//! row.

use std::collections::HashMap;
use std::time::Duration;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use multicluster_runtime::metrics::Metrics;

use super::HubKey;
use super::outcomes::STATE_COUNT;
use super::record::RolloutStatus;
use super::status::MemberState;

type Labels = Vec<(&'static str, String)>;

/// Every state a member can be in, in the order of `MemberState`, for
/// gauges that go back to zero.
const STATES: [MemberState; STATE_COUNT] = [
    MemberState::InSync,
    MemberState::Progressing,
    MemberState::Pending,
    MemberState::NotEngaged,
    MemberState::Drifted,
    MemberState::Conflict,
    MemberState::Degraded,
    MemberState::Failed,
];

/// One propagation's metric families.
pub(super) struct PropagationMetrics {
    name: String,
    members: Family<Labels, Gauge>,
    /// `members`' series, by `MemberState as usize`.
    by_state: Vec<Gauge>,
    rollout: Family<Labels, Gauge>,
    halted: Family<Labels, Gauge>,
    /// Hub objects by their rollout's phase.
    phases: Family<Labels, Gauge>,
    to_available: Family<Labels, Histogram>,
}

impl PropagationMetrics {
    /// The families of the propagation `name`, registered in `metrics`.
    pub(super) fn register(name: &str, metrics: &Metrics) -> Self {
        let members = Family::<Labels, Gauge>::default();
        let by_state = STATES
            .iter()
            .map(|state| {
                members
                    .get_or_create(&vec![
                        ("propagation", name.to_string()),
                        ("state", state.as_str().to_string()),
                    ])
                    .clone()
            })
            .collect();
        let this = Self {
            name: name.to_string(),
            members,
            by_state,
            rollout: Family::default(),
            halted: Family::default(),
            phases: Family::default(),
            to_available: Family::new_with_constructor(
                (|| Histogram::new(exponential_buckets(0.5, 2.0, 14))) as fn() -> Histogram,
            ),
        };
        metrics.register(|registry| {
            registry.register(
                "mcr_propagation_members",
                "Members of the propagation's hub objects, by state (a member counts once per hub object)",
                this.members.clone(),
            );
            registry.register(
                "mcr_propagation_rollout_members",
                "Members of the propagation's paced rollouts by phase: updated, updating (holding a slot), remaining",
                this.rollout.clone(),
            );
            registry.register(
                "mcr_propagation_rollouts_halted",
                "Hub objects whose paced rollout is halted by failures",
                this.halted.clone(),
            );
            registry.register(
                "mcr_propagation_rollouts",
                "Hub objects of the propagation's paced rollouts by phase: rolling_out, waiting (paused, an approval), halted, rolling_back, complete",
                this.phases.clone(),
            );
            registry.register(
                "mcr_propagation_time_to_available_seconds",
                "From a member starting on a new revision of a hub object to everything it got available",
                this.to_available.clone(),
            );
        });
        this
    }

    fn labels(&self, more: Option<(&'static str, &str)>) -> Labels {
        let mut labels = vec![("propagation", self.name.clone())];
        if let Some((key, value)) = more {
            labels.push((key, value.to_string()));
        }
        labels
    }

    /// Sets the members of every hub object by state (`counts`, indexed
    /// by `MemberState as usize`).
    pub(super) fn members_now(&self, counts: [i64; STATE_COUNT]) {
        for (gauge, count) in self.by_state.iter().zip(counts) {
            gauge.set(count);
        }
    }

    /// Sums up the paced rollouts of every hub object.
    pub(super) fn rollouts_now(&self, rollouts: &HashMap<HubKey, RolloutStatus>) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let (mut updated, mut updating, mut remaining, mut halted) = (0, 0, 0, 0);
        for rollout in rollouts.values() {
            updated += count(rollout.updated);
            updating += count(rollout.updating.len());
            remaining += count(rollout.remaining);
            halted += i64::from(rollout.halted.is_some());
        }
        for (phase, value) in [
            ("updated", updated),
            ("updating", updating),
            ("remaining", remaining),
        ] {
            self.rollout
                .get_or_create(&self.labels(Some(("phase", phase))))
                .set(value);
        }
        self.halted.get_or_create(&self.labels(None)).set(halted);
        let mut phases = [0i64; PHASES.len()];
        for rollout in rollouts.values() {
            phases[phase_of(rollout)] += 1;
        }
        for (phase, value) in PHASES.iter().zip(phases) {
            self.phases
                .get_or_create(&self.labels(Some(("phase", phase))))
                .set(value);
        }
    }

    /// A member took `took` from starting on a new revision to available.
    pub(super) fn became_available(&self, took: Duration) {
        self.to_available
            .get_or_create(&self.labels(None))
            .observe(took.as_secs_f64());
    }
}

/// The phases of `mcr_propagation_rollouts`, each hub object in one.
const PHASES: [&str; 5] = [
    "rolling_out",
    "waiting",
    "halted",
    "rolling_back",
    "complete",
];

/// Where a rollout is, as an index into [`PHASES`]: halted before all,
/// then waiting, then done (a roll back done is complete), then rolling
/// back.
fn phase_of(rollout: &RolloutStatus) -> usize {
    if rollout.halted.is_some() {
        2
    } else if rollout.waiting.is_some() {
        1
    } else if rollout.is_complete() {
        4
    } else if rollout.rolling_back.is_some() {
        3
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::record::RolloutStatus;

    /// The dashboard in `config/monitoring/propagation.json` names only
    /// metrics this module exports, in expressions Prometheus accepts
    /// (its own parser: the workspace's `hack/monitoring` checker).
    #[test]
    fn the_dashboard_names_only_exported_metrics() {
        let metrics = Metrics::default();
        let exported = PropagationMetrics::register("p", &metrics);
        let key: HubKey = (Some("default".into()), "hub".into());
        for (index, state) in STATES.iter().enumerate() {
            assert_eq!(*state as usize, index, "STATES follows MemberState");
        }
        exported.members_now([0; STATE_COUNT]);
        exported.rollouts_now(&HashMap::from([(key, RolloutStatus::default())]));
        exported.became_available(Duration::from_secs(3));
        let text = metrics.encode();
        assert!(
            text.contains(r#"mcr_propagation_time_to_available_seconds_count{propagation="p"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"mcr_propagation_rollouts{propagation="p",phase="complete"} 1"#)
                && text.contains(r#"mcr_propagation_rollouts{propagation="p",phase="halted"} 0"#),
            "{text}"
        );
        let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let checker =
            multicluster_envtest::monitoring::checker(&repository.join("hack/monitoring/build.sh"))
                .unwrap_or_else(|err| panic!("{err}"));
        let scratch =
            std::env::temp_dir().join(format!("propagation-metrics-{}", std::process::id()));
        std::fs::write(&scratch, text).expect("write");
        let (passed, said) = multicluster_envtest::monitoring::check(
            &checker,
            &scratch,
            &[repository.join("config/monitoring/propagation.json")],
        );
        let _ = std::fs::remove_file(&scratch);
        assert!(passed && said.contains("expressions checked"), "{said}");
    }
}
