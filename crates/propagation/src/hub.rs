//! A hub request: the hub object's finalizer, released once no engaged
//! member holds anything made for it, and its status.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::status::{self, MemberState, Outcome};
use super::{HubKey, Members, STATUS_COALESCE, Shared, StatusTarget};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{Action, ReconcileError, Request, finalizer};

/// How soon a hub object whose members still hold its objects is looked
/// at again (their removal also queues it).
const CLEANUP_RECHECK: Duration = Duration::from_secs(2);

impl<K> Shared<K>
where
    K: CachedResource + Serialize + DeserializeOwned,
{
    pub(super) async fn reconcile_hub(
        &self,
        request: Request,
        hub_cluster: Cluster,
    ) -> Result<Action, ReconcileError> {
        let key: HubKey = (request.namespace.clone(), request.name.clone());
        let Some(hub) = hub_cluster
            .cache()
            .get::<K>(key.0.as_deref(), &key.1)
            .await?
        else {
            self.change_outcomes(|outcomes| outcomes.forget(&key));
            crate::lock(&self.status_written).remove(&key);
            self.rollouts.forget(&key);
            return Ok(Action::await_change());
        };
        let wanted = (self.select)(&hub) && hub.meta().deletion_timestamp.is_none();
        if !wanted {
            if !self.members_clean(&key) {
                return Ok(Action::requeue(CLEANUP_RECHECK));
            }
            self.change_outcomes(|outcomes| outcomes.forget(&key));
            finalizer::release(&hub_cluster, &self.finalizer, hub.as_ref()).await?;
            return Ok(Action::await_change());
        }
        let action = finalizer::finalizer(&hub_cluster, &self.finalizer, hub, |event| async {
            match event {
                finalizer::Event::Apply(hub) => {
                    // A paced rollout's step is not coalesced: a freed slot
                    // goes to the next member at once.
                    let step_due = self.step_rollout(&hub_cluster, &key, hub.as_ref()).await?;
                    let sooner = |after: Duration| {
                        Action::requeue(step_due.map_or(after, |due| due.min(after)))
                    };
                    // At most one status write a second per hub object: its
                    // own write is an event too, and would chain writes
                    // while members come in.
                    let since = crate::lock(&self.status_written)
                        .get(&key)
                        .map(|at| at.elapsed());
                    if let Some(since) = since.filter(|since| *since < STATUS_COALESCE) {
                        return Ok(sooner(STATUS_COALESCE - since));
                    }
                    if self.write_status(&hub_cluster, &key, hub.as_ref()).await? {
                        crate::lock(&self.status_written).insert(key.clone(), Instant::now());
                    }
                    Ok::<_, ReconcileError>(
                        step_due.map_or_else(Action::await_change, Action::requeue),
                    )
                }
                // Not reached: a hub object being deleted is handled above.
                finalizer::Event::Cleanup(_) => Ok(Action::requeue(CLEANUP_RECHECK)),
            }
        })
        .await?;
        Ok(action)
    }

    /// Whether no engaged member holds an object made for `key` (as far
    /// as the members' watches have listed).
    fn members_clean(&self, key: &HubKey) -> bool {
        let Some(controller) = self.controller.get() else {
            return false;
        };
        controller
            .engaged_clusters()
            .into_iter()
            .filter(|name| !name.is_local())
            .filter_map(|name| controller.cluster(&name))
            .all(|member| self.holds_nothing(key, &member))
    }

    /// The outcome of every member the hub object concerns: those with an
    /// outcome that are still engaged or chosen, engaged selected ones not
    /// yet reconciled (`Pending`), chosen ones not engaged (`NotEngaged`).
    fn member_outcomes(&self, key: &HubKey, hub: &K) -> BTreeMap<ClusterName, Outcome> {
        let Some(controller) = self.controller.get() else {
            return BTreeMap::new();
        };
        let engaged: Vec<(ClusterName, Cluster)> = controller
            .engaged_clusters()
            .into_iter()
            .filter(|name| !name.is_local())
            .filter_map(|name| controller.cluster(&name).map(|cluster| (name, cluster)))
            .collect();
        let chosen = match &self.members {
            Members::Chosen(choose) => choose(hub),
            _ => Vec::new(),
        };
        self.change_outcomes(|outcomes| {
            outcomes.keep_only(key, |name| {
                engaged.iter().any(|(engaged, _)| engaged == name) || chosen.contains(name)
            });
            for (name, cluster) in &engaged {
                if outcomes.get(key, name).is_none() && self.members.includes(hub, name, cluster) {
                    outcomes.set(key, name, Outcome::pending());
                }
            }
            for name in &chosen {
                if !engaged.iter().any(|(engaged, _)| engaged == name) {
                    outcomes.set(key, name, Outcome::failed(MemberState::NotEngaged, None));
                }
            }
            outcomes.members(key).cloned().unwrap_or_default()
        })
    }

    /// Writes the members' status to the hub object, unless it says that
    /// already; whether it wrote.
    async fn write_status(
        &self,
        hub_cluster: &Cluster,
        key: &HubKey,
        hub: &K,
    ) -> Result<bool, ReconcileError> {
        if self.status == StatusTarget::None {
            return Ok(false);
        }
        let outcomes = self.member_outcomes(key, hub);
        let status::Rendered {
            members,
            counts,
            mut condition,
        } = status::render(
            &outcomes,
            hub.meta().generation,
            self.rollout_summary(key, hub),
        );
        let resource = ApiResource::erase::<K>(&());
        let api: Api<DynamicObject> = match &key.0 {
            Some(namespace) => Api::namespaced_with(hub_cluster.client(), namespace, &resource),
            None => Api::all_with(hub_cluster.client(), &resource),
        };
        let identity = json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": { "name": key.1, "namespace": key.0 },
        });
        let params = PatchParams::apply(&self.status_manager).force();
        match &self.status {
            StatusTarget::None => Ok(false),
            StatusTarget::Subresource => {
                let current = serde_json::to_value(hub)?;
                let live = current.get("status");
                let previous = status::current_condition(live);
                if live.and_then(|status| status.get("members")) == Some(&members)
                    && previous.is_some_and(|previous| status::same_condition(previous, &condition))
                {
                    return Ok(false);
                }
                // The transition time moves only when the status does.
                let since = previous
                    .filter(|previous| previous.get("status") == condition.get("status"))
                    .and_then(|previous| previous.get("lastTransitionTime").cloned())
                    .unwrap_or_else(|| {
                        json!(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::now()
                        ))
                    });
                condition["lastTransitionTime"] = since;
                let mut patch = identity;
                patch["status"] =
                    json!({ "members": members, "counts": counts, "conditions": [condition] });
                api.patch_status(&key.1, &params, &Patch::Apply(&patch))
                    .await?;
                Ok(true)
            }
            StatusTarget::Annotation(annotation) => {
                let text = serde_json::to_string(
                    &json!({ "members": members, "counts": counts, "condition": condition }),
                )?;
                let current = hub
                    .meta()
                    .annotations
                    .as_ref()
                    .and_then(|annotations| annotations.get(annotation));
                if current == Some(&text) {
                    return Ok(false);
                }
                let mut patch = identity;
                patch["metadata"]["annotations"] = json!({ annotation.as_str(): text });
                api.patch(&key.1, &params, &Patch::Apply(&patch)).await?;
                Ok(true)
            }
        }
    }
}
