//! Paced rollouts: how a new revision of a hub object reaches its members.
//! All at once (the default), or a few members at a time
//! ([`Rollout::rolling`]), stage after stage ([`Rollout::staged`]): a
//! member gets the new revision only once it is given a slot, and keeps
//! the slot until what it got is available and has stayed so for the
//! soak time.
//!
//! The state is on the hub object (`status.rollout`, or the annotation
//! `<status annotation>-rollout`): the revision rolled out and the members
//! holding a slot, each since when. A slot is given by writing it there
//! with the hub object's `resourceVersion` as a precondition, so however
//! many controllers take part (one restarted, a new leader, shards), no
//! more slots are out than the rollout allows. Every applied object
//! carries the revision it was applied at ([`REVISION_ANNOTATION`]), so a
//! member that has the new revision is known as such after a restart.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::core::{Selector, SelectorExt};
use serde_json::Value;

use crate::gates::Gate;
use crate::windows::Window;
use multicluster_runtime::ClusterName;

/// Annotation on every object the propagation applies: the revision of the
/// hub object it was applied at (its `metadata.generation`, or a digest of
/// it for types without one).
pub const REVISION_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/revision";

/// Annotation on a hub object that pauses its rollout while it is `"true"`:
/// no member is given a slot; those holding one go on.
pub const PAUSE_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/paused";

/// Annotation on a hub object approving stages of its rollout: a
/// comma-separated list of `<stage>@<revision>` (the revision the hub
/// object's status names), so an approval never carries over to the next
/// revision.
pub const APPROVAL_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/approved";

/// Annotation on a hub object: the revision (from its history, see
/// `RolloutStatus::last_complete` and the members' `revision`) its
/// members are rolled back to, paced as a rollout is, for as long as the
/// annotation stays. Removed, the hub object's own revision rolls out
/// again.
pub const ROLL_BACK_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/roll-back-to";

/// How long a member may hold a slot without what it got becoming
/// available, by default (the Deployment controller's own default).
const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);

/// How many members may be changing at once: given the new revision and
/// not yet available with it (and soaked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MaxUnavailable {
    /// At most this many (at least one).
    Count(usize),
    /// This share of the selected members, rounded down, at least one.
    Percent(u8),
}

impl MaxUnavailable {
    /// From a Kubernetes `IntOrString`, as a Deployment's `maxUnavailable`
    /// is written: a count (`2`) or a percentage of the members (`"25%"`).
    /// Anything else (a negative count, a string without `%`, a percentage
    /// over 100) is refused, naming what was given.
    pub fn from_int_or_string(
        value: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
    ) -> Result<Self, String> {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        match value {
            IntOrString::Int(count) => usize::try_from(*count)
                .map(MaxUnavailable::Count)
                .map_err(|_| format!("maxUnavailable {count}: a count may not be negative")),
            IntOrString::String(text) => text
                .strip_suffix('%')
                .and_then(|percent| percent.trim().parse::<u8>().ok())
                .filter(|percent| *percent <= 100)
                .map(MaxUnavailable::Percent)
                .ok_or_else(|| {
                    format!(
                        "maxUnavailable {text:?}: expected a count or a percentage such as \"25%\""
                    )
                }),
        }
    }

    /// The slots for a rollout over `members` members.
    pub(crate) fn slots(self, members: usize) -> usize {
        let slots = match self {
            MaxUnavailable::Count(count) => count,
            MaxUnavailable::Percent(percent) => members * usize::from(percent.min(100)) / 100,
        };
        slots.max(1)
    }
}

/// A stage of a staged rollout: the members it holds, and whether it waits
/// for an approval before its first member is given a slot.
#[derive(Clone, Debug)]
pub struct Stage {
    name: String,
    members: StageMembers,
    approval: bool,
    gate: Option<Gate>,
}

#[derive(Clone, Debug)]
enum StageMembers {
    Labelled(Selector),
    Named(BTreeSet<ClusterName>),
}

impl Stage {
    /// The members whose cluster labels `selector` matches.
    pub fn labelled(name: impl Into<String>, selector: Selector) -> Self {
        Self {
            name: name.into(),
            members: StageMembers::Labelled(selector),
            approval: false,
            gate: None,
        }
    }

