//! How desired objects are brought to a member besides applying them:
//! created once and left alone, only compared (a server-side dry run,
//! nothing written), taken over only when nothing would change, and with
//! fields left to others.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::Value;

/// How a propagation brings the desired objects to a member.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApplyMode {
    /// Server-side apply, kept as desired; drift and conflicts as their
    /// policies say (the default).
    #[default]
    Apply,
    /// Created when missing, never changed after: an object that exists
    /// (whoever made it) is left as it is, and the member is in sync once
    /// it is available.
    CreateOnly,
    /// Nothing written to the member: each apply is a server-side dry run,
    /// and a member where one would change something is `Drifted`, its
    /// reason naming the differing fields (never their values); `InSync`
    /// when none would. Nothing is deleted either.
    ReportOnly,
}

/// How many differing fields a reason names at most.
const PATHS_NAMED: usize = 8;

/// What of an object two states are compared on: all but what the server
/// keeps for itself and the status.
fn comparable(object: &DynamicObject) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "managedFields",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "uid",
            "selfLink",
        ] {
            metadata.remove(field);
        }
    }
    value
}

/// The paths (`spec.hard.pods`, `spec.template.spec.containers[0].image`)
/// where `before` and `after` differ, at most [`PATHS_NAMED`] of them.
pub(super) fn differing_paths(before: &DynamicObject, after: &DynamicObject) -> Vec<String> {
    let mut paths = Vec::new();
    walk(
        &comparable(before),
        &comparable(after),
        String::new(),
        &mut paths,
    );
    paths
}

fn walk(before: &Value, after: &Value, at: String, paths: &mut Vec<String>) {
    if paths.len() >= PATHS_NAMED || before == after {
        return;
    }
    match (before, after) {
        (Value::Object(before), Value::Object(after)) => {
            let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let path = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                walk(
                    before.get(key).unwrap_or(&Value::Null),
                    after.get(key).unwrap_or(&Value::Null),
                    path,
                    paths,
                );
            }
        }
        (Value::Array(before), Value::Array(after)) if before.len() == after.len() => {
            for (index, (before, after)) in before.iter().zip(after).enumerate() {
                walk(before, after, format!("{at}[{index}]"), paths);
            }
        }
        _ => paths.push(if at.is_empty() {
            "(the object)".into()
        } else {
            at
        }),
    }
}

/// `object` without the fields at `pointers` (JSON pointers such as
/// `/spec/replicas`): neither set nor owned by the propagation, so another
/// controller's value there is no drift.
pub(super) fn without_fields(mut object: Value, pointers: &[String]) -> Value {
    for pointer in pointers {
        let Some((parent, field)) = pointer.rsplit_once('/') else {
            continue;
        };
        let field = field.replace("~1", "/").replace("~0", "~");
        let parent = if parent.is_empty() {
            Some(&mut object)
        } else {
            object.pointer_mut(parent)
        };
        if let Some(Value::Object(map)) = parent {
            map.remove(&field);
        }
    }
    object
}

/// What applying `object` (under `manager`, taking every field) would
/// change in the member's `name`: `None` when it does not exist, else the
/// differing paths. Nothing is written (a server-side dry run).
pub(super) async fn would_change(
    api: &Api<DynamicObject>,
    manager: &str,
    name: &str,
    object: &Value,
) -> Result<Option<Vec<String>>, kube::Error> {
    let Some(live) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let params = PatchParams::apply(manager).force().dry_run();
    let dry = api.patch(name, &params, &Patch::Apply(object)).await?;
    Ok(Some(differing_paths(&live, &dry)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).expect("object")
    }

    #[test]
    fn paths_name_fields_never_values() {
        let before = object(json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "q", "resourceVersion": "1", "labels": {"a": "1"}},
            "spec": {"hard": {"pods": "4", "cpu": "1"}},
            "status": {"used": {"pods": "0"}},
        }));
        let after = object(json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "q", "resourceVersion": "2", "labels": {"a": "1", "b": "2"}},
            "spec": {"hard": {"pods": "6", "cpu": "1"}, "scopes": ["Terminating"]},
        }));
        assert_eq!(
            differing_paths(&before, &after),
            ["metadata.labels.b", "spec.hard.pods", "spec.scopes"]
        );
        assert!(differing_paths(&before, &before).is_empty());
    }

    #[test]
    fn ignored_fields_are_taken_out() {
        let desired = json!({"spec": {"replicas": 3, "template": {"a/b": 1, "c": 2}}});
        let left = without_fields(
            desired,
            &[
                "/spec/replicas".into(),
                "/spec/template/a~1b".into(),
                "/nowhere/x".into(),
            ],
        );
        assert_eq!(left, json!({"spec": {"template": {"c": 2}}}));
    }
}
