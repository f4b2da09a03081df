//! How each member is doing with a hub object's objects, kept per hub
//! object, and its rendering onto the hub object: a status subresource
//! (`status.members` and a `Propagated` condition) or an annotation.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use multicluster_runtime::ClusterName;

/// How one member is doing with the objects of one hub object, from best
/// to worst: the order is the summary's, whose reason is the worst state
/// of any member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum MemberState {
    /// Every object applied as desired and available (see
    /// [`Health`](super::Health)): done.
    InSync,
    /// Applied, but an object is not available yet (a Deployment rolling
    /// out, a definition not established), or a later wave waits for it;
    /// the reason names the object and what it waits for.
    Progressing,
    /// Selected, not yet applied (its reconcile has not run yet), or
    /// applied while the member's watch of a propagated type has not
    /// listed, so what is no longer desired there could not be looked for
    /// yet (looked at again every second).
    Pending,
    /// Chosen for the hub object, but no such member is engaged.
    NotEngaged,
    /// A field the propagation manages was changed in the member, and the
    /// propagation reports drift rather than repairing it
    /// ([`Drift::Report`](super::Drift::Report)).
    Drifted,
    /// An object the propagation did not make holds a field it would set,
    /// owned by another field manager
    /// ([`Conflicts::Report`](super::Conflicts::Report)).
    Conflict,
    /// Applied, but an object reports failure (a Job that failed, a
    /// rollout past its deadline); the reason names it. Looked at again
    /// when it changes.
    Degraded,
    /// Applying failed (refused, invalid, unreachable); retried with
    /// backoff.
    Failed,
}

impl MemberState {
    /// The state as written to the hub object (`InSync`, `Failed`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Pending => "Pending",
            MemberState::InSync => "InSync",
            MemberState::Drifted => "Drifted",
            MemberState::Conflict => "Conflict",
            MemberState::Failed => "Failed",
            MemberState::NotEngaged => "NotEngaged",
            MemberState::Progressing => "Progressing",
            MemberState::Degraded => "Degraded",
        }
    }
}

/// One member's outcome for one hub object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Outcome {
    pub(super) state: MemberState,
    /// Redacted, one line.
    pub(super) reason: Option<String>,
    /// The hub object's `metadata.generation` the member was last brought
    /// in line with.
    pub(super) applied_generation: Option<i64>,
    /// What [`Propagation::report`](super::Propagation::report) took from
    /// each applied object, by object (`<Kind> <namespace>/<name>`).
    pub(super) reported: BTreeMap<String, Value>,
}

impl Outcome {
    pub(super) fn pending() -> Self {
        Self {
            state: MemberState::Pending,
            reason: None,
            applied_generation: None,
            reported: BTreeMap::new(),
        }
    }

    /// `state` with `reason`, nothing applied.
    pub(super) fn failed(state: MemberState, reason: Option<String>) -> Self {
        Self {
            state,
            reason,
            applied_generation: None,
            reported: BTreeMap::new(),
        }
    }
}

/// The type of the condition written to a hub object's status.
pub const CONDITION_TYPE: &str = "Propagated";

/// The members' part of a hub object's status, as JSON: `members` (one
/// entry per member, by name) and the `Propagated` condition (without its
/// `lastTransitionTime`, which the writer adds).
pub(super) fn render(
    outcomes: &BTreeMap<ClusterName, Outcome>,
    generation: Option<i64>,
) -> (Value, Value) {
    let members: Vec<Value> = outcomes
        .iter()
        .map(|(cluster, outcome)| {
            let mut entry = json!({
                "cluster": cluster.as_str(),
                "state": outcome.state.as_str(),
            });
            if let Some(reason) = &outcome.reason {
                entry["reason"] = json!(reason);
            }
            if let Some(applied) = outcome.applied_generation {
                entry["appliedGeneration"] = json!(applied);
            }
            if !outcome.reported.is_empty() {
                entry["reported"] = json!(outcome.reported);
            }
            entry
        })
        .collect();
    let worst = outcomes
        .values()
        .map(|outcome| outcome.state)
        .max()
        .unwrap_or(MemberState::InSync);
    let in_sync = outcomes
        .values()
        .filter(|outcome| outcome.state == MemberState::InSync)
        .count();
    let mut message = format!("{in_sync} of {} members in sync", outcomes.len());
    for state in [
        MemberState::Failed,
        MemberState::Degraded,
        MemberState::Conflict,
        MemberState::Drifted,
        MemberState::NotEngaged,
        MemberState::Pending,
        MemberState::Progressing,
    ] {
        let names: Vec<&str> = outcomes
            .iter()
            .filter(|(_, outcome)| outcome.state == state)
            .map(|(cluster, _)| cluster.as_str())
            .take(5)
            .collect();
        if !names.is_empty() {
            message.push_str(&format!("; {}: {}", state.as_str(), names.join(", ")));
        }
    }
    let mut condition = json!({
        "type": CONDITION_TYPE,
        "status": if worst == MemberState::InSync { "True" } else { "False" },
        "reason": worst.as_str(),
        "message": message,
    });
    if let Some(generation) = generation {
        condition["observedGeneration"] = json!(generation);
    }
    (Value::Array(members), condition)
}

/// The `Propagated` condition in a hub object's status, if any.
pub(super) fn current_condition(status: Option<&Value>) -> Option<&Value> {
    status?
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|condition| condition.get("type").and_then(Value::as_str) == Some(CONDITION_TYPE))
}

/// Whether `condition` says what `written` says, its transition time aside.
pub(super) fn same_condition(condition: &Value, written: &Value) -> bool {
    ["status", "reason", "message", "observedGeneration"]
        .iter()
        .all(|field| condition.get(field) == written.get(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(state: MemberState, reason: Option<&str>) -> Outcome {
        Outcome {
            state,
            reason: reason.map(str::to_string),
            applied_generation: Some(2),
            reported: BTreeMap::new(),
        }
    }

    #[test]
    fn the_worst_member_decides_the_condition() {
        let outcomes = BTreeMap::from([
            (ClusterName::from("a"), outcome(MemberState::InSync, None)),
            (
                ClusterName::from("b"),
                outcome(MemberState::Failed, Some("403 Forbidden")),
            ),
            (ClusterName::from("c"), outcome(MemberState::Pending, None)),
        ]);
        let (members, condition) = render(&outcomes, Some(2));
        assert_eq!(members.as_array().map(Vec::len), Some(3));
        assert_eq!(members[1]["reason"], "403 Forbidden");
        assert_eq!(condition["status"], "False");
        assert_eq!(condition["reason"], "Failed");
        assert_eq!(
            condition["message"],
            "1 of 3 members in sync; Failed: b; Pending: c"
        );
        let all = BTreeMap::from([(ClusterName::from("a"), outcome(MemberState::InSync, None))]);
        let (_, condition) = render(&all, Some(2));
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], "InSync");
    }
}