    /// The members named.
    pub fn named(
        name: impl Into<String>,
        members: impl IntoIterator<Item = impl Into<ClusterName>>,
    ) -> Self {
        Self {
            name: name.into(),
            members: StageMembers::Named(members.into_iter().map(Into::into).collect()),
            approval: false,
            gate: None,
        }
    }

    /// The stage starts only once approved, for the revision rolled out:
    /// by [`APPROVAL_ANNOTATION`] on the hub object, or by the propagation's
    /// [`approve_with`](crate::Propagation::approve_with).
    #[must_use]
    pub fn needs_approval(mut self) -> Self {
        self.approval = true;
        self
    }

    /// The stage starts only once `gate` passes for the revision rolled
    /// out (before its approval, if it needs one): a condition on the hub
    /// object, the propagation's check or a Job (see [`Gate`]). A gate
    /// that fails or times out counts against the failure budget. A roll
    /// back passes no gate: it goes back to what was available.
    #[must_use]
    pub fn gated_by(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    fn holds(
        &self,
        name: &ClusterName,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        match &self.members {
            StageMembers::Labelled(selector) => selector.matches(labels),
            StageMembers::Named(names) => names.contains(name),
        }
    }
}

/// How a new revision of a hub object reaches its members
/// ([`Propagation::rollout`](crate::Propagation::rollout)).
///
/// Its state is kept on the hub object, so a restarted controller, a new
/// leader or two controllers at once never give out more slots than
/// allowed. Replicas sharing the fleet (a sharded coordinator) each give
/// slots to their own members, counting the others' from the record
/// ([`RolloutStatus::replicas`](crate::RolloutStatus::replicas)).
#[derive(Clone, Debug)]
pub struct Rollout {
    pace: Pace,
    soak: Duration,
    progress_deadline: Duration,
    failure_budget: usize,
    surge: usize,
    on_failure: OnFailure,
    windows: Vec<Window>,
}

/// What a paced rollout does once more members fail than its failure
/// budget allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFailure {
    /// Halt: no member is given a slot until enough of them recover or a
    /// new revision comes (the default).
    #[default]
    Halt,
    /// Roll back: the members that took the failed revision go back to
    /// the last revision that reached every member (kept in the hub
    /// object's revision history), paced by the same bound and health
    /// gate. The hub object keeps the failed revision's spec; a new
    /// revision rolls out as usual.
    RollBack,
}

#[derive(Clone, Debug)]
enum Pace {
    AllAtOnce,
    Paced {
        max_unavailable: MaxUnavailable,
        stages: Vec<Stage>,
    },
}

impl Default for Rollout {
    fn default() -> Self {
        Self::all_at_once()
    }
}

impl Rollout {
    /// Every selected member gets a new revision at once (the default).
    pub fn all_at_once() -> Self {
        Self {
            pace: Pace::AllAtOnce,
            soak: Duration::ZERO,
            progress_deadline: DEFAULT_PROGRESS_DEADLINE,
            failure_budget: 0,
            surge: 0,
            on_failure: OnFailure::Halt,
            windows: Vec::new(),
        }
    }

    /// At most `max_unavailable` members changing at once, in the order of
    /// their names.
    pub fn rolling(max_unavailable: MaxUnavailable) -> Self {
        Self::staged(Vec::new(), max_unavailable)
    }

    /// Stage after stage, each rolling with at most `max_unavailable`
    /// members changing at once; a stage starts once every member of the
    /// stages before has the revision, available (an approval may be
    /// needed too). A member is in the first stage that holds it; members
    /// in none form a last stage of their own.
    pub fn staged(
        stages: impl IntoIterator<Item = Stage>,
        max_unavailable: MaxUnavailable,
    ) -> Self {
        Self {
            pace: Pace::Paced {
                max_unavailable,
                stages: stages.into_iter().collect(),
            },
            ..Self::all_at_once()
        }
    }

    /// How long a member must stay available with the new revision before
    /// its slot goes to the next (default: none).
    #[must_use]
    pub fn soak(mut self, soak: Duration) -> Self {
        self.soak = soak;
        self
    }

