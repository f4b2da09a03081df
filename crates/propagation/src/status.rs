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
    /// The hub object's revision (see `rollout`) the member is in sync
    /// with, once it is.
    pub(super) revision: Option<String>,
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
            revision: None,
            reported: BTreeMap::new(),
        }
    }

    /// `state` with `reason`, nothing applied.
    pub(super) fn failed(state: MemberState, reason: Option<String>) -> Self {
        Self {
            state,
            reason,
            applied_generation: None,
            revision: None,
            reported: BTreeMap::new(),
        }
    }
}

/// The type of the condition written to a hub object's status.
pub const CONDITION_TYPE: &str = "Propagated";

/// How many members a hub object's status names at most. Past it, those
/// not in sync come first (the worst first) and the rest are only
/// counted (`counts`, by state), so the status of a hub object over
/// 10,000 members stays far below the API server's object size limit.
pub(super) const LISTED_AT_MOST: usize = 100;

/// The members' part of a hub object's status, as JSON: `members` (one
/// entry per member, by name, at most [`LISTED_AT_MOST`]), `counts` (how
/// many members are in each state) and the `Propagated` condition
/// (without its `lastTransitionTime`, which the writer adds). `rollout` (a
/// paced rollout's summary) ends the condition's message.
pub(super) fn render(
    outcomes: &BTreeMap<ClusterName, Outcome>,
    generation: Option<i64>,
    rollout: Option<String>,
) -> Rendered {
    let members = listed(outcomes);
    let counts = count(outcomes);
    let condition = condition(&counts, &members, generation, rollout);
    Rendered {
        members: Value::Array(members),
        counts: Value::Object(counts),
        condition,
        by_replica: None,
    }
}

