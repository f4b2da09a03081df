//! Paced rollouts: how a new revision of a hub object reaches its members.
//! All at once (the default), or a few members at a time
//! ([`Rollout::rolling`]), stage after stage ([`Rollout::staged`]): a
//! member gets the new revision only once it is given a slot, and keeps
//! the slot until what it got is available and has stayed so for the
//! soak time.
//!
//! The state is on the hub object (`status.rollout`, or the annotation
//! `<status annotation>-rollout`): the revision rolled out and the members
//! holding a slot, each since when. A slot is given by writing it there
//! with the hub object's `resourceVersion` as a precondition, so however
//! many controllers take part (one restarted, a new leader, shards), no
//! more slots are out than the rollout allows. Every applied object
//! carries the revision it was applied at ([`REVISION_ANNOTATION`]), so a
//! member that has the new revision is known as such after a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::core::{Selector, SelectorExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use multicluster_runtime::ClusterName;

/// Annotation on every object the propagation applies: the revision of the
/// hub object it was applied at (its `metadata.generation`, or a digest of
/// it for types without one).
pub const REVISION_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/revision";

/// Annotation on a hub object that pauses its rollout while it is `"true"`:
/// no member is given a slot; those holding one go on.
pub const PAUSE_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/paused";

/// Annotation on a hub object approving stages of its rollout: a
/// comma-separated list of `<stage>@<revision>` (the revision the hub
/// object's status names), so an approval never carries over to the next
/// revision.
pub const APPROVAL_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/approved";

/// Annotation on a hub object: the revision (from its history, see
/// `RolloutStatus::last_complete` and the members' `revision`) its
/// members are rolled back to, paced as a rollout is, for as long as the
/// annotation stays. Removed, the hub object's own revision rolls out
/// again.
pub const ROLL_BACK_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/roll-back-to";

/// How long a member may hold a slot without what it got becoming
/// available, by default (the Deployment controller's own default).
const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);

/// How many members may be changing at once: given the new revision and
/// not yet available with it (and soaked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MaxUnavailable {
    /// At most this many (at least one).
    Count(usize),
    /// This share of the selected members, rounded down, at least one.
    Percent(u8),
}

impl MaxUnavailable {
    /// From a Kubernetes `IntOrString`, as a Deployment's `maxUnavailable`
    /// is written: a count (`2`) or a percentage of the members (`"25%"`).
    /// Anything else (a negative count, a string without `%`, a percentage
    /// over 100) is refused, naming what was given.
    pub fn from_int_or_string(
        value: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
    ) -> Result<Self, String> {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        match value {
            IntOrString::Int(count) => usize::try_from(*count)
                .map(MaxUnavailable::Count)
                .map_err(|_| format!("maxUnavailable {count}: a count may not be negative")),
            IntOrString::String(text) => text
                .strip_suffix('%')
                .and_then(|percent| percent.trim().parse::<u8>().ok())
                .filter(|percent| *percent <= 100)
                .map(MaxUnavailable::Percent)
                .ok_or_else(|| {
                    format!(
                        "maxUnavailable {text:?}: expected a count or a percentage such as \"25%\""
                    )
                }),
        }
    }

    /// The slots for a rollout over `members` members.
    fn slots(self, members: usize) -> usize {
        let slots = match self {
            MaxUnavailable::Count(count) => count,
            MaxUnavailable::Percent(percent) => members * usize::from(percent.min(100)) / 100,
        };
        slots.max(1)
    }
}

/// A stage of a staged rollout: the members it holds, and whether it waits
/// for an approval before its first member is given a slot.
#[derive(Clone, Debug)]
pub struct Stage {
    name: String,
    members: StageMembers,
    approval: bool,
}

#[derive(Clone, Debug)]
enum StageMembers {
    Labelled(Selector),
    Named(BTreeSet<ClusterName>),
}

impl Stage {
    /// The members whose cluster labels `selector` matches.
    pub fn labelled(name: impl Into<String>, selector: Selector) -> Self {
        Self {
            name: name.into(),
            members: StageMembers::Labelled(selector),
            approval: false,
        }
    }

    /// The members named.
    pub fn named(
        name: impl Into<String>,
        members: impl IntoIterator<Item = impl Into<ClusterName>>,
    ) -> Self {
        Self {
            name: name.into(),
            members: StageMembers::Named(members.into_iter().map(Into::into).collect()),
            approval: false,
        }
    }

    /// The stage starts only once approved, for the revision rolled out:
    /// by [`APPROVAL_ANNOTATION`] on the hub object, or by the propagation's
    /// [`approve_with`](crate::Propagation::approve_with).
    #[must_use]
    pub fn needs_approval(mut self) -> Self {
        self.approval = true;
        self
    }

    fn holds(
        &self,
        name: &ClusterName,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        match &self.members {
            StageMembers::Labelled(selector) => selector.matches(labels),
            StageMembers::Named(names) => names.contains(name),
        }
    }
}