    /// How long a member may hold a slot without becoming available before
    /// it counts as failed (default ten minutes). A member that left the
    /// fleet while holding a slot (or that this controller does not see)
    /// keeps it this long too, then gives it back without counting as
    /// failed: until then it may still be changing, and a controller that
    /// has just started does not see every member at once. One seen out of
    /// the selection gives its slot back at once.
    #[must_use]
    pub fn progress_deadline(mut self, deadline: Duration) -> Self {
        self.progress_deadline = deadline;
        self
    }

    /// How many members holding a slot may fail (degraded, failed, or past
    /// the progress deadline) before the rollout halts (default none: the
    /// first failure halts it). A halted rollout gives no slot until
    /// enough of them recover or a new revision comes.
    #[must_use]
    pub fn failure_budget(mut self, failures: usize) -> Self {
        self.failure_budget = failures;
        self
    }

    /// What the rollout does past its failure budget (default
    /// [`OnFailure::Halt`]).
    #[must_use]
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// Members change only within `window` (an allow window), or never
    /// within it (a deny window, a freeze); call again for more. A member
    /// outside the rollout's windows or its own
    /// ([`WINDOWS_ANNOTATION`](crate::WINDOWS_ANNOTATION)) is `Pending`
    /// with the time they open: it takes no slot and counts against no
    /// budget, and its stage waits for it. A member given its slot within
    /// them finishes its change if they close meanwhile, as a sync under
    /// way outlives its window in Argo CD. What a member lets go (it left
    /// the selection, was drained, the hub object was deleted) goes at any
    /// time. Applies with any pace.
    #[must_use]
    pub fn window(mut self, window: Window) -> Self {
        self.windows.push(window);
        self
    }

    pub(crate) fn windows(&self) -> &[Window] {
        &self.windows
    }

    pub(crate) fn rolls_back(&self) -> bool {
        self.on_failure == OnFailure::RollBack
    }

    /// When the selection moves a hub object (members leave it, others
    /// join), up to `members` of those leaving keep its objects beyond the
    /// removal grace, until every selected member is available with them
    /// (or for at most the progress deadline): the moved workload runs
    /// somewhere throughout, on at most that many members more than the
    /// selection. Default 0: members leaving let go once their removal
    /// grace has passed, whether those joining are available or not.
    /// Applies with any pace.
    #[must_use]
    pub fn max_surge(mut self, members: usize) -> Self {
        self.surge = members;
        self
    }

    pub(crate) fn surge(&self) -> usize {
        self.surge
    }

    pub(crate) fn progress_deadline_of(&self) -> Duration {
        self.progress_deadline
    }

    /// How many members may change at once, if the rollout is paced.
    pub(crate) fn max_unavailable(&self) -> Option<MaxUnavailable> {
        match &self.pace {
            Pace::Paced {
                max_unavailable, ..
            } => Some(*max_unavailable),
            Pace::AllAtOnce => None,
        }
    }

    pub(crate) fn failure_budget_of(&self) -> usize {
        self.failure_budget
    }

    pub(crate) fn is_paced(&self) -> bool {
        matches!(self.pace, Pace::Paced { .. })
    }

