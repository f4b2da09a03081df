//! A hub request: the hub object's finalizer, released once no engaged
//! member holds anything made for it, and its status.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::Instrument;

use super::status::{self, MemberState, Outcome};
use super::{HubKey, Members, STATUS_COALESCE, Shared, StatusTarget};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{Action, ReconcileError, Request, finalizer};
use multicluster_runtime::coordinator::Replicas;

/// How soon a hub object whose members still hold its objects is looked
/// at again (their removal also queues it).
const CLEANUP_RECHECK: Duration = Duration::from_secs(2);

/// Annotation on a hub object being deleted, when replicas share the
/// fleet: by propagation, the replicas whose members hold nothing made
/// for it any more (JSON). Its finalizer goes once every live replica is
/// listed.
pub const CLEANED_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/cleaned";

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
            if hub.meta().deletion_timestamp.is_some()
                && !self
                    .every_replica_clean(&hub_cluster, &key, hub.as_ref())
                    .await?
            {
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
                    // The members given a slot here are queued from this
                    // span: their reconciles are its children in a trace.
                    let step = if self.rollouts.is_paced(hub.as_ref()) {
                        tracing::info_span!("rollout step")
                    } else {
                        tracing::Span::none()
                    };
                    let step_due = self
                        .step_rollout(&hub_cluster, &key, hub.as_ref())
                        .instrument(step)
                        .await?;
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
                    if self
                        .write_status(&hub_cluster, &key, hub.as_ref())
                        .instrument(tracing::info_span!("status write"))
                        .await?
                    {
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

    /// Among replicas sharing the fleet, each cleans its own members: the
    /// hub object being deleted keeps its finalizer until every live
    /// replica has said so ([`CLEANED_ANNOTATION`]). This replica's
    /// members are clean; says so if it has not yet, and whether every
    /// live replica has. True at once for one replica alone.
    async fn every_replica_clean(
        &self,
        hub_cluster: &Cluster,
        key: &HubKey,
        hub: &K,
    ) -> Result<bool, ReconcileError> {
        let Some(replicas) = self.controller.get().and_then(|c| c.replicas()) else {
            return Ok(true);
        };
        let mut cleaned: BTreeMap<String, Vec<String>> = hub
            .meta()
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(CLEANED_ANNOTATION))
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        let ours = cleaned.entry(self.name.clone()).or_default();
        if ours.contains(&replicas.me) {
            return Ok(replicas.live.iter().all(|replica| ours.contains(replica)));
        }
        ours.push(replicas.me.clone());
        ours.sort();
        let resource = ApiResource::erase::<K>(&());
        let api = super::letting_go::api_for(hub_cluster, &resource, key.0.as_deref());
        // With the resourceVersion the cache saw: another replica saying
        // so at the same time is not written over.
        let patch = json!({
            "metadata": {
                "resourceVersion": hub.meta().resource_version,
                "annotations": { CLEANED_ANNOTATION: serde_json::to_string(&cleaned)? },
            },
        });
        written(
            api.patch(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        )?;
        Ok(false)
    }

    /// The outcome of every member the hub object concerns: those with an
    /// outcome that are still engaged or chosen, engaged selected ones not
    /// yet reconciled (`Pending`), chosen ones not engaged (`NotEngaged`).
    fn member_outcomes(
        &self,
        key: &HubKey,
        hub: &K,
        replicas: Option<&Replicas>,
    ) -> BTreeMap<ClusterName, Outcome> {
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
            // Among replicas sharing the fleet, a member engaged elsewhere
            // is the other replica's to tell about.
            let elsewhere = |name: &ClusterName| replicas.is_some_and(|r| !r.is_mine(name));
            outcomes.keep_only(key, |name| {
                engaged.iter().any(|(engaged, _)| engaged == name)
                    || (chosen.contains(name) && !elsewhere(name))
            });
            for (name, cluster) in &engaged {
                if outcomes.get(key, name).is_none() && self.members.includes(hub, name, cluster) {
                    outcomes.set(key, name, Outcome::pending());
                }
            }
            for name in &chosen {
                if !elsewhere(name) && !engaged.iter().any(|(engaged, _)| engaged == name) {
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
        let replicas = self
            .controller
            .get()
            .and_then(multicluster_runtime::controller::Controller::replicas);
        let outcomes = self.member_outcomes(key, hub, replicas.as_ref());
        let value = serde_json::to_value(hub)?;
        let current = match &self.status {
            StatusTarget::Annotation(annotation) => value
                .pointer("/metadata/annotations")
                .and_then(|annotations| annotations.get(annotation))
                .and_then(Value::as_str)
                .and_then(|text| serde_json::from_str::<Value>(text).ok()),
            _ => value.get("status").cloned(),
        };
        let rollout = self.rollout_summary(key, hub);
        let status::Rendered {
            members,
            counts,
            mut condition,
            by_replica,
        } = match &replicas {
            None => status::render(&outcomes, hub.meta().generation, rollout),
            Some(replicas) => status::render_shared(
                current.as_ref(),
                &outcomes,
                &replicas.me,
                &replicas.live,
                &|name| replicas.is_mine(name),
                hub.meta().generation,
                rollout,
            ),
        };
        let resource = ApiResource::erase::<K>(&());
        let api = super::letting_go::api_for(hub_cluster, &resource, key.0.as_deref());
        let mut identity = json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": { "name": key.1, "namespace": key.0 },
        });
        if replicas.is_some() {
            // Several replicas write the whole of it, each its own
            // members' part: none may write over what another wrote since
            // its cache saw the object (the other's write is an event, and
            // this one is tried again).
            identity["metadata"]["resourceVersion"] = value["metadata"]["resourceVersion"].clone();
        }
        let params = PatchParams::apply(&self.status_manager).force();
        match &self.status {
            StatusTarget::None => Ok(false),
            StatusTarget::Subresource => {
                let live = current.as_ref();
                let previous = status::current_condition(live);
                if live.and_then(|status| status.get("members")) == Some(&members)
                    && live.and_then(|status| status.get("countsByReplica")) == by_replica.as_ref()
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
                if let Some(by_replica) = by_replica {
                    patch["status"]["countsByReplica"] = by_replica;
                }
                written(
                    api.patch_status(&key.1, &params, &Patch::Apply(&patch))
                        .await,
                )
            }
            StatusTarget::Annotation(annotation) => {
                let mut text =
                    json!({ "members": members, "counts": counts, "condition": condition });
                if let Some(by_replica) = by_replica {
                    text["countsByReplica"] = by_replica;
                }
                let text = serde_json::to_string(&text)?;
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
                written(api.patch(&key.1, &params, &Patch::Apply(&patch)).await)
            }
        }
    }
}

/// Whether a status write went through: a lost race (another replica
/// wrote since the cache saw the object) is no failure, its write is an
/// event that brings this reconcile back.
fn written(answer: Result<DynamicObject, kube::Error>) -> Result<bool, ReconcileError> {
    match answer {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(err) => Err(err.into()),
    }
}
