//! Whether what was applied in a member works, not only whether it was
//! applied: built-in rules for the kinds whose controllers report it
//! (the same readings as `kubectl rollout status` and the workload
//! controllers' own conditions), a generic rule for anything with a
//! `Ready` or `Available` condition, and rules users give per type.
//!
//! An object with no rule is available once applied.

use std::sync::Arc;

use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use serde_json::Value;

/// How an applied object is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// It works as desired.
    Available,
    /// Not yet: the reason says what it waits for (rolled out, bound,
    /// established).
    Progressing(String),
    /// It reports failure (a Job that failed, a rollout past its deadline).
    Degraded(String),
}

/// A user's rule for one type, over the applied object as the member
/// answered it.
pub(super) type Rule = Arc<dyn Fn(&DynamicObject) -> Health + Send + Sync>;

/// How `object` (of `resource`, as the member answered its apply) is
/// doing by the built-in rules.
pub(super) fn built_in(resource: &ApiResource, object: &DynamicObject) -> Health {
    let data = &object.data;
    let generation = object.metadata.generation;
    if let Some(health) = not_observed(data, generation) {
        return health;
    }
    match (resource.group.as_str(), resource.kind.as_str()) {
        ("apps", "Deployment") => deployment(data),
        ("apps", "StatefulSet") => stateful_set(data),
        ("apps", "DaemonSet") => daemon_set(data),
        ("batch", "Job") => job(data),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => definition(data),
        ("", "Namespace") => phase(data, "Active", &["Terminating"]),
        ("", "PersistentVolumeClaim") => phase(data, "Bound", &["Lost"]),
        _ => generic(data),
    }
}

/// Progressing while the object's controller has not seen its latest
/// generation (its status speaks of an older spec).
fn not_observed(data: &Value, generation: Option<i64>) -> Option<Health> {
    let observed = data.pointer("/status/observedGeneration")?.as_i64()?;
    let generation = generation?;
    (observed < generation).then(|| {
        Health::Progressing(format!(
            "its controller has seen generation {observed}, not {generation} yet"
        ))
    })
}

fn int(data: &Value, pointer: &str) -> Option<i64> {
    data.pointer(pointer).and_then(Value::as_i64)
}

/// A condition as `status.conditions` holds it.
struct Condition<'a> {
    status: &'a str,
    reason: &'a str,
    /// Its message, or its reason when it has none.
    message: &'a str,
}

/// The condition of `kind` in `status.conditions`.
fn condition<'a>(data: &'a Value, kind: &str) -> Option<Condition<'a>> {
    let found = data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|condition| condition["type"] == kind)?;
    let reason = found["reason"].as_str().unwrap_or_default();
    Some(Condition {
        status: found["status"].as_str().unwrap_or_default(),
        reason,
        message: found["message"].as_str().unwrap_or(reason),
    })
}

/// Whether the condition of `kind` has status `status`; its message if so.
fn is<'a>(data: &'a Value, kind: &str, status: &str) -> Option<&'a str> {
    condition(data, kind)
        .filter(|condition| condition.status == status)
        .map(|condition| condition.message)
}

fn deployment(data: &Value) -> Health {
    if let Some(progressing) = condition(data, "Progressing")
        && progressing.status == "False"
        && progressing.reason == "ProgressDeadlineExceeded"
    {
        return Health::Degraded(format!(
            "its rollout passed its deadline: {}",
            progressing.message
        ));
    }
    if data.pointer("/status/observedGeneration").is_none() {
        return Health::Progressing("its controller has not looked at it yet".to_string());
    }
    let wanted = int(data, "/spec/replicas").unwrap_or(1);
    let updated = int(data, "/status/updatedReplicas").unwrap_or(0);
    let available = int(data, "/status/availableReplicas").unwrap_or(0);
    let total = int(data, "/status/replicas").unwrap_or(0);
    if updated < wanted {
        return Health::Progressing(format!("{updated} of {wanted} replicas updated"));
    }
    if total > updated {
        return Health::Progressing(format!("{} old replicas still running", total - updated));
    }
    if available < updated {
        return Health::Progressing(format!(
            "{available} of {updated} updated replicas available"
        ));
    }
    Health::Available
}

fn stateful_set(data: &Value) -> Health {
    if data.pointer("/status/observedGeneration").is_none() {
        return Health::Progressing("its controller has not looked at it yet".to_string());
    }
    let wanted = int(data, "/spec/replicas").unwrap_or(1);
    let ready = int(data, "/status/availableReplicas")
        .or_else(|| int(data, "/status/readyReplicas"))
        .unwrap_or(0);
    if ready < wanted {
        return Health::Progressing(format!("{ready} of {wanted} replicas available"));
    }
    let rolling = data.pointer("/spec/updateStrategy/type") != Some(&Value::from("OnDelete"));
    let (current, update) = (
        data.pointer("/status/currentRevision"),
        data.pointer("/status/updateRevision"),
    );
    if rolling && update.is_some() && current != update {
        let updated = int(data, "/status/updatedReplicas").unwrap_or(0);
        return Health::Progressing(format!("{updated} of {wanted} replicas updated"));
    }
    Health::Available
}

fn daemon_set(data: &Value) -> Health {
    if data.pointer("/status/observedGeneration").is_none() {
        return Health::Progressing("its controller has not looked at it yet".to_string());
    }
    let wanted = int(data, "/status/desiredNumberScheduled").unwrap_or(0);
    let updated = int(data, "/status/updatedNumberScheduled").unwrap_or(0);
    let available = int(data, "/status/numberAvailable").unwrap_or(0);
    if updated < wanted {
        return Health::Progressing(format!("{updated} of {wanted} nodes updated"));
    }
    if available < wanted {
        return Health::Progressing(format!("{available} of {wanted} nodes available"));
    }
    Health::Available
}