/// How a new revision of a hub object reaches its members
/// ([`Propagation::rollout`](crate::Propagation::rollout)).
///
/// Its state is kept on the hub object, so a restarted controller, a new
/// leader or two controllers at once never give out more slots than
/// allowed. Replicas sharing the fleet (a sharded coordinator) each give
/// slots to their own members, counting the others' from the record
/// ([`RolloutStatus::replicas`]).
#[derive(Clone, Debug)]
pub struct Rollout {
    pace: Pace,
    soak: Duration,
    progress_deadline: Duration,
    failure_budget: usize,
    surge: usize,
    on_failure: OnFailure,
}

/// What a paced rollout does once more members fail than its failure
/// budget allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFailure {
    /// Halt: no member is given a slot until enough of them recover or a
    /// new revision comes (the default).
    #[default]
    Halt,
    /// Roll back: the members that took the failed revision go back to
    /// the last revision that reached every member (kept in the hub
    /// object's revision history), paced by the same bound and health
    /// gate. The hub object keeps the failed revision's spec; a new
    /// revision rolls out as usual.
    RollBack,
}

#[derive(Clone, Debug)]
enum Pace {
    AllAtOnce,
    Paced {
        max_unavailable: MaxUnavailable,
        stages: Vec<Stage>,
    },
}

impl Default for Rollout {
    fn default() -> Self {
        Self::all_at_once()
    }
}

impl Rollout {
    /// Every selected member gets a new revision at once (the default).
    pub fn all_at_once() -> Self {
        Self {
            pace: Pace::AllAtOnce,
            soak: Duration::ZERO,
            progress_deadline: DEFAULT_PROGRESS_DEADLINE,
            failure_budget: 0,
            surge: 0,
            on_failure: OnFailure::Halt,
        }
    }

    /// At most `max_unavailable` members changing at once, in the order of
    /// their names.
    pub fn rolling(max_unavailable: MaxUnavailable) -> Self {
        Self::staged(Vec::new(), max_unavailable)
    }

    /// Stage after stage, each rolling with at most `max_unavailable`
    /// members changing at once; a stage starts once every member of the
    /// stages before has the revision, available (an approval may be
    /// needed too). A member is in the first stage that holds it; members
    /// in none form a last stage of their own.
    pub fn staged(
        stages: impl IntoIterator<Item = Stage>,
        max_unavailable: MaxUnavailable,
    ) -> Self {
        Self {
            pace: Pace::Paced {
                max_unavailable,
                stages: stages.into_iter().collect(),
            },
            ..Self::all_at_once()
        }
    }

    /// How long a member must stay available with the new revision before
    /// its slot goes to the next (default: none).
    #[must_use]
    pub fn soak(mut self, soak: Duration) -> Self {
        self.soak = soak;
        self
    }

    /// How long a member may hold a slot without becoming available before
    /// it counts as failed (default ten minutes). A member that left the
    /// fleet while holding a slot (or that this controller does not see)
    /// keeps it this long too, then gives it back without counting as
    /// failed: until then it may still be changing, and a controller that
    /// has just started does not see every member at once. One seen out of
    /// the selection gives its slot back at once.
    #[must_use]
    pub fn progress_deadline(mut self, deadline: Duration) -> Self {
        self.progress_deadline = deadline;
        self
    }

    /// How many members holding a slot may fail (degraded, failed, or past
    /// the progress deadline) before the rollout halts (default none: the
    /// first failure halts it). A halted rollout gives no slot until
    /// enough of them recover or a new revision comes.
    #[must_use]
    pub fn failure_budget(mut self, failures: usize) -> Self {
        self.failure_budget = failures;
        self
    }

    /// What the rollout does past its failure budget (default
    /// [`OnFailure::Halt`]).
    #[must_use]
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    pub(crate) fn rolls_back(&self) -> bool {
        self.on_failure == OnFailure::RollBack
    }

    /// When the selection moves a hub object (members leave it, others
    /// join), up to `members` of those leaving keep its objects beyond the
    /// removal grace, until every selected member is available with them
    /// (or for at most the progress deadline): the moved workload runs
    /// somewhere throughout, on at most that many members more than the
    /// selection. Default 0: members leaving let go once their removal
    /// grace has passed, whether those joining are available or not.
    /// Applies with any pace.
    #[must_use]
    pub fn max_surge(mut self, members: usize) -> Self {
        self.surge = members;
        self
    }

    pub(crate) fn surge(&self) -> usize {
        self.surge
    }

    pub(crate) fn progress_deadline_of(&self) -> Duration {
        self.progress_deadline
    }

    pub(crate) fn is_paced(&self) -> bool {
        matches!(self.pace, Pace::Paced { .. })
    }

