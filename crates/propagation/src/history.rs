//! A hub object's revision history, kept as Kubernetes keeps a
//! StatefulSet's or a DaemonSet's: one ControllerRevision per revision,
//! in the hub object's namespace and owned by it (so the hub's garbage
//! collector removes them with it), holding the hub object as it was, so
//! that an older revision's desired objects can be computed again exactly.
//! A cluster-scoped hub object's go in `default` (a namespaced object may
//! have a cluster-scoped owner; the reverse is not allowed). At most the
//! newest `limit` are kept per hub object and propagation.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::Value;

use super::{HubKey, PROPAGATION_LABEL};
use multicluster_runtime::Cluster;
use multicluster_runtime::redact::Redacted;

/// The label naming the hub object a ControllerRevision was kept for (a
/// digest of its namespace and name: a label value holds 63 characters, a
/// name 253).
pub(crate) const HUB_LABEL: &str = "propagation.mcr.sigs.k8s.io/hub";

/// Where the revisions of cluster-scoped hub objects are kept, as
/// ControllerRevisions (namespaced objects) owned by the hub object; a
/// namespaced hub object's are kept in its own namespace.
pub const CLUSTER_SCOPED_HISTORY_NAMESPACE: &str = "default";

/// One hub object's kept revisions: by revision, its place in the history
/// (the ControllerRevision's `revision`) and the hub object as it was.
type Revisions = BTreeMap<String, (i64, Value)>;

/// The revisions known of each hub object.
#[derive(Default)]
pub(super) struct History {
    limit: usize,
    known: Mutex<HashMap<HubKey, Revisions>>,
    /// Whether the hub refused a ControllerRevision already (warned once).
    refused: AtomicBool,
}

impl History {
    /// Keeps at most `limit` revisions per hub object (0: none).
    pub(super) fn new(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Whether revisions are kept at all.
    pub(super) fn keeps(&self) -> bool {
        self.limit > 0
    }

    /// Keeps `hub` (as JSON) as `revision` of `key`, if it is not kept yet,
    /// and lets the oldest go past the limit. Failures are logged (once at
    /// warning level) and leave the revision unkept: a roll back to it is
    /// then refused by name.
    pub(super) async fn keep(
        &self,
        hub_cluster: &Cluster,
        propagation: &str,
        key: &HubKey,
        hub: &Value,
        revision: &str,
    ) {
        if !self.keeps() {
            return;
        }
        if let Err(err) = self
            .try_keep(hub_cluster, propagation, key, hub, revision)
            .await
        {
            if !self.refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(propagation, hub = %key.1, error = %err, "cannot keep the hub object's revision history (it needs create, list and delete on controllerrevisions): roll backs are refused; later failures are logged at debug level");
            } else {
                tracing::debug!(propagation, hub = %key.1, error = %err, "revision not kept");
            }
        }
    }

