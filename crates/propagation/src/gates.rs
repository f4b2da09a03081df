//! Gates between stages: a stage of a staged rollout may wait, before its
//! first member is given a slot, for a condition someone else writes on
//! the hub object (a validator's `SmokeTestsPassed`), for the
//! propagation's own check ([`Propagation::check_gates_with`](crate::Propagation::check_gates_with)),
//! or for a Job it creates in the hub to complete. A gate that fails, or
//! waits past its timeout, counts against the rollout's failure budget,
//! as a failed member does. Each gate is decided once per revision: once
//! passed (or failed), what it says later does not move the stage back.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use serde_json::Value;

use crate::record::{GateState, GateStatus};
use crate::{HubKey, PROPAGATION_LABEL, REVISION_ANNOTATION};
use multicluster_runtime::Cluster;
use multicluster_runtime::redact::Redacted;

/// How often a gate that waits is looked at again (a Job's status, the
/// propagation's check, a timeout); a condition on the hub object is
/// looked at as soon as the hub object changes.
pub(crate) const GATE_RECHECK: Duration = Duration::from_secs(2);

/// The variables set in every container of a gate's Job: which hub
/// object, revision and stage it validates.
pub const GATE_JOB_ENV: [&str; 4] = [
    "MCR_HUB_NAMESPACE",
    "MCR_HUB_NAME",
    "MCR_REVISION",
    "MCR_STAGE",
];

/// What a stage waits for before its first member is given a slot
/// ([`Stage::gated_by`](crate::Stage::gated_by)).
#[derive(Clone, Debug)]
pub struct Gate {
    kind: GateKind,
    timeout: Option<Duration>,
}

#[derive(Clone, Debug)]
enum GateKind {
    Condition { type_: String, status: String },
    Checked,
    Job(Box<Job>),
}

/// What a gate says now.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateCheck {
    /// The stage may start.
    Passed,
    /// Not yet; why (shown in the rollout's `waiting`).
    Waiting(String),
    /// Failed: counts against the failure budget; why.
    Failed(String),
}

impl Gate {
    /// The condition `type_` on the hub object's `status.conditions`,
    /// `True` and written for the hub object's generation
    /// (`observedGeneration`), as a validator leaves it. `False` there
    /// fails the gate; missing, `Unknown` or for an older generation, it
    /// waits.
    pub fn condition(type_: impl Into<String>) -> Self {
        Self::condition_status(type_, "True")
    }

    /// The condition `type_` with `status` (`"False"` for a condition
    /// that says something is wrong, such as `Degraded`); the other of
    /// `True` and `False` fails the gate.
    pub fn condition_status(type_: impl Into<String>, status: impl Into<String>) -> Self {
        Self {
            kind: GateKind::Condition {
                type_: type_.into(),
                status: status.into(),
            },
            timeout: None,
        }
    }

    /// The propagation's own check
    /// ([`Propagation::check_gates_with`](crate::Propagation::check_gates_with)),
    /// asked with the hub object, the stage's name and the revision.
    pub fn checked() -> Self {
        Self {
            kind: GateKind::Checked,
            timeout: None,
        }
    }

    /// A Job made from `job` in the hub (in `job`'s namespace, or the hub
    /// object's, or `default` for a cluster-scoped one), once per hub
    /// object, stage and revision, owned by the hub object where it may
    /// be (the same namespace, or a cluster-scoped hub object); the gate
    /// passes when the Job is `Complete` and fails when it is `Failed`.
    /// Its name is made here (`job`'s is ignored), and each container gets
    /// the variables [`GATE_JOB_ENV`]: the hub object's namespace and name,
    /// the revision and the stage. The hub identity needs `create` and
    /// `get` on `jobs` there.
    pub fn job(job: Job) -> Self {
        Self {
            kind: GateKind::Job(Box::new(job)),
            timeout: None,
        }
    }