    /// The stage of a member (an index into the stages, the members in
    /// none last) and its name, if stages were given.
    pub(crate) fn stage_of(
        &self,
        name: &ClusterName,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> (usize, Option<&str>) {
        let Pace::Paced { stages, .. } = &self.pace else {
            return (0, None);
        };
        match stages.iter().position(|stage| stage.holds(name, labels)) {
            Some(at) => (at, Some(stages[at].name.as_str())),
            None if stages.is_empty() => (0, None),
            None => (stages.len(), Some("unstaged")),
        }
    }

    /// Whether the stage at `at` waits for an approval.
    pub(crate) fn needs_approval(&self, at: usize) -> bool {
        match &self.pace {
            Pace::Paced { stages, .. } => stages.get(at).is_some_and(|stage| stage.approval),
            Pace::AllAtOnce => false,
        }
    }

    pub(crate) fn soak_time(&self) -> Duration {
        self.soak
    }
}

/// A paced rollout's state, as kept on the hub object (`status.rollout`,
/// or the annotation `<status annotation>-rollout` as JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RolloutStatus {
    /// The revision being rolled out (or rolled out).
    pub revision: String,
    /// The members holding a slot.
    #[serde(default)]
    pub updating: Vec<UpdatingMember>,
    /// How many members have the revision and hold no slot.
    #[serde(default)]
    pub updated: usize,
    /// How many selected members have not been given the revision yet.
    #[serde(default)]
    pub remaining: usize,
    /// The stage under way, if the rollout is staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Why no slot is given: halted by failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
    /// Why no slot is given otherwise: paused, or a stage waiting for its
    /// approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// When replicas share the fleet (a sharded coordinator), what each
    /// live replica's last step saw of its own members, by replica ID:
    /// the others' members count in every replica's step.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replicas: BTreeMap<String, ReplicaMembers>,
    /// A roll back under way (or done, until a new revision comes): the
    /// members go from the hub object's revision back to an earlier one,
    /// and `revision` is that earlier one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_back: Option<RollingBack>,
    /// The last revision that reached every member: where a roll back
    /// goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_complete: Option<String>,
}

/// A roll back ([`RolloutStatus::rolling_back`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RollingBack {
    /// The hub object's revision, left.
    pub from: String,
    /// The revision gone back to.
    pub to: String,
    /// Why: the halt that started it, or the annotation that asked.
    pub reason: String,
    /// Asked by [`ROLL_BACK_ANNOTATION`]: it lasts as long as the
    /// annotation does.
    #[serde(default)]
    pub by_annotation: bool,
}

/// One replica's selected members in a rollout, as its last step saw them
/// ([`RolloutStatus::replicas`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ReplicaMembers {
    /// The revision it saw them for.
    pub revision: String,
    /// How many there are.
    pub members: usize,
    /// How many have the revision and hold no slot.
    pub updated: usize,
    /// How many have not been given the revision yet.
    pub remaining: usize,
    /// The first stage (by index) with a member still to change, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<usize>,
}

/// A member holding a slot in a paced rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct UpdatingMember {
    /// The member's name.
    pub cluster: String,
    /// When it was given the slot.
    pub since: Time,
    /// Why it counts as failed, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl RolloutStatus {
    /// Whether `name` holds a slot.
    pub(crate) fn holds_slot(&self, name: &ClusterName) -> bool {
        self.updating
            .iter()
            .any(|updating| updating.cluster == name.as_str())
    }

    /// Whether every member has the revision and none holds a slot.
    pub(crate) fn is_complete(&self) -> bool {
        self.updating.is_empty() && self.remaining == 0 && self.halted.is_none()
    }

    /// One line for the hub object's condition.
    pub(crate) fn summary(&self) -> String {
        let what = match &self.rolling_back {
            Some(back) => format!(
                "roll back from revision {} to {} ({})",
                back.from, back.to, back.reason
            ),
            None => "rollout".to_string(),
        };
        let mut summary = format!(
            "{what} of revision {}: {} updated, {} updating, {} to go",
            self.revision,
            self.updated,
            self.updating.len(),
            self.remaining
        );
        if let Some(stage) = &self.stage {
            summary.push_str(&format!(", stage {stage}"));
        }
        if let Some(halted) = &self.halted {
            summary.push_str(&format!(", halted: {halted}"));
        } else if let Some(waiting) = &self.waiting {
            summary.push_str(&format!(", {waiting}"));
        }
        summary
    }
}

/// One selected member as the rollout sees it.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    pub(crate) name: ClusterName,
    /// Its stage (see [`Rollout::stage_of`]).
    pub(crate) stage: usize,
    /// Whether every object it holds was applied at the revision.
    pub(crate) at_revision: bool,
    /// Whether it is available with the revision, soaked.
    pub(crate) done: bool,
    /// Why it fails now (degraded or failed), if it does.
    pub(crate) failing: Option<String>,
}