    async fn try_keep(
        &self,
        hub_cluster: &Cluster,
        propagation: &str,
        key: &HubKey,
        hub: &Value,
        revision: &str,
    ) -> Result<(), String> {
        // Kept already: every step after the first of a revision.
        if crate::lock(&self.known)
            .get(key)
            .is_some_and(|revisions| revisions.contains_key(revision))
        {
            return Ok(());
        }
        let revisions = self.load(hub_cluster, propagation, key).await?;
        if revisions.contains_key(revision) {
            return Ok(());
        }
        let next = revisions.values().map(|(at, _)| *at).max().unwrap_or(0) + 1;
        let api = api_for(hub_cluster, key);
        let kept = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(name_for(propagation, key, revision)),
                labels: Some(labels_for(propagation, key)),
                annotations: Some(BTreeMap::from([(
                    crate::REVISION_ANNOTATION.to_string(),
                    revision.to_string(),
                )])),
                owner_references: owner_of(hub).map(|owner| vec![owner]),
                ..ObjectMeta::default()
            },
            revision: next,
            data: Some(RawExtension(as_kept(hub))),
        };
        match api.create(&PostParams::default(), &kept).await {
            Ok(_) => {}
            // Kept by another replica meanwhile: read it at the next load.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                crate::lock(&self.known).remove(key);
                return Ok(());
            }
            Err(err) => return Err(Redacted::kube(&err).as_str().to_string()),
        }
        // The oldest past the limit go.
        let gone: Vec<String> = {
            let mut known = crate::lock(&self.known);
            let revisions = known.entry(key.clone()).or_default();
            revisions.insert(revision.to_string(), (next, as_kept(hub)));
            let mut oldest: Vec<(i64, String)> = revisions
                .iter()
                .map(|(revision, (at, _))| (*at, revision.clone()))
                .collect();
            oldest.sort();
            let excess = oldest.len().saturating_sub(self.limit);
            let gone: Vec<String> = oldest
                .into_iter()
                .take(excess)
                .map(|(_, revision)| revision)
                .collect();
            for revision in &gone {
                revisions.remove(revision);
            }
            gone
        };
        for revision in gone {
            let name = name_for(propagation, key, &revision);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(Redacted::kube(&err).as_str().to_string()),
            }
        }
        Ok(())
    }

    /// The hub object as it was at `revision` of `key`, if that revision is
    /// kept.
    pub(super) async fn content(
        &self,
        hub_cluster: &Cluster,
        propagation: &str,
        key: &HubKey,
        revision: &str,
    ) -> Option<Value> {
        if let Some((_, content)) = crate::lock(&self.known)
            .get(key)
            .and_then(|revisions| revisions.get(revision))
        {
            return Some(content.clone());
        }
        let revisions = self.load(hub_cluster, propagation, key).await.ok()?;
        revisions.get(revision).map(|(_, content)| content.clone())
    }

    /// The revisions of `key` kept, as the hub has them (read once, then
    /// from memory).
    async fn load(
        &self,
        hub_cluster: &Cluster,
        propagation: &str,
        key: &HubKey,
    ) -> Result<Revisions, String> {
        if let Some(revisions) = crate::lock(&self.known).get(key) {
            return Ok(revisions.clone());
        }
        let selector = labels_for(propagation, key)
            .into_iter()
            .map(|(label, value)| format!("{label}={value}"))
            .collect::<Vec<_>>()
            .join(",");
        let listed = api_for(hub_cluster, key)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|err| Redacted::kube(&err).as_str().to_string())?;
        let revisions: Revisions = listed
            .items
            .into_iter()
            .filter_map(|kept| {
                let revision = kept
                    .metadata
                    .annotations?
                    .get(crate::REVISION_ANNOTATION)?
                    .clone();
                Some((revision, (kept.revision, kept.data?.0)))
            })
            .collect();
        crate::lock(&self.known).insert(key.clone(), revisions.clone());
        Ok(revisions)
    }

    /// Forgets what is known of `key` (the hub object is gone; its
    /// ControllerRevisions go with it, by their owner).
    pub(super) fn forget(&self, key: &HubKey) {
        crate::lock(&self.known).remove(key);
    }
}

/// The ControllerRevisions of the hub object `key`.
fn api_for(hub_cluster: &Cluster, key: &HubKey) -> Api<ControllerRevision> {
    Api::namespaced(
        hub_cluster.client(),
        key.0.as_deref().unwrap_or(CLUSTER_SCOPED_HISTORY_NAMESPACE),
    )
}

fn labels_for(propagation: &str, key: &HubKey) -> BTreeMap<String, String> {
    let hub = format!("{}/{}", key.0.as_deref().unwrap_or_default(), key.1);
    BTreeMap::from([
        (PROPAGATION_LABEL.to_string(), propagation.to_string()),
        (
            HUB_LABEL.to_string(),
            format!("{:016x}", crate::digest::fnv1a(hub.as_bytes())),
        ),
    ])
}

/// `<propagation>-<hub name>-<revision>`, shortened with a digest when it
/// would pass the 253 characters of a name.
fn name_for(propagation: &str, key: &HubKey, revision: &str) -> String {
    let name = format!("{propagation}-{}-{revision}", key.1);
    if name.len() <= 253 {
        return name;
    }
    let digest = format!("{:016x}", crate::digest::fnv1a(name.as_bytes()));
    format!("{}-{digest}", &name[..200])
}

/// The hub object's ownerReference, for what goes with it (its
/// ControllerRevisions, its gates' Jobs).
pub(crate) fn owner_of(hub: &Value) -> Option<OwnerReference> {
    let text = |pointer: &str| hub.pointer(pointer)?.as_str().map(str::to_string);
    Some(OwnerReference {
        api_version: text("/apiVersion")?,
        kind: text("/kind")?,
        name: text("/metadata/name")?,
        uid: text("/metadata/uid")?,
        ..OwnerReference::default()
    })
}

/// The hub object as kept: what its desired objects may depend on, not
/// what the server keeps for itself (`resourceVersion`, `managedFields`)
/// nor its status.
fn as_kept(hub: &Value) -> Value {
    let mut kept = hub.clone();
    if let Some(metadata) = kept.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
    }
    if let Some(object) = kept.as_object_mut() {
        object.remove("status");
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_within_the_limit_and_apart() {
        let key: HubKey = (Some("team".into()), "web".into());
        assert_eq!(name_for("roll", &key, "7"), "roll-web-7");
        let long: HubKey = (None, "x".repeat(253));
        let (a, b) = (name_for("roll", &long, "7"), name_for("roll", &long, "8"));
        assert!(a.len() <= 253 && b.len() <= 253);
        assert_ne!(a, b);
        let labels = labels_for("roll", &long);
        assert!(labels.values().all(|value| value.len() <= 63), "{labels:?}");
    }
}
