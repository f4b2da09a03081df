//! `TYPE/NAME` as kubectl reads it: the type by its plural, singular,
//! kind or short name, optionally with its group (`fleetdeployments.fleet.example`)
//! or version and group (`fleetdeployments.v1alpha1.fleet.example`),
//! found in the hub's aggregated discovery (two requests).

use kube::api::ApiResource;
use kube::core::discovery::v2::{APIGroupDiscovery, APIResourceDiscovery};

use crate::Error;

/// A type of the hub, and whether its objects live in namespaces.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub(crate) resource: ApiResource,
    pub(crate) namespaced: bool,
}

/// `TYPE/NAME`, split.
pub(crate) fn split(object: &str) -> Result<(&str, &str), Error> {
    match object.split_once('/') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((kind, name))
        }
        _ => Err(Error::Refused(format!(
            "{object:?}: name the object as TYPE/NAME (fleetdeployments/web, secret/east)"
        ))),
    }
}

/// The hub's type `kind` names.
pub(crate) async fn resolve(client: &kube::Client, kind: &str) -> Result<Resolved, Error> {
    let mut groups = client.list_core_api_versions_aggregated().await?.items;
    groups.extend(client.list_api_groups_aggregated().await?.items);
    find(&groups, kind).ok_or_else(|| {
        Error::Refused(format!(
            "the hub has no resource type {kind:?} (as plural, singular, kind or short name)"
        ))
    })
}

/// The first type of `groups` (the core group first, then as the server
/// lists them; each group's preferred version first) that `kind` names.
fn find(groups: &[APIGroupDiscovery], kind: &str) -> Option<Resolved> {
    let kind = kind.to_ascii_lowercase();
    // `name.version.group` and `name.group`: tried as the whole first.
    let (name, qualifier) = match kind.split_once('.') {
        Some((name, qualifier)) => (name, Some(qualifier)),
        None => (kind.as_str(), None),
    };
    for group in groups {
        let group_name = group
            .metadata
            .as_ref()
            .and_then(|metadata| metadata.name.clone())
            .unwrap_or_default();
        for version in &group.versions {
            let Some(version_name) = version.version.as_deref() else {
                continue;
            };
            let qualified = match qualifier {
                None => true,
                Some(qualifier) => {
                    qualifier == group_name || qualifier == format!("{version_name}.{group_name}")
                }
            };
            if !qualified {
                continue;
            }
            for resource in &version.resources {
                if names(resource, name) {
                    return resolved(&group_name, version_name, resource);
                }
            }
        }
    }
    None
}

/// Whether `resource` goes by `name` (lower case).
fn names(resource: &APIResourceDiscovery, name: &str) -> bool {
    let kind = resource
        .response_kind
        .as_ref()
        .and_then(|kind| kind.kind.as_deref());
    resource.resource.as_deref() == Some(name)
        || resource.singular_resource.as_deref() == Some(name)
        || kind.is_some_and(|kind| kind.eq_ignore_ascii_case(name))
        || resource.short_names.iter().any(|short| short == name)
}

fn resolved(group: &str, version: &str, resource: &APIResourceDiscovery) -> Option<Resolved> {
    let plural = resource.resource.clone()?;
    let kind = resource.response_kind.as_ref()?.kind.clone()?;
    let api_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(Resolved {
        resource: ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version,
            kind,
            plural,
        },
        namespaced: resource.scope.as_deref() == Some("Namespaced"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Vec<APIGroupDiscovery> {
        serde_json::from_value(serde_json::json!([
            {"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": [
                {"resource": "secrets", "singularResource": "secret", "scope": "Namespaced",
                 "responseKind": {"group": "", "version": "v1", "kind": "Secret"}, "verbs": ["get"]},
                {"resource": "namespaces", "singularResource": "namespace", "scope": "Cluster",
                 "shortNames": ["ns"], "responseKind": {"kind": "Namespace"}, "verbs": ["get"]},
            ]}]},
            {"metadata": {"name": "fleet.example"}, "versions": [
                {"version": "v1beta1", "resources": [
                    {"resource": "fleetdeployments", "singularResource": "fleetdeployment",
                     "scope": "Namespaced", "shortNames": ["fd"],
                     "responseKind": {"kind": "FleetDeployment"}, "verbs": ["get"]}]},
                {"version": "v1alpha1", "resources": [
                    {"resource": "fleetdeployments", "singularResource": "fleetdeployment",
                     "scope": "Namespaced", "responseKind": {"kind": "FleetDeployment"}, "verbs": ["get"]}]},
            ]},
        ]))
        .expect("discovery")
    }

    #[test]
    fn a_type_is_found_by_each_of_its_names_in_its_preferred_version() {
        let groups = groups();
        for name in [
            "fleetdeployments",
            "fleetdeployment",
            "FleetDeployment",
            "fd",
        ] {
            let found = find(&groups, name).expect(name);
            assert_eq!(
                found.resource.api_version, "fleet.example/v1beta1",
                "{name}"
            );
            assert_eq!(found.resource.plural, "fleetdeployments");
            assert!(found.namespaced);
        }
        let older = find(&groups, "fleetdeployments.v1alpha1.fleet.example").expect("versioned");
        assert_eq!(older.resource.api_version, "fleet.example/v1alpha1");
        assert_eq!(
            find(&groups, "fd.fleet.example")
                .expect("grouped")
                .resource
                .kind,
            "FleetDeployment"
        );
        let secret = find(&groups, "secret").expect("core");
        assert_eq!(
            (
                secret.resource.api_version.as_str(),
                secret.resource.group.as_str()
            ),
            ("v1", "")
        );
        assert!(!find(&groups, "ns").expect("short").namespaced);
        assert!(find(&groups, "fleetdeployments.other.example").is_none());
        assert!(find(&groups, "widgets").is_none());
    }

    #[test]
    fn an_object_must_be_named_as_type_and_name() {
        assert_eq!(split("secret/east").expect("split"), ("secret", "east"));
        for bad in ["east", "secret/", "/east", "secret/a/b"] {
            let err = split(bad).expect_err(bad).to_string();
            assert!(err.contains("TYPE/NAME") && err.contains(bad), "{err}");
        }
    }
}
