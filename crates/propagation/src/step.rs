//! One step of a paced rollout, as a pure function of what the hub
//! object's reconcile sees (its members, the record before, the time):
//! slots of members that are done freed, failures counted against the
//! budget, and free slots given to the next members of the stage under
//! way.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::gates::GateCheck;
use crate::record::{GateState, GateStatus, ReplicaMembers, RolloutStatus, UpdatingMember};
use crate::rollout::{APPROVAL_ANNOTATION, PAUSE_ANNOTATION, Rollout};
use multicluster_runtime::ClusterName;

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
    /// Why it may not be given a slot now (outside its maintenance
    /// windows), if so: its stage waits for it.
    pub(crate) closed: Option<String>,
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
    pub(crate) approved: &'a (dyn Fn(usize) -> bool + Sync),
    /// The members other replicas work on (replicas sharing the fleet).
    pub(crate) elsewhere: &'a Elsewhere,
    /// Members this step sees out of the selection: not changing to the
    /// revision, so a slot they hold is free.
    pub(crate) unselected: &'a [ClusterName],
    /// Whether the rollout rolls back (to `revision`).
    pub(crate) rolling_back: bool,
    /// What the gate of the stage under way says now, if it has one and
    /// it was looked at ([`stage_under_way`]).
    pub(crate) gate: Option<&'a GateCheck>,
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

/// The slots kept from `before`: those of members not done yet (and of
/// members not seen, until their progress deadline), each marked failed
/// if its member fails or has held it past that deadline.
fn kept_slots(look: &Look<'_>, before: Option<&RolloutStatus>) -> Vec<UpdatingMember> {
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
        None => held(slot) <= look.rollout.progress_deadline_of(),
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
            (held > look.rollout.progress_deadline_of()).then(|| {
                format!(
                    "not available within its progress deadline of {}s",
                    look.rollout.progress_deadline_of().as_secs()
                )
            })
        });
    }
    updating
}

fn holds(name: &ClusterName, updating: &[UpdatingMember]) -> bool {
    updating.iter().any(|slot| slot.cluster == name.as_str())
}

/// The stage under way: the first with a member still to change (here
/// or, sharing the fleet, at another replica).
fn under_way(look: &Look<'_>, updating: &[UpdatingMember]) -> Option<usize> {
    look.members
        .iter()
        .filter(|m| !m.at_revision || holds(&m.name, updating))
        .map(|m| m.stage)
        .chain(look.elsewhere.stage)
        .min()
}

/// The stage a step of `look` after `before` finds under way, for the
/// reconcile to look at its gate first (a Job's status is read from the
/// hub).
pub(crate) fn stage_under_way(look: &Look<'_>, before: Option<&RolloutStatus>) -> Option<usize> {
    under_way(look, &kept_slots(look, before))
}

/// The gates decided for the revision after this step: those of
/// `before` (for the same revision), and the gate of the stage under
/// way decided again from what it says now (`look.gate`). Paused, none
/// is decided (no timeout runs out); rolling back, none applies.
fn gates_after(
    look: &Look<'_>,
    before: Option<&RolloutStatus>,
    current: Option<usize>,
) -> Vec<GateStatus> {
    if look.rolling_back {
        return Vec::new();
    }
    let mut gates = before
        .filter(|before| before.revision == look.revision && before.rolling_back.is_none())
        .map(|before| before.gates.clone())
        .unwrap_or_default();
    let Some((stage, gate)) = current
        .filter(|_| !look.paused)
        .and_then(|stage| Some((stage, look.rollout.gate_of(stage)?)))
    else {
        return gates;
    };
    let name = look
        .stage_names
        .get(stage)
        .cloned()
        .flatten()
        .unwrap_or_default();
    let at = gates.iter().position(|kept| kept.stage == name);
    let decided = crate::gates::decide(
        &name,
        at.map(|at| &gates[at]),
        look.gate,
        gate.timeout_of(),
        look.now,
    );
    match at {
        Some(at) => gates[at] = decided,
        None => gates.push(decided),
    }
    gates
}

