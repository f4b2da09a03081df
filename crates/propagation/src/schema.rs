//! The status a hub custom resource carries when its propagation writes to
//! the status subresource, as a type with its schema: a
//! `#[derive(CustomResource)]` with `status = "PropagationStatus"` gets a
//! CRD whose schema keeps every field the propagation writes, and reads
//! them back typed.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::record::{
    GateState, GateStatus, ReplicaMembers, RollingBack, RolloutStatus, UpdatingMember,
};

/// What a propagation writes to a hub object's status subresource
/// ([`Propagation::status_subresource`](crate::Propagation::status_subresource)).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PropagationStatus {
    /// How each member is doing, by name; past 100 members, those not in
    /// sync (the worst first) and the rest only counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["cluster"]))]
    pub members: Vec<MemberStatus>,
    /// How many members are in each state (`InSync`, `Failed`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<String, u64>,
    /// When replicas share the fleet (a sharded coordinator), each live
    /// replica's `counts`, by replica ID: `counts` is their sum.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts_by_replica: BTreeMap<String, BTreeMap<String, u64>>,
    /// The `Propagated` condition ([`CONDITION_TYPE`](crate::CONDITION_TYPE)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// A paced rollout's state ([`Propagation::rollout`](crate::Propagation::rollout)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// How one member is doing with a hub object's objects.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MemberStatus {
    /// The member's name.
    pub cluster: String,
    /// Its state ([`MemberState::as_str`](crate::MemberState::as_str)).
    pub state: String,
    /// Why it is not in sync, redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The hub object's generation the member was last brought in line
    /// with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_generation: Option<i64>,
    /// The hub object's revision the member is in sync with
    /// ([`REVISION_ANNOTATION`](crate::REVISION_ANNOTATION)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// What [`Propagation::report`](crate::Propagation::report) took from
    /// each applied object, by object (`<Kind> <namespace>/<name>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "any_object")]
    pub reported: BTreeMap<String, Value>,
}

/// An object whose fields are the user's: kept as written (a structural
/// schema would otherwise prune them).
fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