    /// The stage of a member (an index into the stages, the members in
    /// none last) and its name, if stages were given.
    pub(crate) fn stage_of(
        &self,
        name: &ClusterName,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> (usize, Option<&str>) {
        let Pace::Paced { stages, .. } = &self.pace else {
            return (0, None);
        };
        match stages.iter().position(|stage| stage.holds(name, labels)) {
            Some(at) => (at, Some(stages[at].name.as_str())),
            None if stages.is_empty() => (0, None),
            None => (stages.len(), Some("unstaged")),
        }
    }

    /// The gate of the stage at `at`, if it has one.
    pub(crate) fn gate_of(&self, at: usize) -> Option<&Gate> {
        match &self.pace {
            Pace::Paced { stages, .. } => stages.get(at).and_then(|stage| stage.gate.as_ref()),
            Pace::AllAtOnce => None,
        }
    }

    /// Whether a stage is gated by the propagation's check.
    pub(crate) fn has_checked_gate(&self) -> bool {
        match &self.pace {
            Pace::Paced { stages, .. } => stages
                .iter()
                .any(|stage| stage.gate.as_ref().is_some_and(Gate::is_checked)),
            Pace::AllAtOnce => false,
        }
    }

    /// Whether the stage at `at` waits for an approval.
    pub(crate) fn needs_approval(&self, at: usize) -> bool {
        match &self.pace {
            Pace::Paced { stages, .. } => stages.get(at).is_some_and(|stage| stage.approval),
            Pace::AllAtOnce => false,
        }
    }

    pub(crate) fn soak_time(&self) -> Duration {
        self.soak
    }
}

/// The revision of a hub object (as JSON), as its status, its members'
/// objects ([`REVISION_ANNOTATION`]) and its history name it: its
/// `metadata.generation`, or for a type the API server keeps none for (a
/// ConfigMap) a digest of its labels and of everything outside its
/// metadata and status. Tools that read a rollout (the kubectl plugin)
/// compare it with `status.rollout.revision`.
pub fn revision_of(hub: &Value) -> String {
    if let Some(generation) = hub.pointer("/metadata/generation").and_then(Value::as_i64) {
        return generation.to_string();
    }
    let mut content = hub.clone();
    if let Some(object) = content.as_object_mut() {
        let labels = object
            .get("metadata")
            .and_then(|metadata| metadata.get("labels"))
            .cloned();
        object.remove("status");
        object.insert("metadata".into(), serde_json::json!({ "labels": labels }));
    }
    // serde_json keeps maps sorted (no `preserve_order`), so the text is
    // the same for the same content in every process.
    format!(
        "{:016x}",
        crate::digest::fnv1a(content.to_string().as_bytes())
    )
}

/// The revision `hub`'s annotations ask its members to be rolled back to.
pub(crate) fn roll_back_asked(hub: &Value) -> Option<String> {
    hub.pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(ROLL_BACK_ANNOTATION))
        .and_then(Value::as_str)
        .map(|revision| revision.trim().to_string())
        .filter(|revision| !revision.is_empty())
}

/// Whether `hub`'s annotations pause its rollout.
pub(crate) fn paused_by_annotation(hub: &Value) -> bool {
    hub.pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(PAUSE_ANNOTATION))
        .and_then(Value::as_str)
        .is_some_and(|value| value.trim() == "true")
}

/// Whether `hub`'s annotations approve `stage` at `revision`.
pub(crate) fn approved_by_annotation(hub: &Value, stage: &str, revision: &str) -> bool {
    hub.pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(APPROVAL_ANNOTATION))
        .and_then(Value::as_str)
        .is_some_and(|approved| {
            approved
                .split(',')
                .any(|entry| entry.trim() == format!("{stage}@{revision}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_is_read_as_a_deployment_writes_it() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let read = |value: IntOrString| MaxUnavailable::from_int_or_string(&value);
        assert_eq!(read(IntOrString::Int(2)), Ok(MaxUnavailable::Count(2)));
        assert_eq!(
            read(IntOrString::String("25%".into())),
            Ok(MaxUnavailable::Percent(25))
        );
        assert_eq!(
            read(IntOrString::String("100%".into())),
            Ok(MaxUnavailable::Percent(100))
        );
        for (given, named) in [
            (IntOrString::Int(-1), "-1"),
            (IntOrString::String("25".into()), "\"25\""),
            (IntOrString::String("101%".into()), "\"101%\""),
            (IntOrString::String("a%".into()), "\"a%\""),
        ] {
            let err = read(given).unwrap_err();
            assert!(err.contains(named), "{err}");
        }
    }

    #[test]
    fn a_percentage_rounds_down_to_at_least_one() {
        assert_eq!(MaxUnavailable::Percent(25).slots(6), 1);
        assert_eq!(MaxUnavailable::Percent(25).slots(8), 2);
        assert_eq!(MaxUnavailable::Percent(10).slots(3), 1);
        assert_eq!(MaxUnavailable::Count(0).slots(3), 1);
    }

    #[test]
    fn the_revision_is_the_generation_or_a_stable_digest() {
        let typed = serde_json::json!({"metadata": {"name": "x", "generation": 7}});
        assert_eq!(revision_of(&typed), "7");
        let config = |data: &str, annotation: &str| {
            serde_json::json!({
                "metadata": {"name": "x", "resourceVersion": annotation, "annotations": {"a": annotation}},
                "data": {"k": data},
            })
        };
        assert_eq!(
            revision_of(&config("1", "x")),
            revision_of(&config("1", "y"))
        );
        assert_ne!(
            revision_of(&config("1", "x")),
            revision_of(&config("2", "x"))
        );
    }
}