/// The rollout's next state: slots of members that are done (or gone past
/// their progress deadline) freed, failures noted (members' and gates'),
/// and free slots given to the next members of the stage under way,
/// unless halted, paused, or waiting for its gate or approval.
pub(crate) fn step(look: &Look<'_>, before: Option<&RolloutStatus>) -> RolloutStatus {
    let Some(max_unavailable) = look.rollout.max_unavailable() else {
        return RolloutStatus::default();
    };
    let mut updating = kept_slots(look, before);
    let current = under_way(look, &updating);
    let gates = gates_after(look, before, current);
    let failed: Vec<(&str, &str)> = updating
        .iter()
        .filter_map(|slot| Some((slot.cluster.as_str(), slot.failed.as_deref()?)))
        .chain(
            gates
                .iter()
                .filter(|gate| gate.state == GateState::Failed)
                .map(|gate| ("the gate", gate.reason.as_deref().unwrap_or_default())),
        )
        .collect();
    let halted = (failed.len() > look.rollout.failure_budget_of()).then(|| {
        let (what, why) = failed[0];
        format!(
            "{} failed, more than its failure budget of {} ({what}: {why})",
            failed.len(),
            look.rollout.failure_budget_of(),
        )
    });
    let mut waiting = None;
    if halted.is_none() {
        if look.paused {
            waiting = Some(format!("paused ({PAUSE_ANNOTATION})"));
        } else if let Some(replica) = &look.elsewhere.unheard {
            waiting = Some(format!(
                "waiting for replica {replica} to report its members"
            ));
        } else if let Some(stage) = current {
            let name = look
                .stage_names
                .get(stage)
                .cloned()
                .flatten()
                .unwrap_or_default();
            let gate_waits = gates
                .iter()
                .find(|gate| gate.stage == name && look.rollout.gate_of(stage).is_some())
                .filter(|gate| gate.state == GateState::Waiting);
            if let Some(gate) = gate_waits {
                waiting = Some(format!(
                    "stage {name} waits for its gate: {}",
                    gate.reason.as_deref().unwrap_or_default()
                ));
            } else if look.rollout.needs_approval(stage) && !(look.approved)(stage) {
                waiting = Some(format!(
                    "stage {name} waits for its approval: {APPROVAL_ANNOTATION}={name}@{}",
                    look.revision
                ));
            } else {
                let free = max_unavailable
                    .slots(look.members.len() + look.elsewhere.members)
                    .saturating_sub(updating.len());
                let to_change = || {
                    look.members.iter().filter(|m| {
                        m.stage == stage && !m.at_revision && !holds(&m.name, &updating)
                    })
                };
                let closed: Vec<&Member> = to_change().filter(|m| m.closed.is_some()).collect();
                let next: Vec<UpdatingMember> = to_change()
                    .filter(|m| m.closed.is_none())
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
                // Nothing under way in the stage but members outside
                // their windows: say so, and when the first opens.
                if next.is_empty()
                    && let Some(first) = closed.first()
                    && !look
                        .members
                        .iter()
                        .any(|m| m.stage == stage && holds(&m.name, &updating))
                {
                    let what = if name.is_empty() {
                        "the rollout".to_string()
                    } else {
                        format!("stage {name}")
                    };
                    waiting = Some(format!(
                        "{what} waits for {} member(s) outside their maintenance windows ({}: {})",
                        closed.len(),
                        first.name,
                        first.closed.as_deref().unwrap_or_default()
                    ));
                }
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
        gates,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{MaxUnavailable, Stage};

    fn member(name: &str, stage: usize, at_revision: bool, done: bool) -> Member {
        Member {
            name: ClusterName::from(name),
            stage,
            at_revision,
            done,
            failing: None,
            closed: None,
        }
    }

    fn look<'a>(
        rollout: &'a Rollout,
        members: &'a [Member],
        now: Timestamp,
        approved: &'a (dyn Fn(usize) -> bool + Sync),
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
            gate: None,
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
    fn a_member_outside_its_window_takes_no_slot_and_holds_its_stage() {
        let stages = [
            Stage::named("canary", ["a", "b"]),
            Stage::named("main", ["c"]),
        ];
        let rollout = Rollout::staged(stages, MaxUnavailable::Count(1));
        let names = [Some("canary".to_string()), Some("main".to_string())];
        let now = Timestamp::now();
        let mut members = vec![
            member("a", 0, false, false),
            member("b", 0, false, false),
            member("c", 1, false, false),
        ];
        members[0].closed = Some("outside its maintenance windows; opens at T".into());
        // a is closed: b, next in its stage, takes the one slot.
        let first = step(
            &Look {
                stage_names: &names,
                ..look(&rollout, &members, now, &|_| true)
            },
            None,
        );
        assert_eq!(holders(&first), ["b"]);
        assert_eq!(first.waiting, None);
        // b done: a still closed, so the canary stage waits, and main
        // with it; the bound and budget are untouched.
        members[1].at_revision = true;
        members[1].done = true;
        let waiting = step(
            &Look {
                stage_names: &names,
                ..look(&rollout, &members, now, &|_| true)
            },
            Some(&first),
        );
        assert!(holders(&waiting).is_empty());
        assert_eq!(waiting.stage.as_deref(), Some("canary"));
        assert_eq!(waiting.halted, None);
        let why = waiting.waiting.clone().expect("waiting");
        assert!(
            why.starts_with(
                "stage canary waits for 1 member(s) outside their maintenance windows (a: outside"
            ),
            "{why}"
        );
        // Its window opens: it takes the slot.
        members[0].closed = None;
        let opened = step(
            &Look {
                stage_names: &names,
                ..look(&rollout, &members, now, &|_| true)
            },
            Some(&waiting),
        );
        assert_eq!(holders(&opened), ["a"]);
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
    fn a_gated_stage_waits_for_its_gate_and_a_failed_gate_counts_as_a_failure() {
        use crate::gates::{Gate, GateCheck};
        let staged = |budget: usize| {
            Rollout::staged(
                [
                    Stage::named("canary", ["a"]),
                    Stage::named("prod", ["b", "c"]).gated_by(Gate::condition("Smoke")),
                ],
                MaxUnavailable::Count(5),
            )
            .failure_budget(budget)
        };
        let names = [Some("canary".to_string()), Some("prod".to_string())];
        let now = Timestamp::now();
        let members = [
            member("a", 0, true, true),
            member("b", 1, false, false),
            member("c", 1, false, false),
        ];
        let rollout = staged(0);
        let stepped = |rollout: &Rollout, gate: &GateCheck, before: Option<&RolloutStatus>| {
            let mut looked = look(rollout, &members, now, &|_| true);
            looked.stage_names = &names;
            looked.gate = Some(gate);
            assert_eq!(stage_under_way(&looked, before), Some(1));
            step(&looked, before)
        };
        let waiting = stepped(
            &rollout,
            &GateCheck::Waiting("condition Smoke not written yet".into()),
            None,
        );
        assert!(holders(&waiting).is_empty(), "prod started before its gate");
        assert_eq!(
            waiting.waiting.as_deref(),
            Some("stage prod waits for its gate: condition Smoke not written yet")
        );
        assert_eq!(waiting.gates.len(), 1);
        // Passed, the stage starts, and stays passed whatever it says later.
        let passed = stepped(&rollout, &GateCheck::Passed, Some(&waiting));
        assert_eq!(holders(&passed), ["b", "c"]);
        let later = stepped(
            &rollout,
            &GateCheck::Failed("flapped".into()),
            Some(&passed),
        );
        assert_eq!(
            (holders(&later), later.halted.as_deref()),
            (vec!["b", "c"], None)
        );
        // Failed, it halts past the budget and is tolerated within it.
        let failed = GateCheck::Failed("condition Smoke is False".into());
        let halted = stepped(&rollout, &failed, Some(&waiting));
        assert!(holders(&halted).is_empty());
        assert!(
            halted
                .halted
                .as_deref()
                .is_some_and(|why| why.contains("the gate: condition Smoke is False")),
            "{:?}",
            halted.halted
        );
        let tolerant = staged(1);
        let tolerated = stepped(&tolerant, &failed, Some(&waiting));
        assert_eq!(
            (holders(&tolerated), tolerated.halted.as_deref()),
            (vec!["b", "c"], None)
        );
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
}
