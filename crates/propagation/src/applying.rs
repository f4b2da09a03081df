//! Applying what the hub object wants in one member: each desired object
//! by the apply mode, its health noted, the worst outcome kept.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::apply_modes::ApplyMode;
use super::letting_go::{DeletionPolicy, LettingGo, api_for};
use super::status::{MemberState, Outcome};
use super::{Conflicts, Desired, Drift, Health, HubKey, PROPAGATION_LABEL, Shared};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::Request;
use multicluster_runtime::redact::Redacted;

impl<K> Shared<K>
where
    K: CachedResource + Serialize + DeserializeOwned,
{
    /// Applies every object `hub` wants in `member`, and deletes those it
    /// made before and no longer wants.
    pub(super) async fn apply(
        &self,
        hub: &K,
        key: &HubKey,
        member: &Cluster,
        revision: &str,
    ) -> Outcome {
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
        match kind.find(member, &crate::kinds::Query::Named(namespace, name)) {
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
