//! A paced rollout's record, as kept on the hub object: the revision
//! rolled out, the members holding a slot, what halts or holds it, a roll
//! back under way and what each replica sharing the fleet saw.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use multicluster_runtime::ClusterName;

/// A paced rollout's state, as kept on the hub object (`status.rollout`,
/// or the annotation `<status annotation>-rollout` as JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RolloutStatus {
    /// The revision being rolled out (or rolled out).
    pub revision: String,
    /// The members holding a slot.
    #[serde(default)]
    pub updating: Vec<UpdatingMember>,
    /// How many members have the revision and hold no slot.
    #[serde(default)]
    pub updated: usize,
    /// How many selected members have not been given the revision yet.
    #[serde(default)]
    pub remaining: usize,
    /// The stage under way, if the rollout is staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Why no slot is given: halted by failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
    /// Why no slot is given otherwise: paused, a replica not heard from,
    /// or the stage under way waiting for its gate, its approval or its
    /// members' maintenance windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// When replicas share the fleet (a sharded coordinator), what each
    /// live replica's last step saw of its own members, by replica ID:
    /// the others' members count in every replica's step.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replicas: BTreeMap<String, ReplicaMembers>,
    /// A roll back under way (or done, until a new revision comes): the
    /// members go from the hub object's revision back to an earlier one,
    /// and `revision` is that earlier one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_back: Option<RollingBack>,
    /// The last revision that reached every member: where a roll back
    /// goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_complete: Option<String>,
    /// The gates of the stages come up for this revision
    /// ([`Stage::gated_by`](crate::Stage::gated_by)), in the order they came up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateStatus>,
}

/// Where the gate of a stage stands for the revision rolled out
/// ([`RolloutStatus::gates`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct GateStatus {
    /// The stage's name.
    pub stage: String,
    /// When the stage came up and the gate was first looked at.
    pub since: Time,
    /// `Waiting`, `Passed` or `Failed`.
    pub state: GateState,
    /// What it waits for, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Where a gate stands ([`GateStatus::state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub enum GateState {
    /// Not passed yet: the stage does not start.
    Waiting,
    /// The stage may start (decided for the revision).
    Passed,
    /// Failed or timed out: counts against the failure budget.
    Failed,
}

/// A roll back ([`RolloutStatus::rolling_back`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RollingBack {
    /// The hub object's revision, left.
    pub from: String,
    /// The revision gone back to.
    pub to: String,
    /// Why: the halt that started it, or the annotation that asked.
    pub reason: String,
    /// Asked by [`ROLL_BACK_ANNOTATION`](crate::ROLL_BACK_ANNOTATION): it lasts as long as the
    /// annotation does.
    #[serde(default)]
    pub by_annotation: bool,
}

/// One replica's selected members in a rollout, as its last step saw them
/// ([`RolloutStatus::replicas`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ReplicaMembers {
    /// The revision it saw them for.
    pub revision: String,
    /// How many there are.
    pub members: usize,
    /// How many have the revision and hold no slot.
    pub updated: usize,
    /// How many have not been given the revision yet.
    pub remaining: usize,
    /// The first stage (by index) with a member still to change, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<usize>,
}

/// A member holding a slot in a paced rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct UpdatingMember {
    /// The member's name.
    pub cluster: String,
    /// When it was given the slot.
    pub since: Time,
    /// Why it counts as failed, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl RolloutStatus {
    /// Whether `name` holds a slot.
    pub(crate) fn holds_slot(&self, name: &ClusterName) -> bool {
        self.updating
            .iter()
            .any(|updating| updating.cluster == name.as_str())
    }

    /// Whether every member has the revision and none holds a slot.
    pub(crate) fn is_complete(&self) -> bool {
        self.updating.is_empty() && self.remaining == 0 && self.halted.is_none()
    }

    /// One line for the hub object's condition.
    pub(crate) fn summary(&self) -> String {
        let what = match &self.rolling_back {
            Some(back) => format!(
                "roll back from revision {} to {} ({})",
                back.from, back.to, back.reason
            ),
            None => "rollout".to_string(),
        };
        let mut summary = format!(
            "{what} of revision {}: {} updated, {} updating, {} to go",
            self.revision,
            self.updated,
            self.updating.len(),
            self.remaining
        );
        if let Some(stage) = &self.stage {
            summary.push_str(&format!(", stage {stage}"));
        }
        if let Some(halted) = &self.halted {
            summary.push_str(&format!(", halted: {halted}"));
        } else if let Some(waiting) = &self.waiting {
            summary.push_str(&format!(", {waiting}"));
        }
        summary
    }
}