fn job(data: &Value) -> Health {
    if is(data, "Complete", "True").is_some() {
        return Health::Available;
    }
    if let Some(message) = is(data, "Failed", "True") {
        return Health::Degraded(format!("the Job failed: {message}"));
    }
    Health::Progressing("the Job has not completed".to_string())
}

fn definition(data: &Value) -> Health {
    if is(data, "Established", "True").is_some() {
        return Health::Available;
    }
    if let Some(message) = is(data, "NamesAccepted", "False") {
        return Health::Degraded(format!("its names were not accepted: {message}"));
    }
    Health::Progressing("not established yet".to_string())
}

/// By `status.phase`: `available` is available, one of `failed` is
/// degraded, anything else (none yet) progressing.
fn phase(data: &Value, available: &str, failed: &[&str]) -> Health {
    match data.pointer("/status/phase").and_then(Value::as_str) {
        Some(phase) if phase == available => Health::Available,
        Some(phase) if failed.contains(&phase) => Health::Degraded(format!("it is {phase}")),
        Some(phase) => Health::Progressing(format!("it is {phase}, not {available} yet")),
        None => Health::Progressing(format!("not {available} yet")),
    }
}

/// A `Ready` condition, else an `Available` one; none: available once
/// applied.
fn generic(data: &Value) -> Health {
    for kind in ["Ready", "Available"] {
        match condition(data, kind) {
            Some(condition) if condition.status == "True" => return Health::Available,
            Some(Condition { message: "", .. }) => {
                return Health::Progressing(format!("not {kind} yet"));
            }
            Some(condition) => {
                return Health::Progressing(format!("not {kind}: {}", condition.message));
            }
            None => {}
        }
    }
    Health::Available
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(data: Value, generation: Option<i64>) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "X", "metadata": {"name": "x"},
        }))
        .expect("object");
        object.metadata.generation = generation;
        object.data = data;
        object
    }

    fn resource(group: &str, kind: &str) -> ApiResource {
        ApiResource {
            group: group.to_string(),
            version: "v1".to_string(),
            api_version: if group.is_empty() {
                "v1".to_string()
            } else {
                format!("{group}/v1")
            },
            kind: kind.to_string(),
            plural: format!("{}s", kind.to_lowercase()),
        }
    }

    #[test]
    fn a_deployment_is_available_once_every_wanted_replica_is_updated_and_available() {
        let deployment = resource("apps", "Deployment");
        let fresh = object(json!({"spec": {"replicas": 2}}), Some(1));
        assert!(matches!(
            built_in(&deployment, &fresh),
            Health::Progressing(_)
        ));
        let rolling = object(
            json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2}}),
            Some(1),
        );
        assert_eq!(
            built_in(&deployment, &rolling),
            Health::Progressing("1 old replicas still running".to_string())
        );
        let stale = object(
            json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}}),
            Some(2),
        );
        assert!(matches!(
            built_in(&deployment, &stale),
            Health::Progressing(_)
        ));
        let done = object(
            json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}}),
            Some(2),
        );
        assert_eq!(built_in(&deployment, &done), Health::Available);
        let stuck = object(
            json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 2, "conditions": [
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet x has timed out progressing."}
            ]}}),
            Some(2),
        );
        assert!(matches!(built_in(&deployment, &stuck), Health::Degraded(_)));
    }

    #[test]
    fn jobs_definitions_namespaces_and_claims_by_their_own_words() {
        let complete = object(
            json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}),
            None,
        );
        assert_eq!(
            built_in(&resource("batch", "Job"), &complete),
            Health::Available
        );
        let failed = object(
            json!({"status": {"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}}),
            None,
        );
        assert!(matches!(
            built_in(&resource("batch", "Job"), &failed),
            Health::Degraded(_)
        ));
        let crd = resource("apiextensions.k8s.io", "CustomResourceDefinition");
        assert!(matches!(
            built_in(&crd, &object(json!({}), None)),
            Health::Progressing(_)
        ));
        let established = object(
            json!({"status": {"conditions": [{"type": "Established", "status": "True"}]}}),
            None,
        );
        assert_eq!(built_in(&crd, &established), Health::Available);
        let namespace = resource("", "Namespace");
        let active = object(json!({"status": {"phase": "Active"}}), None);
        assert_eq!(built_in(&namespace, &active), Health::Available);
        let ending = object(json!({"status": {"phase": "Terminating"}}), None);
        assert!(matches!(built_in(&namespace, &ending), Health::Degraded(_)));
        let claim = resource("", "PersistentVolumeClaim");
        let pending = object(json!({"status": {"phase": "Pending"}}), None);
        assert!(matches!(built_in(&claim, &pending), Health::Progressing(_)));
    }

    #[test]
    fn anything_else_goes_by_its_ready_condition_or_is_available_once_applied() {
        let widget = resource("example.com", "Widget");
        let plain = object(json!({"spec": {}}), Some(1));
        assert_eq!(built_in(&widget, &plain), Health::Available);
        let not_ready = object(
            json!({"status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "False", "message": "waiting for a bucket"}]}}),
            Some(1),
        );
        assert_eq!(
            built_in(&widget, &not_ready),
            Health::Progressing("not Ready: waiting for a bucket".to_string())
        );
        let behind = object(json!({"status": {"observedGeneration": 1}}), Some(3));
        assert!(matches!(built_in(&widget, &behind), Health::Progressing(_)));
    }
}