/// What one step of a rollout looks at.
pub(crate) struct Look<'a> {
    pub(crate) rollout: &'a Rollout,
    pub(crate) revision: &'a str,
    pub(crate) now: Timestamp,
    /// The selected members, in rollout order (stage, then name).
    pub(crate) members: &'a [Member],
    /// The names of the stages, by index.
    pub(crate) stage_names: &'a [Option<String>],
    pub(crate) paused: bool,
    /// Whether the stage at an index is approved for the revision.
    pub(crate) approved: &'a dyn Fn(usize) -> bool,
    /// The members other replicas work on (replicas sharing the fleet).
    pub(crate) elsewhere: &'a Elsewhere,
    /// Members this step sees out of the selection: not changing to the
    /// revision, so a slot they hold is free.
    pub(crate) unselected: &'a [ClusterName],
    /// Whether the rollout rolls back (to `revision`).
    pub(crate) rolling_back: bool,
}

/// What the other replicas sharing a fleet report of their members: added
/// to what a step sees itself. Their members' slots are in the record.
#[derive(Clone, Debug, Default)]
pub(crate) struct Elsewhere {
    pub(crate) members: usize,
    pub(crate) updated: usize,
    pub(crate) remaining: usize,
    /// The first stage with a member still to change there.
    pub(crate) stage: Option<usize>,
    /// A live replica that has not reported for this revision yet: until
    /// it does, its members' stages are unknown, and no slot is given.
    pub(crate) unheard: Option<String>,
}

