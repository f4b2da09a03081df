//! Translating between a virtual cluster and its host namespace: request
//! paths, object namespaces in request and response bodies.
//!
//! The virtual cluster shows exactly one namespace, `default`, which is the
//! host namespace. Any other namespace, the Namespace objects themselves and
//! cluster-scoped resources are refused.

use serde_json::Value;

use crate::VIRTUAL_NAMESPACE;

/// Where a request path goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Not a resource path (`/version`, discovery, ...): send as is.
    PassThrough,
    /// A namespaced resource: send to this path instead.
    Rewritten(String),
    /// A cluster-wide path; namespaced resources are narrowed to the host
    /// namespace, cluster-scoped ones refused. Needs discovery to decide.
    ClusterWide {
        /// `api/v1` or `apis/<group>/<version>`.
        group_version: String,
        /// The resource's plural name.
        plural: String,
        /// The path narrowed to the host namespace.
        narrowed: String,
    },
    /// Refused, with the reason.
    Refused(String),
}

/// Routes `path` of a virtual cluster backed by `host_namespace`.
pub(crate) fn route(path: &str, host_namespace: &str) -> Route {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let prefix_len = match segments.as_slice() {
        ["api", _version, ..] => 2,
        ["apis", _group, _version, ..] => 3,
        _ => return Route::PassThrough,
    };
    let (prefix, rest) = segments.split_at(prefix_len);
    let prefix = prefix.join("/");
    match rest {
        [] | [""] => Route::PassThrough,
        ["namespaces"] | ["namespaces", _] | ["namespaces", _, "status" | "finalize"]
            if prefix == "api/v1" =>
        {
            Route::Refused(
                "namespaces are not visible in a namespace-backed virtual cluster".into(),
            )
        }
        ["namespaces", namespace, resource @ ..] => {
            if *namespace != VIRTUAL_NAMESPACE {
                return Route::Refused(format!(
                    "namespace {namespace:?} does not exist in this virtual cluster; only {VIRTUAL_NAMESPACE:?} does"
                ));
            }
            Route::Rewritten(format!(
                "/{prefix}/namespaces/{host_namespace}/{}",
                resource.join("/")
            ))
        }
        [plural, more @ ..] => Route::ClusterWide {
            group_version: prefix.clone(),
            plural: (*plural).to_string(),
            narrowed: format!(
                "/{prefix}/namespaces/{host_namespace}/{plural}{}",
                more.iter().map(|s| format!("/{s}")).collect::<String>()
            ),
        },
    }
}

/// Where objects name other objects' namespaces: an Event's subjects
/// (`events.k8s.io/v1` and core `v1`). They move with the object, so an
/// Event recorded in a virtual cluster is about the host namespace's object.
const REFERENCED_NAMESPACES: [&str; 3] = [
    "/regarding/namespace",
    "/related/namespace",
    "/involvedObject/namespace",
];

/// Replaces `from` with `to` at each of [`REFERENCED_NAMESPACES`] in
/// `object`.
fn move_references(object: &mut Value, from: &str, to: &str) {
    for pointer in REFERENCED_NAMESPACES {
        if let Some(namespace) = object.pointer_mut(pointer)
            && namespace.as_str() == Some(from)
        {
            *namespace = Value::String(to.to_string());
        }
    }
}

