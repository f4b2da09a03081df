//! A paced rollout as the reconciles take part in it: a member's reconcile
//! waits for a slot before it applies a new revision, and the hub
//! object's reconcile takes the rollout a step further (frees the slots
//! of members that are done, gives free ones to the next) and writes it
//! on the hub object, with its `resourceVersion` as a precondition.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{ApiResource, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::gates::{GATE_RECHECK, GateAt, GateCheck};
use super::per_hub::PerHub;
use super::record::RolloutStatus as Record;
use super::rollout;
use super::status::{MemberState, Outcome};
use super::step::{self, Elsewhere, Look, Member};
use super::{HubKey, REVISION_ANNOTATION, Rollout, Shared};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{ReconcileError, Request};

/// How soon a member waiting for a slot looks again, besides being asked
/// when one is given to it here (a slot given by another replica is seen
/// this way).
pub(super) const SLOT_RECHECK: Duration = Duration::from_secs(5);

/// How soon a step whose write lost a race (another writer changed the
/// hub object since the cache saw it) is tried again.
const RACE_RETRY: Duration = Duration::from_millis(200);

/// Whether a hub object's rollout is paused.
pub(super) type Pause<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;
/// Whether a stage (by name) is approved for a revision of a hub object.
pub(super) type Approve<K> = Arc<dyn Fn(&K, &str, &str) -> bool + Send + Sync>;
/// What a checked gate of a stage (by name) says for a revision of a hub
/// object.
pub(super) type CheckGate<K> = Arc<dyn Fn(&K, &str, &str) -> GateCheck + Send + Sync>;

/// What the user's closures say of a hub object's rollout.
pub(super) struct RolloutHooks<K> {
    pub(super) pause: Option<Pause<K>>,
    pub(super) approve: Option<Approve<K>>,
    pub(super) check_gates: Option<CheckGate<K>>,
}

/// A propagation's rollout settings and what this process knows of its
/// hub objects' rollouts.
pub(super) struct Rollouts<K> {
    /// The propagation's rollout, or each hub object's own
    /// (`Propagation::rollout_for`).
    rollout: PerHub<K, Rollout>,
    hooks: RolloutHooks<K>,
    /// Each hub object's rollout as this process last wrote or read it:
    /// a member given a slot here goes on before the hub cache shows it.
    pub(super) slots: Mutex<HashMap<HubKey, Record>>,
    /// Each hub object's revisions, for roll backs.
    pub(super) history: crate::history::History,
    /// Since when a member has been available with a revision (for the
    /// soak time).
    available_since: Mutex<HashMap<(HubKey, ClusterName), (String, Instant)>>,
    /// Since when a member has been on its way to a revision (for the
    /// time-to-available histogram).
    changing_since: Mutex<HashMap<(HubKey, ClusterName), (String, Instant)>>,
}

impl<K> Rollouts<K> {
    pub(super) fn new(rollout: PerHub<K, Rollout>, hooks: RolloutHooks<K>, history: usize) -> Self {
        Self {
            rollout,
            history: crate::history::History::new(history),
            hooks,
            slots: Mutex::default(),
            available_since: Mutex::default(),
            changing_since: Mutex::default(),
        }
    }