/// What one replica of several sharing the fleet knows, merged into the
/// status `current` (as on the hub object, written by all of them): the
/// entries of members meant for this replica (`mine`) or in `outcomes`
/// are this replica's, the others' stay; `countsByReplica` keeps each
/// live replica's counts, and `counts` and the condition sum them up.
pub(super) fn render_shared(
    current: Option<&Value>,
    outcomes: &BTreeMap<ClusterName, Outcome>,
    me: &str,
    live: &[String],
    mine: &dyn Fn(&ClusterName) -> bool,
    generation: Option<i64>,
    rollout: Option<String>,
) -> Rendered {
    let theirs = current
        .and_then(|status| status.get("members"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|entry| {
            let name = ClusterName::from(entry["cluster"].as_str().unwrap_or_default());
            !outcomes.contains_key(&name) && !mine(&name)
        })
        .cloned();
    let mut members: Vec<Value> = theirs.chain(listed(outcomes)).collect();
    members.sort_by(|a, b| a["cluster"].as_str().cmp(&b["cluster"].as_str()));
    let mut by_replica: serde_json::Map<String, Value> = current
        .and_then(|status| status.get("countsByReplica"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    by_replica.retain(|replica, _| live.iter().any(|live| live == replica));
    by_replica.insert(me.to_string(), Value::Object(count(outcomes)));
    let mut counts = serde_json::Map::new();
    for (state, count) in by_replica.values().filter_map(Value::as_object).flatten() {
        let sum = counts.entry(state.clone()).or_insert(json!(0));
        *sum = json!(sum.as_u64().unwrap_or_default() + count.as_u64().unwrap_or_default());
    }
    let condition = condition(&counts, &members, generation, rollout);
    Rendered {
        members: Value::Array(members),
        counts: Value::Object(counts),
        condition,
        by_replica: Some(Value::Object(by_replica)),
    }
}

/// The entries of `outcomes` a status names: every member, or past
/// [`LISTED_AT_MOST`] the worst ones, by name.
fn listed(outcomes: &BTreeMap<ClusterName, Outcome>) -> Vec<Value> {
    let mut listed: Vec<(&ClusterName, &Outcome)> = outcomes.iter().collect();
    if listed.len() > LISTED_AT_MOST {
        // The worst first; by name within a state.
        listed.sort_by(|a, b| b.1.state.cmp(&a.1.state).then_with(|| a.0.cmp(b.0)));
        listed.truncate(LISTED_AT_MOST);
        listed.sort_by(|a, b| a.0.cmp(b.0));
    }
    listed
        .into_iter()
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
            if let Some(revision) = &outcome.revision {
                entry["revision"] = json!(revision);
            }
            if !outcome.reported.is_empty() {
                entry["reported"] = json!(outcome.reported);
            }
            entry
        })
        .collect()
}

/// How many of `outcomes` are in each state.
fn count(outcomes: &BTreeMap<ClusterName, Outcome>) -> serde_json::Map<String, Value> {
    let mut counts = serde_json::Map::new();
    for outcome in outcomes.values() {
        let count = counts.entry(outcome.state.as_str()).or_insert(json!(0));
        *count = json!(count.as_u64().unwrap_or_default() + 1);
    }
    counts
}

/// The `Propagated` condition for members counted by state as `counts`,
/// naming a few of each state from the `listed` entries.
fn condition(
    counts: &serde_json::Map<String, Value>,
    listed: &[Value],
    generation: Option<i64>,
    rollout: Option<String>,
) -> Value {
    let counted = |state: MemberState| {
        counts
            .get(state.as_str())
            .and_then(Value::as_u64)
            .unwrap_or_default()
    };
    let states = [
        MemberState::Failed,
        MemberState::Degraded,
        MemberState::Conflict,
        MemberState::Drifted,
        MemberState::NotEngaged,
        MemberState::Pending,
        MemberState::Progressing,
    ];
    let worst = states
        .iter()
        .copied()
        .filter(|state| counted(*state) > 0)
        .max()
        .unwrap_or(MemberState::InSync);
    let total: u64 = counts.values().filter_map(Value::as_u64).sum();
    let mut message = format!(
        "{} of {total} members in sync",
        counted(MemberState::InSync)
    );
    for state in states {
        let names: Vec<&str> = listed
            .iter()
            .filter(|entry| entry["state"] == state.as_str())
            .filter_map(|entry| entry["cluster"].as_str())
            .take(5)
            .collect();
        if !names.is_empty() {
            message.push_str(&format!("; {}: {}", state.as_str(), names.join(", ")));
        }
    }
    if let Some(rollout) = rollout {
        message.push_str(&format!("; {rollout}"));
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
    condition
}

/// A hub object's status, rendered.
pub(super) struct Rendered {
    pub(super) members: Value,
    pub(super) counts: Value,
    pub(super) condition: Value,
    /// Each live replica's counts, when replicas share the fleet.
    pub(super) by_replica: Option<Value>,
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
            revision: None,
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
        let Rendered {
            members,
            condition,
            counts,
            ..
        } = render(&outcomes, Some(2), None);
        assert_eq!(members.as_array().map(Vec::len), Some(3));
        assert_eq!(counts, json!({"InSync": 1, "Failed": 1, "Pending": 1}));
        assert_eq!(members[1]["reason"], "403 Forbidden");
        assert_eq!(condition["status"], "False");
        assert_eq!(condition["reason"], "Failed");
        assert_eq!(
            condition["message"],
            "1 of 3 members in sync; Failed: b; Pending: c"
        );
        let all = BTreeMap::from([(ClusterName::from("a"), outcome(MemberState::InSync, None))]);
        let condition = render(&all, Some(2), None).condition;
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], "InSync");
    }

    #[test]
    fn replicas_sharing_the_fleet_keep_each_others_members_and_sum_their_counts() {
        // Written before: "x" by replica b, "a" and "moved" by this one
        // ("moved" is now meant for it but not engaged yet), and the
        // counts of b and of a replica that is gone.
        let current = json!({
            "members": [
                {"cluster": "a", "state": "Pending"},
                {"cluster": "moved", "state": "Failed", "reason": "old"},
                {"cluster": "x", "state": "Failed", "reason": "403"},
            ],
            "countsByReplica": {
                "b": {"Failed": 1, "InSync": 4},
                "gone": {"InSync": 7},
                "me": {"Pending": 2},
            },
        });
        let outcomes = BTreeMap::from([
            (ClusterName::from("a"), outcome(MemberState::InSync, None)),
            (ClusterName::from("c"), outcome(MemberState::InSync, None)),
        ]);
        let live = ["b".to_string(), "me".to_string()];
        let rendered = render_shared(
            Some(&current),
            &outcomes,
            "me",
            &live,
            &|name| name.as_str() != "x",
            Some(3),
            None,
        );
        let named: Vec<(&str, &str)> = rendered
            .members
            .as_array()
            .expect("members")
            .iter()
            .map(|m| {
                (
                    m["cluster"].as_str().unwrap_or_default(),
                    m["state"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(named, [("a", "InSync"), ("c", "InSync"), ("x", "Failed")]);
        assert_eq!(
            rendered.by_replica,
            Some(json!({"b": {"Failed": 1, "InSync": 4}, "me": {"InSync": 2}}))
        );
        assert_eq!(rendered.counts, json!({"Failed": 1, "InSync": 6}));
        assert_eq!(rendered.condition["reason"], "Failed");
        assert_eq!(
            rendered.condition["message"],
            "6 of 7 members in sync; Failed: x"
        );
    }

    #[test]
    fn a_large_fleet_lists_the_worst_members_and_counts_the_rest() {
        let mut outcomes: BTreeMap<ClusterName, Outcome> = (0..10_000)
            .map(|i| {
                (
                    ClusterName::from(format!("member-{i:05}")),
                    outcome(MemberState::InSync, None),
                )
            })
            .collect();
        for i in [17, 4242, 9999] {
            outcomes.insert(
                ClusterName::from(format!("member-{i:05}")),
                outcome(
                    MemberState::Failed,
                    Some("403 Forbidden: a long enough reason"),
                ),
            );
        }
        let rendered = render(&outcomes, Some(2), None);
        let members = rendered.members.as_array().expect("members");
        assert_eq!(members.len(), LISTED_AT_MOST);
        let failed: Vec<&str> = members
            .iter()
            .filter(|member| member["state"] == "Failed")
            .filter_map(|member| member["cluster"].as_str())
            .collect();
        assert_eq!(failed, ["member-00017", "member-04242", "member-09999"]);
        assert_eq!(rendered.counts, json!({"InSync": 9997, "Failed": 3}));
        let size = serde_json::to_string(&json!({
            "members": rendered.members,
            "counts": rendered.counts,
            "conditions": [rendered.condition],
        }))
        .expect("json")
        .len();
        eprintln!("status of 10,000 members: {size} bytes");
        assert!(size < 256 * 1024, "{size} bytes");
    }
}