/// Moves an object (or each item of a list) from the virtual namespace to
/// the host namespace. An object naming another namespace is refused.
pub(crate) fn to_host(value: &mut Value, host_namespace: &str) -> Result<(), String> {
    for object in objects_mut(value) {
        move_references(object, VIRTUAL_NAMESPACE, host_namespace);
        if let Some(namespace) = object.pointer_mut("/metadata/namespace") {
            match namespace.as_str() {
                Some(VIRTUAL_NAMESPACE) => *namespace = Value::String(host_namespace.to_string()),
                Some("") | None => {}
                Some(other) => {
                    return Err(format!(
                        "namespace {other:?} does not exist in this virtual cluster; only {VIRTUAL_NAMESPACE:?} does"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Moves an object, each item of a list, or a watch event's object from the
/// host namespace to the virtual one.
pub(crate) fn to_virtual(value: &mut Value, host_namespace: &str) {
    for object in objects_mut(value) {
        move_references(object, host_namespace, VIRTUAL_NAMESPACE);
        if let Some(namespace) = object.pointer_mut("/metadata/namespace")
            && namespace.as_str() == Some(host_namespace)
        {
            *namespace = Value::String(VIRTUAL_NAMESPACE.to_string());
        }
    }
}

/// The objects inside a body: the body itself, a list's items, or a watch
/// event's object.
fn objects_mut(value: &mut Value) -> Vec<&mut Value> {
    let is_event = value.get("type").is_some_and(Value::is_string) && value.get("object").is_some();
    if is_event {
        return value
            .get_mut("object")
            .into_iter()
            .flat_map(objects_mut)
            .collect();
    }
    if value.get("items").is_some_and(Value::is_array) {
        return value
            .get_mut("items")
            .and_then(Value::as_array_mut)
            .map(|items| items.iter_mut().collect())
            .unwrap_or_default();
    }
    if value.is_object() {
        vec![value]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_in_default_go_to_the_host_namespace() {
        assert_eq!(
            route("/api/v1/namespaces/default/configmaps/x", "team-a"),
            Route::Rewritten("/api/v1/namespaces/team-a/configmaps/x".into())
        );
        assert_eq!(
            route(
                "/apis/apps/v1/namespaces/default/deployments/web/scale",
                "team-a"
            ),
            Route::Rewritten("/apis/apps/v1/namespaces/team-a/deployments/web/scale".into())
        );
    }

    #[test]
    fn other_namespaces_and_namespace_objects_are_refused() {
        assert!(
            matches!(route("/api/v1/namespaces/kube-system/secrets", "team-a"), Route::Refused(reason) if reason.contains("kube-system"))
        );
        assert!(matches!(
            route("/api/v1/namespaces", "team-a"),
            Route::Refused(_)
        ));
        assert!(matches!(
            route("/api/v1/namespaces/default", "team-a"),
            Route::Refused(_)
        ));
    }

    #[test]
    fn cluster_wide_paths_need_discovery_and_non_resource_paths_pass() {
        assert_eq!(
            route("/apis/apps/v1/deployments", "ns"),
            Route::ClusterWide {
                group_version: "apis/apps/v1".into(),
                plural: "deployments".into(),
                narrowed: "/apis/apps/v1/namespaces/ns/deployments".into()
            }
        );
        for path in [
            "/version",
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps/v1",
            "/openapi/v2",
        ] {
            assert_eq!(route(path, "ns"), Route::PassThrough, "{path}");
        }
    }

    #[test]
    fn bodies_move_between_namespaces() {
        let mut object = json!({"metadata": {"name": "a", "namespace": "default"}});
        to_host(&mut object, "team-a").expect("allowed");
        assert_eq!(object["metadata"]["namespace"], "team-a");
        to_virtual(&mut object, "team-a");
        assert_eq!(object["metadata"]["namespace"], "default");

        let mut event = json!({
            "metadata": {"name": "e", "namespace": "default"},
            "regarding": {"kind": "ConfigMap", "name": "a", "namespace": "default"},
            "related": {"kind": "Node", "name": "n"},
        });
        to_host(&mut event, "team-a").expect("allowed");
        assert_eq!(event["regarding"]["namespace"], "team-a");
        assert!(event["related"].get("namespace").is_none());
        to_virtual(&mut event, "team-a");
        assert_eq!(event["regarding"]["namespace"], "default");
        let mut foreign = json!({"metadata": {"name": "a", "namespace": "kube-system"}});
        assert!(to_host(&mut foreign, "team-a").is_err());

        let mut list =
            json!({"kind": "ConfigMapList", "items": [{"metadata": {"namespace": "team-a"}}]});
        to_virtual(&mut list, "team-a");
        assert_eq!(list["items"][0]["metadata"]["namespace"], "default");

        let mut event = json!({"type": "ADDED", "object": {"metadata": {"namespace": "team-a"}}});
        to_virtual(&mut event, "team-a");
        assert_eq!(event["object"]["metadata"]["namespace"], "default");

        // JSON patches are arrays: left alone.
        let mut patch = json!([{"op": "add", "path": "/data/x", "value": "y"}]);
        to_host(&mut patch, "team-a").expect("allowed");
        assert_eq!(patch[0]["op"], "add");
    }
}
