//! ownerReferences of desired objects: a member's garbage collector
//! deletes an object whose owner it does not hold (no object of that uid
//! in that cluster) about a second after it is made, and the propagation
//! would make it again, in a loop. A desired object's owners must be
//! objects of its member; one naming the hub object, or anything else the
//! member does not hold, is refused before anything is applied.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, GroupVersionKind};
use serde_json::Value;

use super::Desired;
use multicluster_runtime::Cluster;
use multicluster_runtime::redact::Redacted;

/// One ownerReference as a desired object carries it.
struct Owner<'a> {
    api_version: &'a str,
    kind: &'a str,
    name: &'a str,
    uid: &'a str,
}

impl<'a> Owner<'a> {
    fn of(reference: &'a Value) -> Self {
        let field = |key: &str| reference[key].as_str().unwrap_or_default();
        Self {
            api_version: field("apiVersion"),
            kind: field("kind"),
            name: field("name"),
            uid: field("uid"),
        }
    }

    fn described(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

/// Why `desired`, made for `hub`, may not be applied in `member` for its
/// ownerReferences, or `None` when each names an object `member` holds.
/// Looks each owner up in the member (its kind by discovery), so a
/// desired object without ownerReferences costs nothing.
pub(super) async fn refused(
    desired: &Desired,
    hub: &ObjectMeta,
    member: &Cluster,
) -> Option<String> {
    let references = desired
        .object
        .pointer("/metadata/ownerReferences")?
        .as_array()?;
    let hub_uids: Vec<&str> = hub
        .uid
        .iter()
        .chain(
            hub.owner_references
                .iter()
                .flatten()
                .map(|owner| &owner.uid),
        )
        .map(String::as_str)
        .collect();
    for reference in references {
        let owner = Owner::of(reference);
        if hub_uids.contains(&owner.uid) {
            return Some(format!(
                "its ownerReference to {} names an object of the hub, which the member does not hold: the member's garbage collector would delete it as soon as it is made; leave that ownerReference out (the propagation's label ties it to its hub object)",
                owner.described()
            ));
        }
        if let Some(why) = missing_in(member, desired.namespace(), &owner).await {
            return Some(format!(
                "its ownerReference to {} {why}: the member's garbage collector would delete it as soon as it is made",
                owner.described()
            ));
        }
    }
    None
}

/// Why the member holds no `owner` with its uid, or `None` if it does. A
/// namespaced owner is looked for in the dependent's namespace (the only
/// one the garbage collector accepts).
async fn missing_in(
    member: &Cluster,
    namespace: Option<&str>,
    owner: &Owner<'_>,
) -> Option<String> {
    let (group, version) = match owner.api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", owner.api_version),
    };
    let kind = GroupVersionKind::gvk(group, version, owner.kind);
    let client = member.client();
    let (resource, capabilities) = match kube::discovery::pinned_kind(&client, &kind).await {
        Ok(found) => found,
        Err(err) => {
            return Some(format!(
                "names a kind this member does not serve or could not be asked about ({})",
                Redacted::error(&err).as_str()
            ));
        }
    };
    let api: Api<DynamicObject> = match (capabilities.scope, namespace) {
        (kube::discovery::Scope::Namespaced, Some(namespace)) => {
            Api::namespaced_with(client, namespace, &resource)
        }
        (kube::discovery::Scope::Namespaced, None) => {
            return Some(
                "names a namespaced owner of a cluster-scoped object, which the garbage collector never accepts"
                    .to_string(),
            );
        }
        (kube::discovery::Scope::Cluster, _) => Api::all_with(client, &resource),
    };
    match api.get_opt(owner.name).await {
        Ok(Some(found)) if found.metadata.uid.as_deref() == Some(owner.uid) => None,
        Ok(Some(_)) => Some(format!(
            "names uid {}, which the member's object of that name does not have",
            owner.uid
        )),
        Ok(None) => Some("names an object this member does not hold".to_string()),
        Err(err) => Some(format!(
            "could not be checked in this member ({})",
            Redacted::error(&err).as_str()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_read_from_its_reference_whatever_it_lacks() {
        let reference = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "hub"});
        let owner = Owner::of(&reference);
        assert_eq!(
            (owner.api_version, owner.kind, owner.name, owner.uid),
            ("v1", "ConfigMap", "hub", "")
        );
        assert_eq!(owner.described(), "ConfigMap/hub");
        let owner = Owner::of(&Value::Null);
        assert_eq!(owner.described(), "/");
    }
}
