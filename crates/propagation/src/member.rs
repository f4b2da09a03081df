//! A member request: apply what the hub object wants there, or remove
//! what was made for it.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::letting_go::{DeletionPolicy, LettingGo};
use super::maintenance::{MAINTENANCE_LABEL, Maintenance};
use super::status::{MemberState, Outcome};
use super::{HubKey, Shared};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{Action, ReconcileError, Request};

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
        let now = k8s_openapi::jiff::Timestamp::now();
        if !at_revision
            && (waiting.is_some() || !self.rollouts.is_paced(&hub))
            && let Some(closed) =
                crate::windows::closed(self.rollouts.of(&hub).windows(), &member, now)
        {
            let reason = format!("{}; gets revision {revision} then", closed.reason);
            self.record(
                &key,
                &request.cluster,
                Some(Outcome::failed(MemberState::Pending, Some(reason))),
            );
            return Ok(match closed.opens {
                Some(opens) => Action::requeue(
                    Duration::try_from(opens.duration_since(now)).unwrap_or_default(),
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
        self.kinds.iter().all(|kind| {
            kind.find(member, &crate::kinds::Query::MadeFor(key))
                .is_some_and(|found| found.is_empty())
        })
    }
}