    /// Fails the gate if it has not passed this long after its stage
    /// came up (default: it waits for ever, a Job bounded by its own
    /// `activeDeadlineSeconds`).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    pub(crate) fn timeout_of(&self) -> Option<Duration> {
        self.timeout
    }

    /// Whether the gate asks the propagation's check.
    pub(crate) fn is_checked(&self) -> bool {
        matches!(self.kind, GateKind::Checked)
    }

    /// What the gate says now of `hub` (as JSON) at `revision`; a Job
    /// gate reads, or first creates, its Job.
    pub(crate) async fn check(
        &self,
        at: &GateAt<'_>,
        checked: impl FnOnce() -> Option<GateCheck>,
    ) -> GateCheck {
        match &self.kind {
            GateKind::Condition { type_, status } => condition_check(at.hub, type_, status),
            GateKind::Checked => checked().unwrap_or_else(|| {
                GateCheck::Failed(format!(
                    "stage {}: a checked gate needs Propagation::check_gates_with",
                    at.stage
                ))
            }),
            GateKind::Job(job) => job_check(at, job).await,
        }
    }
}

/// Where a gate is checked: the hub object and the rollout's place.
pub(crate) struct GateAt<'a> {
    pub(crate) hub_cluster: &'a Cluster,
    pub(crate) propagation: &'a str,
    pub(crate) key: &'a HubKey,
    pub(crate) hub: &'a Value,
    pub(crate) stage: &'a str,
    pub(crate) revision: &'a str,
}

/// The gate of stage `stage` after this step: as `before` left it if it
/// passed or failed already; else what `check` says now, failed once
/// `timeout` has passed since it came up.
pub(crate) fn decide(
    stage: &str,
    before: Option<&GateStatus>,
    check: Option<&GateCheck>,
    timeout: Option<Duration>,
    now: Timestamp,
) -> GateStatus {
    if let Some(before) = before.filter(|before| before.state != GateState::Waiting) {
        return before.clone();
    }
    let since = before.map_or_else(
        || Time(now.round(k8s_openapi::jiff::Unit::Second).unwrap_or(now)),
        |before| before.since.clone(),
    );
    let waited = Duration::try_from(now.duration_since(since.0)).unwrap_or_default();
    let (state, reason) = match check {
        Some(GateCheck::Passed) => (GateState::Passed, None),
        Some(GateCheck::Failed(why)) => (GateState::Failed, Some(why.clone())),
        waiting => {
            let why = match waiting {
                Some(GateCheck::Waiting(why)) => why.clone(),
                _ => "not looked at yet".to_string(),
            };
            match timeout.filter(|timeout| waited > *timeout) {
                Some(timeout) => (
                    GateState::Failed,
                    Some(format!(
                        "not passed within its timeout of {}s: {why}",
                        timeout.as_secs()
                    )),
                ),
                None => (GateState::Waiting, Some(why)),
            }
        }
    };
    GateStatus {
        stage: stage.to_string(),
        since,
        state,
        reason,
    }
}

/// The condition `type_` of `hub`'s status against `wanted`.
fn condition_check(hub: &Value, type_: &str, wanted: &str) -> GateCheck {
    let condition = hub
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == type_));
    let Some(condition) = condition else {
        return GateCheck::Waiting(format!("condition {type_} not written yet"));
    };
    if let Some(generation) = hub.pointer("/metadata/generation").and_then(Value::as_i64) {
        match condition["observedGeneration"].as_i64() {
            Some(observed) if observed == generation => {}
            Some(observed) => {
                return GateCheck::Waiting(format!(
                    "condition {type_} is for generation {observed}, not {generation}"
                ));
            }
            None => {
                return GateCheck::Waiting(format!(
                    "condition {type_} has no observedGeneration (it must say it was written for generation {generation})"
                ));
            }
        }
    }
    let status = condition["status"].as_str().unwrap_or_default();
    let told = |key: &str| condition[key].as_str().unwrap_or_default().to_string();
    if status == wanted {
        GateCheck::Passed
    } else if matches!(status, "True" | "False") {
        GateCheck::Failed(format!(
            "condition {type_} is {status} ({}: {})",
            told("reason"),
            told("message")
        ))
    } else {
        GateCheck::Waiting(format!("condition {type_} is {status:?}"))
    }
}

