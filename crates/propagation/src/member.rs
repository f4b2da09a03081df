//! A member request: apply what the hub object wants there, or remove
//! what was made for it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::apply_modes::ApplyMode;
use super::letting_go::{DeletionPolicy, LettingGo, api_for};
use super::maintenance::{MAINTENANCE_LABEL, Maintenance};
use super::status::{MemberState, Outcome};
use super::{Conflicts, Desired, Drift, Health, HubKey, PROPAGATION_LABEL, Shared};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{Action, ReconcileError, Request};
use multicluster_runtime::redact::Redacted;

/// How soon a removal waiting on a member's watch to list looks again.
const NOT_LISTED_YET: Duration = Duration::from_secs(1);

/// How soon a member kept for the surge looks again at those that joined.
const SURGE_RECHECK: Duration = Duration::from_secs(1);

/// A failure to apply in one member, the member's reconcile fails with it
/// (retried with backoff); its outcome is already recorded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(String);

impl<K> Shared<K>
where
    K: CachedResource + Serialize + DeserializeOwned,
{
    pub(super) async fn reconcile_member(
        &self,
        request: Request,
        member: Cluster,
    ) -> Result<Action, ReconcileError> {
        let key: HubKey = (request.namespace.clone(), request.name.clone());
        let Some(hub_cluster) = self
            .controller
            .get()
            .and_then(|controller| controller.cluster(&ClusterName::local()))
        else {
            // Not engaged yet: once it is, its watch of the hub objects
            // lists them and maps each to every member again.
            return Ok(Action::await_change());
        };
        let found = hub_cluster
            .cache()
            .get::<K>(key.0.as_deref(), &key.1)
            .await?;
        // Decided while the hub object is there (a finalizer holds it while
        // it is deleted); once it is gone, only a fixed policy is known.
        let when_deleted = match &found {
            Some(hub) => *self.when_hub_deleted.of(hub),
            None => self.when_hub_deleted.fixed_or(DeletionPolicy::Delete),
        };
        let hub = found.filter(|hub| (self.select)(hub) && hub.meta().deletion_timestamp.is_none());
        let Some(hub) = hub else {
            // Gone, being deleted or no longer selected: nothing to wait for.
            let (action, _) = self
                .remove(&key, &request.cluster, &member, when_deleted)
                .await?;
            return Ok(action);
        };
        if !self.members.includes(&hub, &request.cluster, &member) {
            return self.leave(&hub, &key, &request.cluster, &member).await;
        }
        crate::lock(&self.leaving).remove(&(key.clone(), request.cluster.clone()));
        let maintenance = Maintenance::of(&member);
        if maintenance == Maintenance::Drained {
            return self.drain(&key, &request.cluster, &member).await;
        }
        let value = serde_json::to_value(hub.as_ref())?;
        let revision = crate::rollout::revision_of(&value);
        // Rolling back (paced rollouts only): what the hub object wanted at
        // the earlier revision.
        let rolled_back = if self.rollouts.is_paced(&hub) {
            self.rolled_back_to(&hub_cluster, &key, &value, &revision)
                .await
        } else {
            None
        };
        let (hub, revision) = rolled_back.unwrap_or((hub, revision));
        let at_revision = self.at_revision(&key, &member, &revision);
        if maintenance == Maintenance::Cordoned && !at_revision {
            let reason = format!(
                "cordoned ({MAINTENANCE_LABEL}): keeps what it has; gets revision {revision} once uncordoned"
            );
            self.record(
                &key,
                &request.cluster,
                Some(Outcome::failed(MemberState::Pending, Some(reason))),
            );
            return Ok(Action::await_change());
        }
        let waiting = self.wait_for_slot(
            (&hub, &value),
            &key,
            &request.cluster,
            &revision,
            at_revision,
        );
        // Outside its maintenance windows, a member not holding a slot
        // (or of a rollout without slots) gets nothing new until they open.
        if !at_revision
            && (waiting.is_some() || !self.rollouts.is_paced(&hub))
            && let Some(closed) = crate::windows::closed(
                self.rollouts.of(&hub).windows(),
                &member,
                k8s_openapi::jiff::Timestamp::now(),
            )
        {
            let reason = format!("{}; gets revision {revision} then", closed.reason);
            self.record(
                &key,
                &request.cluster,
                Some(Outcome::failed(MemberState::Pending, Some(reason))),
            );
            return Ok(match closed.opens {
                Some(opens) => Action::requeue(
                    Duration::try_from(opens.duration_since(k8s_openapi::jiff::Timestamp::now()))
                        .unwrap_or_default(),
                ),
                None => Action::await_change(),
            });
        }
        if let Some(waiting) = waiting {
            self.record(&key, &request.cluster, Some(waiting));
            return Ok(Action::requeue(crate::paced::SLOT_RECHECK));
        }
        // A paced member's reconcile is queued by the hub step that gave
        // it its slot, so this span is beneath that hub reconcile in a
        // trace (`multicluster_runtime::telemetry`).
        let span = tracing::info_span!(
            "member apply",
            cluster = %request.cluster,
            hub_namespace = key.0.as_deref().unwrap_or(""),
            hub_name = %key.1,
            revision = %revision,
        );
        let outcome = self
            .apply(&hub, &key, &member, &revision)
            .instrument(span)
            .await;
        if let Some(took) = self.rollouts.became_available(
            &key,
            &request.cluster,
            &revision,
            !at_revision,
            &outcome,
        ) && let Some(metrics) = self.metrics()
        {
            metrics.became_available(took);
        }
        let failed = (outcome.state == MemberState::Failed).then(|| outcome.reason.clone());
        let pending = outcome.state == MemberState::Pending;
        self.tell(&hub, &hub_cluster, &key, &request.cluster, &outcome)
            .await;
        self.record(&key, &request.cluster, Some(outcome));
        match failed {
            Some(reason) => Err(Failed(reason.unwrap_or_default()).into()),
            // Looked at again once the member's watches may have listed.
            None if pending => Ok(Action::requeue(NOT_LISTED_YET)),
            None => Ok(Action::await_change()),
        }
    }

    /// A drained member: what was propagated to it for `key` goes at once
    /// (by the deletion policy of members leaving, latest wave first), and
    /// its entry says it is drained.
    async fn drain(
        &self,
        key: &HubKey,
        name: &ClusterName,
        member: &Cluster,
    ) -> Result<Action, ReconcileError> {
        let (action, done) = self
            .remove(key, name, member, self.when_member_leaves)
            .await?;
        if done {
            let reason = format!(
                "drained ({MAINTENANCE_LABEL}): what was propagated is let go; without the label it comes back"
            );
            self.record(
                key,
                name,
                Some(Outcome::failed(MemberState::Pending, Some(reason))),
            );
        }
        Ok(action)
    }

    /// A member out of the hub object's selection: its objects go once it
    /// has been out for the removal grace, unless it comes back first.
    async fn leave(
        &self,
        hub: &K,
        key: &HubKey,
        name: &ClusterName,
        member: &Cluster,
    ) -> Result<Action, ReconcileError> {
        // A member that never had anything for the hub object (most, when
        // a decision chooses a few of many) has nothing to wait for.
        let had_outcome = crate::lock(&self.outcomes).get(key, name).is_some();
        if !had_outcome && self.holds_nothing(key, member) {
            return Ok(Action::await_change());
        }
        let since = *crate::lock(&self.leaving)
            .entry((key.clone(), name.clone()))
            .or_insert_with(Instant::now);
        let left = since.elapsed();
        if left < self.removal_grace {
            return Ok(Action::requeue(self.removal_grace - left));
        }
        if let Some(waiting) = self.surging(hub, key, name, left) {
            self.record(key, name, Some(waiting));
            return Ok(Action::requeue(SURGE_RECHECK));
        }
        let (action, done) = self
            .remove(key, name, member, self.when_member_leaves)
            .await?;
        if done {
            crate::lock(&self.leaving).remove(&(key.clone(), name.clone()));
        }
        Ok(action)
    }

    /// For a member out of `key`'s selection for `left`: while it is one
    /// of the first [`Rollout::max_surge`](crate::Rollout::max_surge)
    /// members to leave and a selected member is not yet available, it
    /// keeps the objects, and its outcome says so.
    fn surging(
        &self,
        hub: &K,
        key: &HubKey,
        name: &ClusterName,
        left: Duration,
    ) -> Option<Outcome> {
        let rollout = self.rollouts.of(hub);
        let surge = rollout.surge();
        if surge == 0 || left > self.removal_grace + rollout.progress_deadline_of() {
            return None;
        }
        let controller = self.controller.get()?;
        let leaving: Vec<(Instant, ClusterName)> = crate::lock(&self.leaving)
            .iter()
            .filter(|((hub, _), _)| hub == key)
            .map(|((_, member), since)| (*since, member.clone()))
            .collect();
        // Those still holding something: one that let go, or never had
        // anything, takes no place in the surge.
        let mut leaving: Vec<(Instant, ClusterName)> = leaving
            .into_iter()
            .filter(|(_, member)| {
                member == name
                    || controller
                        .cluster(member)
                        .is_some_and(|cluster| !self.holds_nothing(key, &cluster))
            })
            .collect();
        leaving.sort();
        if !leaving.iter().take(surge).any(|(_, member)| member == name) {
            return None;
        }
        // The selected members: those with an outcome that are not
        // leaving, and those a decision names (one that joined may not
        // have been reconciled yet).
        let outcomes = crate::lock(&self.outcomes);
        let known = outcomes.members(key);
        let mut selected: Vec<ClusterName> = known
            .into_iter()
            .flatten()
            .map(|(member, _)| member.clone())
            .filter(|member| !leaving.iter().any(|(_, leaving)| leaving == member))
            .collect();
        if let super::Members::Chosen(choose) = &self.members {
            // Only those this replica works on: it knows nothing of the
            // others (replicas sharing the fleet), nor of members not in
            // the fleet.
            selected.extend(
                choose(hub)
                    .into_iter()
                    .filter(|member| controller.cluster(member).is_some()),
            );
        }
        selected.sort();
        selected.dedup();
        let joining_unavailable: Vec<ClusterName> = selected
            .into_iter()
            .filter(|member| {
                known
                    .and_then(|known| known.get(member))
                    .is_none_or(|outcome| outcome.state != MemberState::InSync)
            })
            .take(3)
            .collect();
        drop(outcomes);
        if joining_unavailable.is_empty() {
            return None;
        }
        let names: Vec<&str> = joining_unavailable
            .iter()
            .map(ClusterName::as_str)
            .collect();
        Some(Outcome::failed(
            MemberState::Progressing,
            Some(format!(
                "out of the selection; keeps its objects until the selected members are available (max surge {surge}): {} not yet",
                names.join(", ")
            )),
        ))
    }

    /// Lets go of every object made for `key` in `member` by `policy`;
    /// whether it is done.
    async fn remove(
        &self,
        key: &HubKey,
        name: &ClusterName,
        member: &Cluster,
        policy: DeletionPolicy,
    ) -> Result<(Action, bool), ReconcileError> {
        match self.let_go(key, member, &[], policy).await? {
            LettingGo::Done => {
                self.record(key, name, None);
                Ok((Action::await_change(), true))
            }
            LettingGo::Unlisted(_) | LettingGo::Waiting(_) => {
                Ok((Action::requeue(NOT_LISTED_YET), false))
            }
        }
    }

    /// Whether `member`'s watches have listed and hold no object made for
    /// `key`.
    pub(super) fn holds_nothing(&self, key: &HubKey, member: &Cluster) -> bool {
        let ours = |meta: &ObjectMeta| self.hub_of(meta).as_ref() == Some(key);
        self.kinds.iter().all(|kind| {
            kind.find(member, &ours)
                .is_some_and(|found| found.is_empty())
        })
    }

    /// Applies every object `hub` wants in `member`, and deletes those it
    /// made before and no longer wants.
    async fn apply(&self, hub: &K, key: &HubKey, member: &Cluster, revision: &str) -> Outcome {
        let generation = hub.meta().generation;
        let failed = |state: MemberState, reason: String| {
            Outcome::failed(state, Some(Redacted::new(reason).as_str().to_string()))
        };
        let desired = match (self.desired)(hub, member) {
            Ok(desired) => desired,
            Err(err) => {
                return failed(
                    MemberState::Failed,
                    format!(
                        "desired objects: {}",
                        Redacted::error(err.as_ref()).as_str()
                    ),
                );
            }
        };
        let owner = Request::new(ClusterName::local(), key.0.as_deref(), key.1.as_str());
        // Every desired object is kept, applied yet or not: a wave that
        // waits must not have the objects of later waves removed.
        let mut keep = Vec::new();
        for object in &desired {
            let Some(name) = object.name().map(str::to_string) else {
                return failed(
                    MemberState::Failed,
                    format!("a desired {} has no name", object.resource.kind),
                );
            };
            if let Some(refused) = crate::owners::refused(object, hub.meta(), member).await {
                return failed(
                    MemberState::Failed,
                    format!("{}: {refused}", describe(object)),
                );
            }
            let namespace = object.namespace().map(str::to_string);
            let Some(kind) = self.kinds.iter().find(|kind| kind.is(&object.resource)) else {
                return failed(
                    MemberState::Failed,
                    format!(
                        "{}: its type is not registered with `propagates`",
                        describe(object)
                    ),
                );
            };
            keep.push((kind.resource.clone(), namespace, name));
        }
        let mut applied = Applied::default();
        let waves = crate::waves::in_waves(desired);
        let count = waves.len();
        for (at, wave) in waves.into_iter().enumerate() {
            for object in wave {
                self.apply_one(key, member, &owner, revision, object, &mut applied)
                    .await;
            }
            if applied.worst.is_some() {
                break;
            }
            if let Some((_, reason)) = applied.waiting.as_mut() {
                // The next wave waits for this one to be available.
                if at + 1 < count {
                    reason.push_str("; later objects wait for it");
                }
                break;
            }
        }
        let Applied {
            reported,
            mut worst,
            waiting,
        } = applied;
        if worst.is_none() && waiting.is_none() && self.mode != ApplyMode::ReportOnly {
            // What is no longer desired goes as if deleted on purpose,
            // unless its annotation says to orphan it.
            match self
                .let_go(key, member, &keep, DeletionPolicy::Delete)
                .await
            {
                Ok(LettingGo::Done) => {}
                // What it made before may still be there: not in sync yet.
                Ok(LettingGo::Unlisted(kinds)) => {
                    return Outcome::failed(
                        MemberState::Pending,
                        Some(format!(
                            "applied; waiting for the member's watch of {kinds} to list before removing what is no longer desired"
                        )),
                    );
                }
                Ok(LettingGo::Waiting(going)) => {
                    return Outcome::failed(
                        MemberState::Progressing,
                        Some(format!(
                            "applied; removing what is no longer desired, the latest wave first: waiting for {going} to go"
                        )),
                    );
                }
                Err(err) => {
                    worst = worse(
                        worst,
                        MemberState::Failed,
                        "removing what is no longer desired".into(),
                        err.as_ref(),
                    );
                }
            }
        }
        match (worst, waiting) {
            (Some((state, reason)), _) => Outcome::failed(state, Some(reason)),
            (None, Some((state, reason))) => Outcome {
                state,
                reason: Some(Redacted::new(reason).as_str().to_string()),
                applied_generation: None,
                revision: None,
                reported,
            },
            (None, None) => Outcome {
                state: MemberState::InSync,
                reason: None,
                applied_generation: generation,
                revision: Some(revision.to_string()),
                reported,
            },
        }
    }

    /// Applies `object` in `member` for the hub object `key`, and notes in
    /// `applied` what came of it: what was reported, the worst failure,
    /// and whether it is not available yet.
    async fn apply_one(
        &self,
        key: &HubKey,
        member: &Cluster,
        owner: &Request,
        revision: &str,
        object: Desired,
        applied: &mut Applied,
    ) {
        let described = describe(&object);
        // Checked by the caller.
        let (Some(name), Some(kind)) = (
            object.name().map(str::to_string),
            self.kinds.iter().find(|kind| kind.is(&object.resource)),
        ) else {
            return;
        };
        let namespace = object.namespace().map(str::to_string);
        let api = api_for(member, &object.resource, namespace.as_deref());
        let ours = match self
            .lookup(kind, member, &api, namespace.as_deref(), &name)
            .await
        {
            Ok(existing) => existing.map(|meta| self.hub_of(&meta).as_ref() == Some(key)),
            Err(err) => {
                applied.worst = worse(applied.worst.take(), MemberState::Failed, described, &err);
                return;
            }
        };
        let resource = object.resource.clone();
        let content = crate::apply_modes::without_fields(object.object, &self.ignored_fields);
        match self.mode {
            ApplyMode::ReportOnly => {
                return self
                    .report_only(&api, &name, &resource, &content, described, applied)
                    .await;
            }
            ApplyMode::CreateOnly if ours.is_some() => {
                // Left as it is; what it is doing is what counts.
                match api.get_opt(&name).await {
                    Ok(Some(live)) => self.note_health(&resource, described, &live, applied),
                    // Gone meanwhile: made on the next look.
                    Ok(None) => {}
                    Err(err) => {
                        applied.worst =
                            worse(applied.worst.take(), MemberState::Failed, described, &err);
                    }
                }
                return;
            }
            _ => {}
        }
        if ours == Some(false) && self.conflicts == Conflicts::TakeOverWhenEqual {
            // Taken over (all its fields ours alone) only if that changes
            // nothing.
            match crate::apply_modes::would_change(&api, &self.name, &name, &content).await {
                Ok(Some(paths)) if paths.is_empty() => {}
                Ok(Some(paths)) => {
                    applied.worst = said(
                        applied.worst.take(),
                        MemberState::Conflict,
                        format!(
                            "{described}: held by another field manager, and taking it over would change {}",
                            paths.join(", ")
                        ),
                    );
                    return;
                }
                // Gone meanwhile: made on the next look.
                Ok(None) => return,
                Err(err) => {
                    applied.worst =
                        worse(applied.worst.take(), MemberState::Failed, described, &err);
                    return;
                }
            }
        }
        let force = match ours {
            None => false,
            Some(true) => self.drift == Drift::Repair,
            Some(false) => matches!(
                self.conflicts,
                Conflicts::TakeOver | Conflicts::TakeOverWhenEqual
            ),
        };
        let stamped = self.stamp(content, owner, revision);
        if self.mode == ApplyMode::CreateOnly {
            // Created, never applied: a create refused because the object
            // exists (the member's cache had not seen it yet) writes
            // nothing.
            return self
                .create_only(&api, &name, &resource, stamped, described, applied)
                .await;
        }
        let mut params = PatchParams::apply(&self.name);
        if force {
            params = params.force();
        }
        match api.patch(&name, &params, &Patch::Apply(&stamped)).await {
            Ok(answer) => self.note_health(&resource, described, &answer, applied),
            Err(err) if matches!(&err, kube::Error::Api(status) if status.code == 409) => {
                // Our own object changed under another manager is drift;
                // someone else's object is a conflict.
                let state = if ours == Some(true) {
                    MemberState::Drifted
                } else {
                    MemberState::Conflict
                };
                applied.worst = worse(applied.worst.take(), state, described, &err);
            }
            Err(err) => {
                applied.worst = worse(applied.worst.take(), MemberState::Failed, described, &err);
            }
        }
    }

    /// Create-only, for an object the member's cache does not show:
    /// created, or if it exists after all, left as it is.
    async fn create_only(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        resource: &ApiResource,
        stamped: serde_json::Value,
        described: String,
        applied: &mut Applied,
    ) {
        let params = kube::api::PostParams {
            field_manager: Some(self.name.clone()),
            ..kube::api::PostParams::default()
        };
        let created = match serde_json::from_value::<DynamicObject>(stamped) {
            Ok(object) => api.create(&params, &object).await,
            Err(err) => {
                applied.worst = worse(applied.worst.take(), MemberState::Failed, described, &err);
                return;
            }
        };
        let live = match created {
            Err(kube::Error::Api(status)) if status.code == 409 => api.get_opt(name).await,
            other => other.map(Some),
        };
        match live {
            Ok(Some(live)) => self.note_health(resource, described, &live, applied),
            Ok(None) => {}
            Err(err) => {
                applied.worst = worse(applied.worst.take(), MemberState::Failed, described, &err);
            }
        }
    }

    /// Report-only: what applying `content` would change in the member,
    /// by a server-side dry run; nothing is written.
    async fn report_only(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        resource: &ApiResource,
        content: &serde_json::Value,
        described: String,
        applied: &mut Applied,
    ) {
        match crate::apply_modes::would_change(api, &self.name, name, content).await {
            Ok(None) => {
                applied.worst = said(
                    applied.worst.take(),
                    MemberState::Drifted,
                    format!("{described}: missing (report only: not created)"),
                );
            }
            Ok(Some(paths)) if paths.is_empty() => match api.get_opt(name).await {
                Ok(Some(live)) => self.note_health(resource, described, &live, applied),
                Ok(None) => {}
                Err(err) => {
                    applied.worst =
                        worse(applied.worst.take(), MemberState::Failed, described, &err);
                }
            },
            Ok(Some(paths)) => {
                applied.worst = said(
                    applied.worst.take(),
                    MemberState::Drifted,
                    format!(
                        "{described}: applying would change {} (report only: not applied)",
                        paths.join(", ")
                    ),
                );
            }
            Err(err) => {
                applied.worst = worse(applied.worst.take(), MemberState::Failed, described, &err);
            }
        }
    }

    /// Notes in `applied` what `object` (of `resource`, as the member has
    /// it) reports and how it is doing.
    fn note_health(
        &self,
        resource: &ApiResource,
        described: String,
        object: &DynamicObject,
        applied: &mut Applied,
    ) {
        if let Some(value) = self.report.as_ref().and_then(|report| report(object)) {
            applied.reported.insert(described.clone(), value);
        }
        let health = match self
            .health
            .iter()
            .find(|(known, _)| known.group == resource.group && known.kind == resource.kind)
        {
            Some((_, rule)) => rule(object),
            None => crate::health::built_in(resource, object),
        };
        let waiting = match health {
            Health::Available => None,
            Health::Progressing(why) => {
                Some((MemberState::Progressing, format!("{described}: {why}")))
            }
            Health::Degraded(why) => Some((MemberState::Degraded, format!("{described}: {why}"))),
        };
        if let Some((state, reason)) = waiting
            && applied
                .waiting
                .as_ref()
                .is_none_or(|(worst, _)| state > *worst)
        {
            applied.waiting = Some((state, reason));
        }
    }

    /// The metadata of an object as the member's watch has it, or as the
    /// server says while that watch has not listed yet.
    async fn lookup(
        &self,
        kind: &super::kinds::Kind,
        member: &Cluster,
        api: &Api<DynamicObject>,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<ObjectMeta>, kube::Error> {
        let this = |meta: &ObjectMeta| {
            meta.name.as_deref() == Some(name) && meta.namespace.as_deref() == namespace
        };
        match kind.find(member, &this) {
            Some(found) => Ok(found.into_iter().next()),
            None => Ok(api
                .get_metadata_opt(name)
                .await?
                .map(|object| object.metadata)),
        }
    }

    /// `object` labelled as this propagation's, pointing at `owner` and
    /// saying the revision it is applied at.
    fn stamp(
        &self,
        mut value: serde_json::Value,
        owner: &Request,
        revision: &str,
    ) -> serde_json::Value {
        let metadata = &mut value["metadata"];
        metadata["labels"][PROPAGATION_LABEL] = self.name.clone().into();
        for (annotation, text) in owner.owner_annotations() {
            metadata["annotations"][annotation] = text.into();
        }
        metadata["annotations"][crate::REVISION_ANNOTATION] = revision.into();
        value
    }

    /// Tells a member's new failure, conflict or drift in a Warning Event
    /// on the hub object (one series per member and reason).
    async fn tell(
        &self,
        hub: &K,
        hub_cluster: &Cluster,
        key: &HubKey,
        name: &ClusterName,
        outcome: &Outcome,
    ) {
        let reason = match outcome.state {
            MemberState::Failed => "PropagationFailed",
            MemberState::Conflict => "PropagationConflict",
            MemberState::Drifted => "PropagationDrifted",
            MemberState::Degraded => "PropagationDegraded",
            _ => return,
        };
        let before = crate::lock(&self.outcomes).get(key, name).cloned();
        if !self.events || before.as_ref() == Some(outcome) {
            return;
        }
        let note = format!(
            "member {name}: {}",
            outcome.reason.as_deref().unwrap_or(outcome.state.as_str())
        );
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note.chars().take(1024).collect()),
            action: "Propagate".into(),
            // The series key: one per member.
            secondary: Some(ObjectReference {
                kind: Some("Cluster".into()),
                name: Some(name.as_str().to_string()),
                ..ObjectReference::default()
            }),
        };
        self.publish(hub, hub_cluster, event).await;
    }

    /// Tells what the rollout of `hub` does (a roll back) in a Normal Event
    /// on it.
    pub(super) async fn announce(
        &self,
        hub: &K,
        hub_cluster: &Cluster,
        reason: &str,
        note: String,
    ) {
        if !self.events {
            return;
        }
        let event = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.chars().take(1024).collect()),
            action: "Rollout".into(),
            secondary: None,
        };
        self.publish(hub, hub_cluster, event).await;
    }

    /// Publishes `event` on `hub`; a hub that refuses Events is warned of
    /// once.
    async fn publish(&self, hub: &K, hub_cluster: &Cluster, event: Event) {
        let reference = hub.object_ref(&());
        if let Err(err) = hub_cluster
            .recorder(self.name.clone())
            .publish(&event, &reference)
            .await
        {
            if !self.events_refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    propagation = %self.name,
                    error = %Redacted::kube(&err),
                    "cannot publish Events on hub objects; later refusals are logged at debug level"
                );
            } else {
                tracing::debug!(propagation = %self.name, error = %Redacted::kube(&err), "Event refused");
            }
        }
    }
}

