//! Letting go of what was made in a member: deleted, or orphaned (left in
//! the member with nothing of the propagation on it: its label, its
//! annotations and its field ownership removed, so nothing claims it
//! later), in reverse waves (what needs a namespace or a definition goes
//! before it).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::kinds::Kind;
use super::{HubKey, PROPAGATION_LABEL, REVISION_ANNOTATION, Shared};
use multicluster_runtime::Cluster;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{ReconcileError, Request};

/// Annotation on a desired object saying what becomes of it in a member
/// once it is no longer wanted there (`"orphan"` or `"delete"`), whatever
/// the propagation's policy for that case.
pub const DELETION_POLICY_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/deletion-policy";

/// What becomes of the objects made in a member once they are no longer
/// wanted there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeletionPolicy {
    /// Deleted (the default).
    #[default]
    Delete,
    /// Left in the member, with the propagation's label, annotations and
    /// field ownership removed: the member's own from then on.
    Orphan,
}

impl DeletionPolicy {
    /// The policy `meta`'s annotation names, else `self`.
    fn for_object(self, meta: &ObjectMeta) -> Self {
        let named = meta
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(DELETION_POLICY_ANNOTATION))
            .map(|policy| policy.trim().to_ascii_lowercase());
        match named.as_deref() {
            Some("orphan") => DeletionPolicy::Orphan,
            Some("delete") => DeletionPolicy::Delete,
            _ => self,
        }
    }
}

/// How letting go of a member's objects stands.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LettingGo {
    /// Nothing made for the hub object is left (that is not kept).
    Done,
    /// A propagated type's watch has not listed yet (these types), so not
    /// everything could be looked at.
    Unlisted(String),
    /// Objects of a later wave are going; the earlier wave waits for
    /// them to be gone.
    Waiting(String),
}

impl<K> Shared<K>
where
    K: CachedResource + Serialize + DeserializeOwned,
{
    /// Lets go of the objects made for `key` in `member` that are not in
    /// `keep` (type, namespace, name), by `policy` unless an object's
    /// annotation says otherwise: the latest wave first, an earlier wave
    /// only once those after it are gone.
    pub(super) async fn let_go(
        &self,
        key: &HubKey,
        member: &Cluster,
        keep: &[(ApiResource, Option<String>, String)],
        policy: DeletionPolicy,
    ) -> Result<LettingGo, ReconcileError> {
        let mut unlisted = Vec::new();
        let mut waves: BTreeMap<u32, Vec<(&Kind, ObjectMeta)>> = BTreeMap::new();
        for kind in &self.kinds {
            let Some(found) = kind.find(member, &crate::kinds::Query::MadeFor(key)) else {
                unlisted.push(kind.resource.plural.as_str());
                continue;
            };
            for meta in found {
                let kept = keep.iter().any(|(resource, namespace, name)| {
                    kind.is(resource)
                        && *namespace == meta.namespace
                        && meta.name.as_ref() == Some(name)
                });
                if !kept {
                    let wave = crate::waves::wave_for(&kind.resource, meta.annotations.as_ref());
                    waves.entry(wave).or_default().push((kind, meta));
                }
            }
        }
        let mut waves = waves.into_iter().rev().peekable();
        while let Some((_, objects)) = waves.next() {
            let mut going = Vec::new();
            for (kind, meta) in objects {
                let Some(name) = meta.name.clone() else {
                    continue;
                };
                going.push(format!("{} {name}", kind.resource.kind));
                if meta.deletion_timestamp.is_some() {
                    continue;
                }
                let api = api_for(member, &kind.resource, meta.namespace.as_deref());
                match policy.for_object(&meta) {
                    DeletionPolicy::Delete => {
                        match api.delete(&name, &DeleteParams::background()).await {
                            Ok(_) => {}
                            Err(kube::Error::Api(status)) if status.code == 404 => {}
                            Err(err) => return Err(err.into()),
                        }
                    }
                    DeletionPolicy::Orphan => self.orphan(&api, &name).await?,
                }
            }
            if waves.peek().is_some() {
                going.truncate(3);
                return Ok(LettingGo::Waiting(going.join(", ")));
            }
        }
        if unlisted.is_empty() {
            Ok(LettingGo::Done)
        } else {
            Ok(LettingGo::Unlisted(unlisted.join(", ")))
        }
    }

    /// Takes everything of the propagation off `name`: its label, the
    /// owner, revision and deletion-policy annotations, and its field
    /// manager's entry, so no later apply (of this propagation or another)
    /// finds it claimed. This is a change of every orphaned object at once,
    /// and the apps API moves a Deployment's (StatefulSet's, DaemonSet's)
    /// `metadata.generation` when its annotations change: a watcher sees
    /// a new generation, though no pod template changed and no pod is
    /// replaced.
    /// Written with the `resourceVersion` read, so a stale list of
    /// managers is never written back.
    async fn orphan(&self, api: &Api<DynamicObject>, name: &str) -> Result<(), ReconcileError> {
        let Some(current) = api.get_metadata_opt(name).await? else {
            return Ok(());
        };
        let meta = current.metadata;
        let mut managers: Vec<Value> = meta
            .managed_fields
            .iter()
            .flatten()
            .filter(|entry| entry.manager.as_deref() != Some(self.name.as_str()))
            .map(|entry| serde_json::to_value(entry).unwrap_or_default())
            .collect();
        if managers.is_empty() {
            // An empty list leaves managedFields as it is (on purpose, for
            // clients that do not know the field); this clears it.
            managers.push(json!({}));
        }
        let mut annotations = serde_json::Map::new();
        let owner = Request::new(multicluster_runtime::ClusterName::local(), None, "");
        for key in owner
            .owner_annotations()
            .into_keys()
            .chain([Request::OWNER_CLUSTER_ANNOTATION.to_string()])
            .chain([REVISION_ANNOTATION.to_string()])
            .chain([DELETION_POLICY_ANNOTATION.to_string()])
        {
            annotations.insert(key, Value::Null);
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": meta.resource_version,
                "labels": { PROPAGATION_LABEL: null },
                "annotations": annotations,
                "managedFields": managers,
            }
        });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err.into()),
        }
    }
}

/// The API of `resource` in `member`, in `namespace` when given.
pub(super) fn api_for(
    member: &Cluster,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(namespace) => Api::namespaced_with(member.client(), namespace, resource),
        None => Api::all_with(member.client(), resource),
    }
}