/// The Job of a gate, read, or created if it is not there yet.
async fn job_check(at: &GateAt<'_>, template: &Job) -> GateCheck {
    let job = job_for(at, template);
    let namespace = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let api = Api::<Job>::namespaced(at.hub_cluster.client(), &namespace);
    let found = match api.get_opt(&name).await {
        Ok(Some(found)) => found,
        Ok(None) => match api.create(&PostParams::default(), &job).await {
            Ok(_) => return GateCheck::Waiting(format!("Job {namespace}/{name} created")),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return GateCheck::Waiting(format!("Job {namespace}/{name} created"));
            }
            Err(err) => {
                return GateCheck::Waiting(format!(
                    "cannot create Job {namespace}/{name}: {}",
                    Redacted::kube(&err).as_str()
                ));
            }
        },
        Err(err) => {
            return GateCheck::Waiting(format!(
                "cannot read Job {namespace}/{name}: {}",
                Redacted::kube(&err).as_str()
            ));
        }
    };
    let conditions = found
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref());
    let holds = |type_: &str| {
        conditions
            .into_iter()
            .flatten()
            .find(|condition| condition.type_ == type_ && condition.status == "True")
    };
    if holds("Complete").is_some() {
        GateCheck::Passed
    } else if let Some(failed) = holds("Failed") {
        GateCheck::Failed(format!(
            "Job {namespace}/{name} failed ({}: {})",
            failed.reason.as_deref().unwrap_or_default(),
            failed.message.as_deref().unwrap_or_default()
        ))
    } else {
        GateCheck::Waiting(format!("Job {namespace}/{name} has not completed"))
    }
}

/// The gate's Job for the hub object, stage and revision of `at`.
fn job_for(at: &GateAt<'_>, template: &Job) -> Job {
    let mut job = template.clone();
    let hub_namespace = at.key.0.as_deref();
    let namespace = job
        .metadata
        .namespace
        .clone()
        .or_else(|| hub_namespace.map(str::to_string))
        .unwrap_or_else(|| "default".to_string());
    // An owner in another namespace is not allowed; a cluster-scoped one
    // is.
    let owned = hub_namespace.is_none_or(|hub| hub == namespace);
    job.metadata.name = Some(job_name(at.propagation, at.key, at.stage, at.revision));
    job.metadata.namespace = Some(namespace);
    job.metadata.generate_name = None;
    job.metadata.resource_version = None;
    job.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(PROPAGATION_LABEL.to_string(), at.propagation.to_string());
    job.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .extend([
            (REVISION_ANNOTATION.to_string(), at.revision.to_string()),
            (STAGE_ANNOTATION.to_string(), at.stage.to_string()),
        ]);
    if owned && let Some(owner) = crate::history::owner_of(at.hub) {
        job.metadata.owner_references = Some(vec![owner]);
    }
    let values = [
        hub_namespace.unwrap_or_default(),
        at.key.1.as_str(),
        at.revision,
        at.stage,
    ];
    if let Some(pod) = job
        .spec
        .as_mut()
        .and_then(|spec| spec.template.spec.as_mut())
    {
        for container in &mut pod.containers {
            let env = container.env.get_or_insert_with(Vec::new);
            env.retain(|var| !GATE_JOB_ENV.contains(&var.name.as_str()));
            env.extend(GATE_JOB_ENV.iter().zip(values).map(|(name, value)| EnvVar {
                name: (*name).to_string(),
                value: Some(value.to_string()),
                ..EnvVar::default()
            }));
        }
    }
    job
}

/// The annotation on a gate's Job naming the stage it gates.
const STAGE_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/stage";