impl Elsewhere {
    /// What the live replicas other than `me` reported in `record` for
    /// `revision`.
    pub(crate) fn from_record(
        record: Option<&RolloutStatus>,
        me: &str,
        live: &[String],
        revision: &str,
    ) -> Self {
        let mut elsewhere = Self::default();
        for replica in live.iter().filter(|replica| *replica != me) {
            let reported = record
                .and_then(|record| record.replicas.get(replica))
                .filter(|reported| reported.revision == revision);
            let Some(reported) = reported else {
                elsewhere.unheard.get_or_insert_with(|| replica.clone());
                continue;
            };
            elsewhere.members += reported.members;
            elsewhere.updated += reported.updated;
            elsewhere.remaining += reported.remaining;
            elsewhere.stage = match (elsewhere.stage, reported.stage) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        elsewhere
    }
}

/// The rollout's next state: slots of members that are done (or gone past
/// their progress deadline) freed, failures noted, and free slots given to
/// the next members of the stage under way, unless halted, paused or
/// waiting for an approval.
pub(crate) fn step(look: &Look<'_>, before: Option<&RolloutStatus>) -> RolloutStatus {
    let Pace::Paced {
        max_unavailable, ..
    } = &look.rollout.pace
    else {
        return RolloutStatus::default();
    };
    let member = |name: &str| look.members.iter().find(|m| m.name.as_str() == name);
    let held = |slot: &UpdatingMember| {
        Duration::try_from(look.now.duration_since(slot.since.0)).unwrap_or_default()
    };
    // A member keeps its slot across revisions until it is done: it is
    // still changing. One this look does not see may be changing too: a
    // controller that has just started has not engaged every member yet,
    // and freeing their slots then gave them out twice. Only past its
    // progress deadline is a member not seen taken as gone.
    let mut updating: Vec<UpdatingMember> = before
        .map(|record| record.updating.clone())
        .unwrap_or_default();
    updating.retain(|slot| match member(&slot.cluster) {
        Some(m) => !m.done,
        None if look
            .unselected
            .iter()
            .any(|name| name.as_str() == slot.cluster) =>
        {
            false
        }
        None => held(slot) <= look.rollout.progress_deadline,
    });
    for slot in &mut updating {
        // A member this step does not see keeps what its own replica
        // found (replicas sharing the fleet). One that failed stays
        // failed until it is available (its slot then goes): retried, it
        // is changing again, not recovered, and a halt holds meanwhile.
        // Rolling back, what failed with the revision left behind is what
        // the roll back mends.
        let before = slot.failed.take().filter(|_| !look.rolling_back);
        let failing = match member(&slot.cluster) {
            Some(m) => m.failing.clone().or(before),
            None => before,
        };
        let held = held(slot);
        slot.failed = failing.or_else(|| {
            (held > look.rollout.progress_deadline).then(|| {
                format!(
                    "not available within its progress deadline of {}s",
                    look.rollout.progress_deadline.as_secs()
                )
            })
        });
    }
    let failed: Vec<&UpdatingMember> = updating
        .iter()
        .filter(|slot| slot.failed.is_some())
        .collect();
    let halted = (failed.len() > look.rollout.failure_budget).then(|| {
        let first = failed[0];
        format!(
            "{} failed, more than its failure budget of {} ({}: {})",
            failed.len(),
            look.rollout.failure_budget,
            first.cluster,
            first.failed.as_deref().unwrap_or_default()
        )
    });
    let holds = |name: &ClusterName, updating: &[UpdatingMember]| {
        updating.iter().any(|slot| slot.cluster == name.as_str())
    };
    // The stage under way: the first with a member still to change.
    let current = look
        .members
        .iter()
        .filter(|m| !m.at_revision || holds(&m.name, &updating))
        .map(|m| m.stage)
        .chain(look.elsewhere.stage)
        .min();
    let mut waiting = None;
    if halted.is_none() {
        if look.paused {
            waiting = Some(format!("paused ({PAUSE_ANNOTATION})"));
        } else if let Some(replica) = &look.elsewhere.unheard {
            waiting = Some(format!(
                "waiting for replica {replica} to report its members"
            ));
        } else if let Some(stage) = current {
            if look.rollout.needs_approval(stage) && !(look.approved)(stage) {
                let name = look
                    .stage_names
                    .get(stage)
                    .cloned()
                    .flatten()
                    .unwrap_or_default();
                waiting = Some(format!(
                    "stage {name} waits for its approval: {APPROVAL_ANNOTATION}={name}@{}",
                    look.revision
                ));
            } else {
                let free = max_unavailable
                    .slots(look.members.len() + look.elsewhere.members)
                    .saturating_sub(updating.len());
                let next: Vec<UpdatingMember> = look
                    .members
                    .iter()
                    .filter(|m| m.stage == stage && !m.at_revision && !holds(&m.name, &updating))
                    .take(free)
                    .map(|m| UpdatingMember {
                        cluster: m.name.as_str().to_string(),
                        // Whole seconds, as the API server keeps a time:
                        // what is written reads back the same.
                        since: Time(
                            look.now
                                .round(k8s_openapi::jiff::Unit::Second)
                                .unwrap_or(look.now),
                        ),
                        failed: None,
                    })
                    .collect();
                updating.extend(next);
            }
        }
    }
    let updated = look
        .members
        .iter()
        .filter(|m| m.at_revision && !holds(&m.name, &updating))
        .count();
    let remaining = look
        .members
        .iter()
        .filter(|m| !m.at_revision && !holds(&m.name, &updating))
        .count();
    RolloutStatus {
        revision: look.revision.to_string(),
        updating,
        updated: updated + look.elsewhere.updated,
        remaining: remaining + look.elsewhere.remaining,
        stage: current.and_then(|stage| look.stage_names.get(stage).cloned().flatten()),
        halted,
        waiting,
        replicas: BTreeMap::new(),
        rolling_back: None,
        last_complete: None,
    }
}

/// What `record` (a step's result) says of the step's own `members`, for
/// the other replicas sharing the fleet.
pub(crate) fn own_members(record: &RolloutStatus, members: &[Member]) -> ReplicaMembers {
    let holds = |m: &Member| record.holds_slot(&m.name);
    ReplicaMembers {
        revision: record.revision.clone(),
        members: members.len(),
        updated: members
            .iter()
            .filter(|m| m.at_revision && !holds(m))
            .count(),
        remaining: members
            .iter()
            .filter(|m| !m.at_revision && !holds(m))
            .count(),
        stage: members
            .iter()
            .filter(|m| !m.at_revision || holds(m))
            .map(|m| m.stage)
            .min(),
    }
}

/// The revision of a hub object (as JSON), as its status, its members'
/// objects ([`REVISION_ANNOTATION`]) and its history name it: its
/// `metadata.generation`, or for a type the API server keeps none for (a
/// ConfigMap) a digest of its labels and of everything outside its
/// metadata and status. Tools that read a rollout (the kubectl plugin)
/// compare it with `status.rollout.revision`.
pub fn revision_of(hub: &Value) -> String {
    if let Some(generation) = hub.pointer("/metadata/generation").and_then(Value::as_i64) {
        return generation.to_string();
    }
    let mut content = hub.clone();
    if let Some(object) = content.as_object_mut() {
        let labels = object
            .get("metadata")
            .and_then(|metadata| metadata.get("labels"))
            .cloned();
        object.remove("status");
        object.insert("metadata".into(), serde_json::json!({ "labels": labels }));
    }
    // serde_json keeps maps sorted (no `preserve_order`), so the text is
    // the same for the same content in every process.
    format!("{:016x}", fnv1a(content.to_string().as_bytes()))
}

/// FNV-1a, 64 bits: a digest that is the same in every process and
/// release (std's hasher promises neither), written out as it is six lines.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The revision `hub`'s annotations ask its members to be rolled back to.
pub(crate) fn roll_back_asked(hub: &Value) -> Option<String> {
    hub.pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(ROLL_BACK_ANNOTATION))
        .and_then(Value::as_str)
        .map(|revision| revision.trim().to_string())
        .filter(|revision| !revision.is_empty())
}

/// Whether `hub`'s annotations pause its rollout.
pub(crate) fn paused_by_annotation(hub: &Value) -> bool {
    hub.pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(PAUSE_ANNOTATION))
        .and_then(Value::as_str)
        .is_some_and(|value| value.trim() == "true")
}