    /// How a new revision of `hub` reaches its members: its own rollout
    /// (`Propagation::rollout_for`), else the propagation's.
    pub(super) fn of(&self, hub: &K) -> std::borrow::Cow<'_, Rollout> {
        self.rollout.of(hub)
    }

    /// Whether a new revision of `hub` reaches members a few at a time.
    pub(super) fn is_paced(&self, hub: &K) -> bool {
        self.of(hub).is_paced()
    }

    /// Forgets what is known of `key`'s rollout (the hub object is gone).
    pub(super) fn forget(&self, key: &HubKey) {
        crate::lock(&self.slots).remove(key);
        self.history.forget(key);
        crate::lock(&self.available_since).retain(|(hub, _), _| hub != key);
        crate::lock(&self.changing_since).retain(|(hub, _), _| hub != key);
    }

    /// Notes when `member` of `key` starts on `revision` (`starting`:
    /// it was not at it before this reconcile), and once `outcome` says
    /// it is available with it, how long that took.
    pub(super) fn became_available(
        &self,
        key: &HubKey,
        member: &ClusterName,
        revision: &str,
        starting: bool,
        outcome: &Outcome,
    ) -> Option<Duration> {
        let entry = (key.clone(), member.clone());
        let mut changing = crate::lock(&self.changing_since);
        if starting
            && changing
                .get(&entry)
                .is_none_or(|(known, _)| known != revision)
        {
            changing.insert(entry.clone(), (revision.to_string(), Instant::now()));
        }
        let available =
            outcome.state == MemberState::InSync && outcome.revision.as_deref() == Some(revision);
        if !available
            || changing
                .get(&entry)
                .is_none_or(|(known, _)| known != revision)
        {
            return None;
        }
        changing.remove(&entry).map(|(_, since)| since.elapsed())
    }

    /// For a member `available` with `revision`: how long it still has to
    /// stay so before its slot is freed (`None`: soaked, or not available).
    fn soaking(
        &self,
        rollout: &Rollout,
        key: &HubKey,
        name: &ClusterName,
        revision: &str,
        available: bool,
    ) -> Option<Duration> {
        let mut since = crate::lock(&self.available_since);
        let entry = (key.clone(), name.clone());
        if !available {
            since.remove(&entry);
            return None;
        }
        let at = match since.get(&entry) {
            Some((known, at)) if known == revision => *at,
            _ => {
                let now = Instant::now();
                since.insert(entry, (revision.to_string(), now));
                now
            }
        };
        let soak = rollout.soak_time();
        let held = at.elapsed();
        (held < soak).then(|| soak - held)
    }
}

