//! Events on hub objects: a member's new failure, conflict or drift
//! (Warning), and what a rollout does (Normal): which of its steps
//! are told, and once.

use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::record::{RollingBack, RolloutStatus as Record};
use super::status::{MemberState, Outcome};
use super::{HubKey, Shared};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::redact::Redacted;

impl<K> Shared<K>
where
    K: CachedResource + Serialize + DeserializeOwned,
{
    /// Tells a member's new failure, conflict or drift in a Warning Event
    /// on the hub object (one series per member and reason).
    pub(super) async fn tell(
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

/// What a step changed that its hub object's owner is told of, in Events:
/// a roll back started, a halt, a wait (paused, an approval), the
/// rollout of a revision complete. Each once, when it begins.
pub(crate) fn notable(
    before: Option<&Record>,
    after: &Record,
    started: Option<&RollingBack>,
) -> Vec<(&'static str, String)> {
    let mut told = Vec::new();
    if let Some(back) = started {
        told.push((
            "RollingBack",
            format!(
                "rolling back from revision {} to {}: {}",
                back.from, back.to, back.reason
            ),
        ));
    }
    let same_revision = before.is_some_and(|before| before.revision == after.revision);
    if let Some(halted) = &after.halted
        && !(same_revision && before.is_some_and(|before| before.halted.is_some()))
    {
        told.push((
            "RolloutHalted",
            format!("rollout of revision {} halted: {halted}", after.revision),
        ));
    }
    if let Some(waiting) = &after.waiting
        && !(same_revision && before.is_some_and(|before| before.waiting.as_ref() == Some(waiting)))
    {
        told.push((
            "RolloutWaiting",
            format!("rollout of revision {}: {waiting}", after.revision),
        ));
    }
    if after.is_complete() && !(same_revision && before.is_some_and(Record::is_complete)) {
        let what = match &after.rolling_back {
            Some(back) => format!("rolled back from revision {} to {}", back.from, back.to),
            None => format!("revision {} rolled out", after.revision),
        };
        told.push((
            "RolloutComplete",
            format!("{what}: {} members updated", after.updated),
        ));
    }
    told
}