/// Whether `hub`'s annotations approve `stage` at `revision`.
pub(crate) fn approved_by_annotation(hub: &Value, stage: &str, revision: &str) -> bool {
    hub.pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(APPROVAL_ANNOTATION))
        .and_then(Value::as_str)
        .is_some_and(|approved| {
            approved
                .split(',')
                .any(|entry| entry.trim() == format!("{stage}@{revision}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_is_read_as_a_deployment_writes_it() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let read = |value: IntOrString| MaxUnavailable::from_int_or_string(&value);
        assert_eq!(read(IntOrString::Int(2)), Ok(MaxUnavailable::Count(2)));
        assert_eq!(
            read(IntOrString::String("25%".into())),
            Ok(MaxUnavailable::Percent(25))
        );
        assert_eq!(
            read(IntOrString::String("100%".into())),
            Ok(MaxUnavailable::Percent(100))
        );
        for (given, named) in [
            (IntOrString::Int(-1), "-1"),
            (IntOrString::String("25".into()), "\"25\""),
            (IntOrString::String("101%".into()), "\"101%\""),
            (IntOrString::String("a%".into()), "\"a%\""),
        ] {
            let err = read(given).unwrap_err();
            assert!(err.contains(named), "{err}");
        }
    }

    fn member(name: &str, stage: usize, at_revision: bool, done: bool) -> Member {
        Member {
            name: ClusterName::from(name),
            stage,
            at_revision,
            done,
            failing: None,
        }
    }

    fn look<'a>(
        rollout: &'a Rollout,
        members: &'a [Member],
        now: Timestamp,
        approved: &'a dyn Fn(usize) -> bool,
    ) -> Look<'a> {
        Look {
            rollout,
            revision: "2",
            now,
            members,
            stage_names: &[],
            paused: false,
            approved,
            elsewhere: &NOWHERE,
            unselected: &[],
            rolling_back: false,
        }
    }

    #[test]
    fn a_slot_of_a_member_seen_out_of_the_selection_is_freed_at_once() {
        let rollout = Rollout::rolling(MaxUnavailable::Count(2));
        let now = Timestamp::now();
        let members = [member("c", 0, false, false), member("d", 0, false, false)];
        let before = RolloutStatus {
            revision: "2".into(),
            updating: ["a", "b"]
                .map(|name| UpdatingMember {
                    cluster: name.into(),
                    since: Time(now),
                    failed: None,
                })
                .to_vec(),
            ..RolloutStatus::default()
        };
        // a moved out of the selection here; b is not seen at all.
        let unselected = [ClusterName::from("a")];
        let record = step(
            &Look {
                unselected: &unselected,
                ..look(&rollout, &members, now, &|_| true)
            },
            Some(&before),
        );
        assert_eq!(holders(&record), ["b", "c"]);
    }

    /// No other replica.
    static NOWHERE: Elsewhere = Elsewhere {
        members: 0,
        updated: 0,
        remaining: 0,
        stage: None,
        unheard: None,
    };

    #[test]
    fn the_other_replicas_members_count_in_the_bound_the_base_and_the_stage() {
        // This replica sees c and d (stage 1); another replica works on
        // a and b (stage 0), a holding a slot there.
        let rollout = Rollout::staged(
            [
                Stage::named("first", ["a", "b"]),
                Stage::named("second", ["c", "d"]),
            ],
            MaxUnavailable::Percent(50),
        );
        let now = Timestamp::now();
        let members = [member("c", 1, false, false), member("d", 1, false, false)];
        let before = RolloutStatus {
            revision: "2".into(),
            updating: vec![UpdatingMember {
                cluster: "a".into(),
                since: Time(now),
                failed: Some("Deployment a/web: failed".into()),
            }],
            ..RolloutStatus::default()
        };
        let record = |elsewhere: &Elsewhere| {
            step(
                &Look {
                    elsewhere,
                    ..look(&rollout, &members, now, &|_| true)
                },
                Some(&before),
            )
        };
        // The other replica's first stage is under way: none of c, d yet.
        let mut elsewhere = Elsewhere {
            members: 2,
            updated: 0,
            remaining: 1,
            stage: Some(0),
            unheard: None,
        };
        let first = record(&elsewhere);
        assert_eq!(holders(&first), ["a"]);
        // Its failure, found by its own replica, stays (halting here too).
        assert!(first.halted.is_some(), "{first:?}");
        assert_eq!((first.updated, first.remaining), (0, 3));
        // Its first stage done (a's slot freed by its replica): half of
        // the four members is two slots, both for this replica's.
        elsewhere.stage = None;
        let freed = RolloutStatus {
            updating: Vec::new(),
            ..before.clone()
        };
        let second = step(
            &Look {
                elsewhere: &elsewhere,
                ..look(&rollout, &members, now, &|_| true)
            },
            Some(&freed),
        );
        assert_eq!(holders(&second), ["c", "d"]);
        // A live replica not heard from for this revision: no slot.
        elsewhere.unheard = Some("replica-b".into());
        let third = step(
            &Look {
                elsewhere: &elsewhere,
                ..look(&rollout, &members, now, &|_| true)
            },
            Some(&freed),
        );
        assert!(third.updating.is_empty());
        assert!(
            third
                .waiting
                .as_deref()
                .is_some_and(|w| w.contains("replica-b")),
            "{third:?}"
        );
    }

    #[test]
    fn what_other_replicas_report_is_summed_for_the_revision_and_live_ones() {
        let report = |revision: &str, members, stage| ReplicaMembers {
            revision: revision.into(),
            members,
            updated: 1,
            remaining: members - 1,
            stage,
        };
        let record = RolloutStatus {
            revision: "2".into(),
            replicas: BTreeMap::from([
                ("me".to_string(), report("2", 9, Some(0))),
                ("b".to_string(), report("2", 3, Some(2))),
                ("c".to_string(), report("2", 4, Some(1))),
                ("gone".to_string(), report("2", 5, Some(0))),
                ("old".to_string(), report("1", 6, Some(0))),
            ]),
            ..RolloutStatus::default()
        };
        let live = ["b", "c", "me"].map(str::to_string);
        let elsewhere = Elsewhere::from_record(Some(&record), "me", &live, "2");
        assert_eq!(
            (elsewhere.members, elsewhere.updated, elsewhere.remaining),
            (7, 2, 5)
        );
        assert_eq!(elsewhere.stage, Some(1));
        assert_eq!(elsewhere.unheard, None);
        let live = ["b", "me", "old"].map(str::to_string);
        let elsewhere = Elsewhere::from_record(Some(&record), "me", &live, "2");
        assert_eq!(elsewhere.unheard.as_deref(), Some("old"));
    }

    fn holders(record: &RolloutStatus) -> Vec<&str> {
        record
            .updating
            .iter()
            .map(|slot| slot.cluster.as_str())
            .collect()
    }

    #[test]
    fn slots_go_in_order_and_come_back_once_done() {
        let rollout = Rollout::rolling(MaxUnavailable::Count(2));
        let now = Timestamp::now();
        let mut members: Vec<Member> = ["a", "b", "c", "d"]
            .iter()
            .map(|name| member(name, 0, false, false))
            .collect();
        let first = step(&look(&rollout, &members, now, &|_| true), None);
        assert_eq!(holders(&first), ["a", "b"]);
        assert_eq!((first.updated, first.remaining), (0, 2));
        // a has the revision but is not available yet: nothing moves.
        members[0].at_revision = true;
        let second = step(&look(&rollout, &members, now, &|_| true), Some(&first));
        assert_eq!(holders(&second), ["a", "b"]);
        // a is done: c takes its slot.
        members[0].done = true;
        let third = step(&look(&rollout, &members, now, &|_| true), Some(&second));
        assert_eq!(holders(&third), ["b", "c"]);
        assert_eq!((third.updated, third.remaining), (1, 1));
    }

    #[test]
    fn a_failure_beyond_the_budget_halts_and_a_recovery_resumes() {
        let rollout = Rollout::rolling(MaxUnavailable::Count(2));
        let now = Timestamp::now();
        let mut members: Vec<Member> = ["a", "b", "c"]
            .iter()
            .map(|name| member(name, 0, false, false))
            .collect();
        let first = step(&look(&rollout, &members, now, &|_| true), None);
        members[0].at_revision = true;
        members[0].failing = Some("Deployment default/web: its rollout passed its deadline".into());
        members[1].at_revision = true;
        members[1].done = true;
        let halted = step(&look(&rollout, &members, now, &|_| true), Some(&first));
        assert_eq!(holders(&halted), ["a"], "no slot for c while halted");
        let reason = halted.halted.clone().expect("halted");
        assert!(reason.contains("a: Deployment default/web"), "{reason}");
        // No longer failing but not available yet (retried, changing
        // again): still failed, the halt holds.
        members[0].failing = None;
        let retried = step(&look(&rollout, &members, now, &|_| true), Some(&halted));
        assert_eq!(
            holders(&retried),
            ["a"],
            "no slot for c while a is not available"
        );
        assert!(retried.halted.is_some());
        // Available: its slot goes, and the rollout resumes.
        members[0].done = true;
        let resumed = step(&look(&rollout, &members, now, &|_| true), Some(&retried));
        assert_eq!(holders(&resumed), ["c"]);
        assert_eq!(resumed.halted, None);
        members[0].done = false;
        // A budget of one lets one failure pass.
        members[0].failing = Some("degraded".into());
        let tolerant = rollout.clone().failure_budget(1);
        let record = step(&look(&tolerant, &members, now, &|_| true), Some(&halted));
        assert_eq!(record.halted, None);
    }

    #[test]
    fn a_slot_held_past_the_progress_deadline_counts_as_failed() {
        let rollout =
            Rollout::rolling(MaxUnavailable::Count(1)).progress_deadline(Duration::from_secs(60));
        let then = Timestamp::now();
        let members = [member("a", 0, false, false), member("b", 0, false, false)];
        let first = step(&look(&rollout, &members, then, &|_| true), None);
        let later = then
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(61))
            .expect("time");
        let record = step(&look(&rollout, &members, later, &|_| true), Some(&first));
        assert!(
            record
                .halted
                .as_deref()
                .is_some_and(|h| h.contains("progress deadline"))
        );
        assert_eq!(holders(&record), ["a"]);
    }

    /// A controller that has just started sees only the members engaged
    /// so far: a slot of one it does not see yet is still taken (that
    /// member may be changing), and only a member gone past its progress
    /// deadline gives its slot back, without counting as a failure.
    #[test]
    fn a_member_not_seen_keeps_its_slot_until_its_progress_deadline() {
        let rollout =
            Rollout::rolling(MaxUnavailable::Count(2)).progress_deadline(Duration::from_secs(60));
        let then = Timestamp::now();
        let all = ["a", "b", "c", "d"].map(|name| member(name, 0, false, false));
        let first = step(&look(&rollout, &all, then, &|_| true), None);
        assert_eq!(holders(&first), ["a", "b"]);
        // Restarted: only c and d are engaged yet.
        let seen = [member("c", 0, false, false), member("d", 0, false, false)];
        let restarted = step(&look(&rollout, &seen, then, &|_| true), Some(&first));
        assert_eq!(holders(&restarted), ["a", "b"], "no slot for c or d");
        assert_eq!(restarted.halted, None);
        // Gone for good: past the deadline their slots go to c and d.
        let later = then
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(61))
            .expect("time");
        let gone = step(&look(&rollout, &seen, later, &|_| true), Some(&restarted));
        assert_eq!(holders(&gone), ["c", "d"]);
        assert_eq!(gone.halted, None);
    }

    #[test]
    fn stages_go_in_turn_and_wait_for_their_approval() {
        let rollout = Rollout::staged(
            [
                Stage::named("canary", ["a"]),
                Stage::named("prod", ["b", "c"]).needs_approval(),
            ],
            MaxUnavailable::Count(5),
        );
        let names = [Some("canary".to_string()), Some("prod".to_string())];
        let now = Timestamp::now();
        let mut members = vec![
            member("a", 0, false, false),
            member("b", 1, false, false),
            member("c", 1, false, false),
        ];
        let mut looked = look(&rollout, &members, now, &|_| false);
        looked.stage_names = &names;
        let first = step(&looked, None);
        assert_eq!(holders(&first), ["a"], "prod waits for canary");
        assert_eq!(first.stage.as_deref(), Some("canary"));
        members[0].at_revision = true;
        members[0].done = true;
        let mut looked = look(&rollout, &members, now, &|_| false);
        looked.stage_names = &names;
        let waiting = step(&looked, Some(&first));
        assert!(holders(&waiting).is_empty());
        assert_eq!(
            waiting.waiting.as_deref(),
            Some("stage prod waits for its approval: propagation.mcr.sigs.k8s.io/approved=prod@2")
        );
        let mut looked = look(&rollout, &members, now, &|stage| stage == 1);
        looked.stage_names = &names;
        assert_eq!(holders(&step(&looked, Some(&waiting))), ["b", "c"]);
    }

    #[test]
    fn paused_gives_no_slot_and_keeps_those_given() {
        let rollout = Rollout::rolling(MaxUnavailable::Count(1));
        let now = Timestamp::now();
        let members = [member("a", 0, false, false), member("b", 0, false, false)];
        let first = step(&look(&rollout, &members, now, &|_| true), None);
        let mut looked = look(&rollout, &members, now, &|_| true);
        looked.paused = true;
        let paused = step(&looked, Some(&first));
        assert_eq!(holders(&paused), ["a"]);
        assert!(
            paused
                .waiting
                .as_deref()
                .is_some_and(|w| w.starts_with("paused"))
        );
    }

    #[test]
    fn a_percentage_rounds_down_to_at_least_one() {
        assert_eq!(MaxUnavailable::Percent(25).slots(6), 1);
        assert_eq!(MaxUnavailable::Percent(25).slots(8), 2);
        assert_eq!(MaxUnavailable::Percent(10).slots(3), 1);
        assert_eq!(MaxUnavailable::Count(0).slots(3), 1);
    }

    #[test]
    fn the_revision_is_the_generation_or_a_stable_digest() {
        let typed = serde_json::json!({"metadata": {"name": "x", "generation": 7}});
        assert_eq!(revision_of(&typed), "7");
        let config = |data: &str, annotation: &str| {
            serde_json::json!({
                "metadata": {"name": "x", "resourceVersion": annotation, "annotations": {"a": annotation}},
                "data": {"k": data},
            })
        };
        assert_eq!(
            revision_of(&config("1", "x")),
            revision_of(&config("1", "y"))
        );
        assert_ne!(
            revision_of(&config("1", "x")),
            revision_of(&config("2", "x"))
        );
    }
}