impl<K> Shared<K>
where
    K: CachedResource + Serialize + DeserializeOwned,
{
    /// `None` when `name` may apply `revision` now: the rollout is not
    /// paced, the member has the revision already (`at_revision`), or it
    /// holds a slot. Otherwise what it waits for, as its outcome. `hub` is
    /// the hub object as JSON.
    pub(super) fn wait_for_slot(
        &self,
        hub: (&K, &Value),
        key: &HubKey,
        name: &ClusterName,
        revision: &str,
        at_revision: bool,
    ) -> Option<Outcome> {
        let (hub, value) = hub;
        if !self.rollouts.is_paced(hub) || at_revision {
            return None;
        }
        let known = crate::lock(&self.rollouts.slots).get(key).cloned();
        let holds = |record: &Option<Record>| {
            record
                .as_ref()
                .is_some_and(|record| record.holds_slot(name))
        };
        if holds(&known) {
            return None;
        }
        // The slot may have been given by another controller since this
        // one last stepped: the hub object says.
        let written = self.read_record(value);
        if holds(&written) {
            return None;
        }
        let mut reason = format!("waiting for a slot in the rollout of revision {revision}");
        if let Some(record) = known.or(written) {
            if let Some(halted) = &record.halted {
                reason.push_str(&format!("; halted: {halted}"));
            } else if let Some(waiting) = &record.waiting {
                reason.push_str(&format!("; {waiting}"));
            }
        }
        Some(Outcome::failed(MemberState::Pending, Some(reason)))
    }

    /// Whether `member` holds objects made for `key` and every one was
    /// applied at `revision` (as far as its watches have listed).
    pub(super) fn at_revision(&self, key: &HubKey, member: &Cluster, revision: &str) -> bool {
        let mut any = false;
        for kind in &self.kinds {
            let Some(found) = kind.find(member, &crate::kinds::Query::MadeFor(key)) else {
                return false;
            };
            for meta in found {
                any = true;
                let stamped = meta
                    .annotations
                    .as_ref()
                    .and_then(|annotations| annotations.get(REVISION_ANNOTATION));
                if stamped.map(String::as_str) != Some(revision) {
                    return false;
                }
            }
        }
        any
    }

    /// The rollout's state as written on `hub` (JSON), if any.
    pub(super) fn read_record(&self, hub: &Value) -> Option<Record> {
        let written = match self.status.rollout_annotation() {
            Some(annotation) => serde_json::from_str(
                hub.pointer("/metadata/annotations")?
                    .get(&annotation)?
                    .as_str()?,
            ),
            None => serde_json::from_value(hub.pointer("/status/rollout")?.clone()),
        };
        written.ok()
    }

    /// The summary of `hub`'s rollout for its condition, if it is paced.
    pub(super) fn rollout_summary(&self, key: &HubKey, hub: &K) -> Option<String> {
        if !self.rollouts.is_paced(hub) {
            return None;
        }
        let known = crate::lock(&self.rollouts.slots).get(key).cloned();
        known
            .or_else(|| self.read_record(&serde_json::to_value(hub).ok()?))
            .map(|record| record.summary())
    }

    /// Takes `hub`'s rollout a step further and writes it if it changed.
    /// Returns how soon to look again, if a step may be due before any
    /// change tells (a member soaking, a lost race).
    pub(super) async fn step_rollout(
        &self,
        hub_cluster: &Cluster,
        key: &HubKey,
        hub: &K,
    ) -> Result<Option<Duration>, ReconcileError> {
        let Some(controller) = self.controller.get() else {
            return Ok(None);
        };
        let rollout = self.rollouts.of(hub);
        if !rollout.is_paced() {
            return Ok(None);
        }
        let value = serde_json::to_value(hub)?;
        let current = rollout::revision_of(&value);
        self.rollouts
            .history
            .keep(hub_cluster, &self.name, key, &value, &current)
            .await;
        let before = self.read_record(&value);
        let decided = self
            .rolling_back(
                hub_cluster,
                key,
                &value,
                &current,
                &rollout,
                before.as_ref(),
            )
            .await;
        // What the members go to: the hub object's revision, or while
        // rolling back the earlier one.
        let revision = decided
            .rolling_back
            .as_ref()
            .map_or_else(|| current.clone(), |back| back.to.clone());
        let mut soon = None;
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut members = Vec::new();
        let mut unselected = Vec::new();
        let mut stage_names: Vec<Option<String>> = Vec::new();
        for name in controller.engaged_clusters() {
            let Some(cluster) = controller.cluster(&name).filter(|_| !name.is_local()) else {
                continue;
            };
            if !self.members.includes(hub, &name, &cluster) {
                unselected.push(name);
                continue;
            }
            // Taken out for maintenance: it takes no part in the rollout,
            // holds up nobody and counts against nothing.
            if crate::maintenance::Maintenance::of(&cluster).is_out() {
                continue;
            }
            let (stage, stage_name) = rollout.stage_of(&name, &cluster.labels());
            if stage_names.len() <= stage {
                stage_names.resize(stage + 1, None);
            }
            stage_names[stage] = stage_name.map(str::to_string);
            let at_revision = self.at_revision(key, &cluster, &revision);
            let outcome = crate::lock(&self.outcomes).get(key, &name).cloned();
            let available = at_revision
                && outcome.as_ref().is_some_and(|outcome| {
                    outcome.state == MemberState::InSync
                        && outcome.revision.as_deref() == Some(revision.as_str())
                });
            let soaking = self
                .rollouts
                .soaking(&rollout, key, &name, &revision, available);
            if let Some(left) = soaking {
                soon = Some(soon.map_or(left, |soon: Duration| soon.min(left)));
            }
            // Rolling back, a failure with the revision left behind is
            // what the roll back mends, not a failure of the roll back.
            let failing = outcome
                .filter(|outcome| {
                    matches!(outcome.state, MemberState::Degraded | MemberState::Failed)
                        && (decided.rolling_back.is_none()
                            || outcome.revision.as_deref() == Some(revision.as_str()))
                })
                .map(|outcome| {
                    outcome
                        .reason
                        .unwrap_or_else(|| outcome.state.as_str().to_string())
                });
            let closed = (!at_revision)
                .then(|| crate::windows::closed(rollout.windows(), &cluster, now))
                .flatten();
            if let Some(opens) = closed.as_ref().and_then(|closed| closed.opens) {
                let left = Duration::try_from(opens.duration_since(now)).unwrap_or_default();
                soon = Some(soon.map_or(left, |soon: Duration| soon.min(left)));
            }
            members.push(Member {
                name,
                stage,
                at_revision,
                done: available && soaking.is_none(),
                failing,
                closed: closed.map(|closed| closed.reason),
            });
        }
        members.sort_by(|a, b| (a.stage, &a.name).cmp(&(b.stage, &b.name)));
        let approved = |stage: usize| {
            let Some(name) = stage_names.get(stage).cloned().flatten() else {
                return true;
            };
            rollout::approved_by_annotation(&value, &name, &revision)
                || self
                    .rollouts
                    .hooks
                    .approve
                    .as_ref()
                    .is_some_and(|approve| approve(hub, &name, &revision))
        };
        let paused = rollout::paused_by_annotation(&value)
            || self
                .rollouts
                .hooks
                .pause
                .as_ref()
                .is_some_and(|pause| pause(hub));
        // Replicas sharing the fleet each step for their own members, and
        // tell the others about them in the record.
        let replicas = controller.replicas();
        let elsewhere = replicas
            .as_ref()
            .map_or_else(Elsewhere::default, |replicas| {
                Elsewhere::from_record(before.as_ref(), &replicas.me, &replicas.live, &revision)
            });
        let look = Look {
            rollout: &rollout,
            revision: &revision,
            now,
            members: &members,
            stage_names: &stage_names,
            paused,
            approved: &approved,
            elsewhere: &elsewhere,
            unselected: &unselected,
            rolling_back: decided.rolling_back.is_some(),
            gate: None,
        };
        let gate = self
            .check_gate(hub_cluster, key, hub, &value, &look, before.as_ref())
            .await;
        if matches!(gate, Some(GateCheck::Waiting(_))) {
            soon = Some(soon.map_or(GATE_RECHECK, |soon| soon.min(GATE_RECHECK)));
        }
        let mut record = step::step(
            &Look {
                gate: gate.as_ref(),
                ..look
            },
            before.as_ref(),
        );
        record.last_complete = if record.is_complete() && decided.rolling_back.is_none() {
            Some(revision.clone())
        } else {
            before
                .as_ref()
                .and_then(|before| before.last_complete.clone())
        };
        if record.waiting.is_none() {
            record.waiting = decided.refused;
        }
        let started = decided.rolling_back.clone().filter(|back| {
            before
                .as_ref()
                .and_then(|before| before.rolling_back.as_ref())
                != Some(back)
        });
        record.rolling_back = decided.rolling_back;
        for (reason, note) in crate::events::notable(before.as_ref(), &record, started.as_ref()) {
            self.announce(hub, hub_cluster, reason, note).await;
        }
        if let Some(replicas) = &replicas {
            record.replicas = before
                .as_ref()
                .map(|before| before.replicas.clone())
                .unwrap_or_default();
            record
                .replicas
                .retain(|replica, _| replicas.live.contains(replica));
            record
                .replicas
                .insert(replicas.me.clone(), step::own_members(&record, &members));
        }
        if before.as_ref() != Some(&record) {
            match self.write_record(hub_cluster, key, &value, &record).await {
                Ok(()) => {}
                Err(WriteError::Race) => return Ok(Some(RACE_RETRY)),
                Err(WriteError::Failed(err)) => return Err(err),
            }
        }
        // Told at once: members given a slot, and every slot holder when
        // the revision they go to changed (a roll back starts, a new
        // revision comes): a failed member holding its slot is otherwise
        // waiting out its error backoff.
        let moved = before
            .as_ref()
            .is_none_or(|before| before.revision != record.revision);
        let given: Vec<String> = record
            .updating
            .iter()
            .filter(|slot| {
                moved
                    || !before.as_ref().is_some_and(|before| {
                        before.holds_slot(&ClusterName::from(slot.cluster.as_str()))
                    })
            })
            .map(|slot| slot.cluster.clone())
            .collect();
        {
            let mut slots = crate::lock(&self.rollouts.slots);
            slots.insert(key.clone(), record);
            if let Some(metrics) = self.metrics() {
                metrics.rollouts_now(&slots);
            }
        }
        for member in given {
            controller.enqueue(Request::new(member, key.0.as_deref(), key.1.as_str()));
        }
        Ok(soon)
    }

    /// What the gate of the stage a step of `look` finds under way says
    /// now, if it has one still to decide for the revision (rolling back
    /// or paused, none is looked at).
    async fn check_gate(
        &self,
        hub_cluster: &Cluster,
        key: &HubKey,
        hub: &K,
        value: &Value,
        look: &Look<'_>,
        before: Option<&Record>,
    ) -> Option<GateCheck> {
        if look.rolling_back || look.paused {
            return None;
        }
        let stage = step::stage_under_way(look, before)?;
        let gate = look.rollout.gate_of(stage)?;
        let name = look.stage_names.get(stage).cloned().flatten()?;
        let decided = before
            .filter(|before| before.revision == look.revision)
            .and_then(|before| before.gates.iter().find(|gate| gate.stage == name))
            .is_some_and(|gate| gate.state != crate::record::GateState::Waiting);
        if decided {
            return None;
        }
        let at = GateAt {
            hub_cluster,
            propagation: &self.name,
            key,
            hub: value,
            stage: &name,
            revision: look.revision,
        };
        let checked = || {
            let check = self.rollouts.hooks.check_gates.as_ref()?;
            Some(check(hub, &name, look.revision))
        };
        Some(gate.check(&at, checked).await)
    }

    /// Writes `record` on the hub object (`hub`, as the cache has it), if
    /// the hub object is still as the cache saw it.
    async fn write_record(
        &self,
        hub_cluster: &Cluster,
        key: &HubKey,
        hub: &Value,
        record: &Record,
    ) -> Result<(), WriteError> {
        let resource = ApiResource::erase::<K>(&());
        let api = super::letting_go::api_for(hub_cluster, &resource, key.0.as_deref());
        let mut patch = json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {
                "name": key.1,
                "namespace": key.0,
                // The precondition: no other writer came in between.
                "resourceVersion": hub.pointer("/metadata/resourceVersion"),
            },
        });
        let params = PatchParams::apply(&format!("{}-rollout", self.name)).force();
        let answer = match self.status.rollout_annotation() {
            Some(annotation) => {
                let text =
                    serde_json::to_string(record).map_err(|err| WriteError::Failed(err.into()))?;
                patch["metadata"]["annotations"] = json!({ annotation: text });
                api.patch(&key.1, &params, &Patch::Apply(&patch)).await
            }
            None => {
                patch["status"] = json!({ "rollout": record });
                api.patch_status(&key.1, &params, &Patch::Apply(&patch))
                    .await
            }
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(kube::Error::Api(status)) if status.code == 409 => return Err(WriteError::Race),
            Err(err) => return Err(WriteError::Failed(err.into())),
        };
        // A status schema without `rollout` drops it without a word; a
        // rollout that cannot keep its state would hand out slots again.
        let kept = serde_json::to_value(&answer)
            .ok()
            .and_then(|answer| self.read_record(&answer));
        let holders = |record: &Record| {
            record
                .updating
                .iter()
                .map(|slot| slot.cluster.clone())
                .collect::<Vec<_>>()
        };
        if kept
            .as_ref()
            .is_none_or(|kept| kept.revision != record.revision || holders(kept) != holders(record))
        {
            return Err(WriteError::Failed(
                format!(
                    "the rollout's state was not kept on {} {}: the hub type's status schema must keep `status.rollout` (x-kubernetes-preserve-unknown-fields, or the schema of `RolloutStatus`)",
                    resource.kind, key.1
                )
                .into(),
            ));
        }
        Ok(())
    }
}

/// Why a rollout's state was not written.
enum WriteError {
    /// The hub object changed since the cache saw it.
    Race,
    Failed(ReconcileError),
}