/// `<propagation>-<hub>-<stage>-<revision>`, lower case, shortened with a
/// digest past the 63 characters a Job's name may have (its pods carry it
/// in a label).
fn job_name(propagation: &str, key: &HubKey, stage: &str, revision: &str) -> String {
    let whole = format!("{propagation}-{}-{stage}-{revision}", key.1).to_ascii_lowercase();
    let named: String = whole
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let digest = format!(
        "{:016x}",
        crate::digest::fnv1a(format!("{:?}/{whole}", key.0).as_bytes())
    );
    if named.len() <= 63 && named == whole {
        return named;
    }
    let kept: String = named.chars().take(46).collect();
    format!("{}-{digest}", kept.trim_end_matches('-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hub(conditions: Value) -> Value {
        json!({"metadata": {"name": "web", "generation": 4}, "status": {"conditions": conditions}})
    }

    #[test]
    fn a_condition_passes_only_for_the_hub_objects_generation() {
        let check =
            |conditions: Value| condition_check(&hub(conditions), "SmokeTestsPassed", "True");
        assert_eq!(
            check(json!([{"type": "SmokeTestsPassed", "status": "True", "observedGeneration": 4}])),
            GateCheck::Passed
        );
        assert!(matches!(
            check(json!([{"type": "SmokeTestsPassed", "status": "True", "observedGeneration": 3}])),
            GateCheck::Waiting(why) if why.contains("generation 3, not 4")
        ));
        assert!(matches!(
            check(json!([{"type": "SmokeTestsPassed", "status": "True"}])),
            GateCheck::Waiting(why) if why.contains("no observedGeneration")
        ));
        assert!(matches!(
            check(json!([{"type": "SmokeTestsPassed", "status": "False", "observedGeneration": 4,
                          "reason": "Errors", "message": "3 of 20 failed"}])),
            GateCheck::Failed(why) if why.contains("3 of 20 failed")
        ));
        assert!(matches!(
            check(
                json!([{"type": "SmokeTestsPassed", "status": "Unknown", "observedGeneration": 4}])
            ),
            GateCheck::Waiting(_)
        ));
        assert!(matches!(check(json!([])), GateCheck::Waiting(why) if why.contains("not written")));
    }

    #[test]
    fn a_gate_is_decided_once_and_fails_past_its_timeout() {
        let now = Timestamp::now();
        let later = |seconds: i64| now + k8s_openapi::jiff::SignedDuration::from_secs(seconds);
        let timeout = Some(Duration::from_secs(60));
        let waiting = GateCheck::Waiting("Job has not completed".into());
        let first = decide("main", None, Some(&waiting), timeout, now);
        assert_eq!(first.state, GateState::Waiting);
        // Still waiting within the timeout, since when it came up.
        let second = decide("main", Some(&first), Some(&waiting), timeout, later(30));
        assert_eq!(
            (second.state, &second.since),
            (GateState::Waiting, &first.since)
        );
        let timed_out = decide("main", Some(&second), Some(&waiting), timeout, later(61));
        assert_eq!(timed_out.state, GateState::Failed);
        assert!(
            timed_out
                .reason
                .as_deref()
                .unwrap_or_default()
                .contains("timeout of 60s")
        );
        // Passed, it stays passed whatever the gate says later.
        let passed = decide(
            "main",
            Some(&first),
            Some(&GateCheck::Passed),
            timeout,
            later(1),
        );
        assert_eq!(passed.state, GateState::Passed);
        let failing = GateCheck::Failed("no".into());
        assert_eq!(
            decide("main", Some(&passed), Some(&failing), timeout, later(2)),
            passed
        );
    }

    #[test]
    fn a_jobs_name_is_a_valid_label_value_and_apart_per_revision() {
        let key: HubKey = (Some("team".into()), "web".into());
        assert_eq!(job_name("roll", &key, "main", "7"), "roll-web-main-7");
        let long: HubKey = (None, "Very_Long".repeat(12));
        let (a, b) = (
            job_name("roll", &long, "Main Ring", "7"),
            job_name("roll", &long, "Main Ring", "8"),
        );
        assert!(a.len() <= 63 && b.len() <= 63, "{a}");
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a}"
        );
    }
}