/// The worse of `worst` and `state` for `described`: the first reason of
/// the worst state is kept.
fn worse(
    worst: Option<(MemberState, String)>,
    state: MemberState,
    described: String,
    err: &(dyn std::error::Error + 'static),
) -> Option<(MemberState, String)> {
    let reason = Redacted::error(err)
        .with_context(&described)
        .as_str()
        .to_string();
    match worst {
        Some((current, _)) if current >= state => worst,
        _ => Some((state, reason)),
    }
}

/// The worse of `worst` and `state` with `reason` (the component's own
/// words, redacted): the first reason of the worst state is kept.
fn said(
    worst: Option<(MemberState, String)>,
    state: MemberState,
    reason: String,
) -> Option<(MemberState, String)> {
    match worst {
        Some((current, _)) if current >= state => worst,
        _ => Some((state, Redacted::new(reason).as_str().to_string())),
    }
}

/// What applying a member's objects came to so far.
#[derive(Default)]
struct Applied {
    /// What `Propagation::report` took, by object.
    reported: BTreeMap<String, serde_json::Value>,
    /// The worst failure (failed, drift, conflict) and its reason.
    worst: Option<(MemberState, String)>,
    /// The worst object applied but not available (progressing or
    /// degraded), and why.
    waiting: Option<(MemberState, String)>,
}

/// `<Kind> <namespace>/<name>` or `<Kind> <name>`.
fn describe(object: &Desired) -> String {
    let name = object.name().unwrap_or_default();
    match object.namespace() {
        Some(namespace) => format!("{} {namespace}/{name}", object.resource.kind),
        None => format!("{} {name}", object.resource.kind),
    }
}
