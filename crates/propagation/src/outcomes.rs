//! Every hub object's members and how they are doing, counted by state as
//! they change: the members gauge follows each change rather than
//! recounting the fleet at every status write.

use std::collections::{BTreeMap, HashMap};

use super::HubKey;
use super::status::{MemberState, Outcome};
use multicluster_runtime::ClusterName;

/// How many states there are (the gauge has one series each).
pub(super) const STATE_COUNT: usize = 8;

/// The outcomes of every hub object's members, and how many are in each
/// state (a member counts once per hub object).
#[derive(Default)]
pub(super) struct Outcomes {
    by_hub: HashMap<HubKey, BTreeMap<ClusterName, Outcome>>,
    counts: [i64; STATE_COUNT],
}

impl Outcomes {
    /// How many outcomes are in each state, indexed by `MemberState as
    /// usize`.
    pub(super) fn counts(&self) -> [i64; STATE_COUNT] {
        self.counts
    }

    /// Whether `key` has members on record.
    pub(super) fn has_hub(&self, key: &HubKey) -> bool {
        self.by_hub.contains_key(key)
    }

    /// `key`'s members on record.
    pub(super) fn members(&self, key: &HubKey) -> Option<&BTreeMap<ClusterName, Outcome>> {
        self.by_hub.get(key)
    }

    /// `member`'s outcome for `key`.
    pub(super) fn get(&self, key: &HubKey, member: &ClusterName) -> Option<&Outcome> {
        self.by_hub.get(key)?.get(member)
    }

    /// Sets `member`'s outcome for `key`.
    pub(super) fn set(&mut self, key: &HubKey, member: &ClusterName, outcome: Outcome) {
        self.count(outcome.state, 1);
        let before = self
            .by_hub
            .entry(key.clone())
            .or_default()
            .insert(member.clone(), outcome);
        if let Some(before) = before {
            self.count(before.state, -1);
        }
    }

    /// Forgets `member`'s outcome for `key`.
    pub(super) fn remove(&mut self, key: &HubKey, member: &ClusterName) {
        let removed = self
            .by_hub
            .get_mut(key)
            .and_then(|members| members.remove(member));
        if let Some(removed) = removed {
            self.count(removed.state, -1);
        }
    }

    /// Keeps only the members of `key` that `keep` says, recording `key`
    /// (with no members) if it had none.
    pub(super) fn keep_only(&mut self, key: &HubKey, keep: impl Fn(&ClusterName) -> bool) {
        let members = self.by_hub.entry(key.clone()).or_default();
        let mut dropped = Vec::new();
        members.retain(|name, outcome| {
            let kept = keep(name);
            if !kept {
                dropped.push(outcome.state);
            }
            kept
        });
        for state in dropped {
            self.count(state, -1);
        }
    }

    /// Forgets `key` and its members.
    pub(super) fn forget(&mut self, key: &HubKey) {
        for outcome in self
            .by_hub
            .remove(key)
            .into_iter()
            .flat_map(|m| m.into_values())
        {
            self.count(outcome.state, -1);
        }
    }

    fn count(&mut self, state: MemberState, by: i64) {
        self.counts[state as usize] += by;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recount(outcomes: &Outcomes) -> [i64; STATE_COUNT] {
        let mut counts = [0; STATE_COUNT];
        for outcome in outcomes.by_hub.values().flat_map(BTreeMap::values) {
            counts[outcome.state as usize] += 1;
        }
        counts
    }

    #[test]
    fn the_counts_follow_every_change() {
        let mut outcomes = Outcomes::default();
        let (a, b): (HubKey, HubKey) = ((None, "a".into()), (Some("ns".into()), "b".into()));
        let (m1, m2, m3) = (
            ClusterName::from("m1"),
            ClusterName::from("m2"),
            ClusterName::from("m3"),
        );
        let failed = || Outcome::failed(MemberState::Failed, Some("refused".into()));
        outcomes.set(&a, &m1, Outcome::pending());
        outcomes.set(&a, &m2, Outcome::pending());
        outcomes.set(&b, &m1, failed());
        assert_eq!(outcomes.counts(), recount(&outcomes));
        assert_eq!(outcomes.counts()[MemberState::Pending as usize], 2);
        outcomes.set(&a, &m1, failed());
        outcomes.set(&a, &m2, failed());
        outcomes.set(&a, &m3, Outcome::pending());
        assert_eq!(outcomes.counts(), recount(&outcomes));
        assert_eq!(outcomes.counts()[MemberState::Failed as usize], 3);
        outcomes.remove(&a, &m2);
        outcomes.remove(&a, &m2);
        outcomes.keep_only(&a, |name| *name != m3);
        assert_eq!(outcomes.counts(), recount(&outcomes));
        outcomes.forget(&b);
        outcomes.forget(&b);
        assert_eq!(outcomes.counts(), recount(&outcomes));
        assert_eq!(outcomes.counts().iter().sum::<i64>(), 1);
        assert!(outcomes.has_hub(&a) && !outcomes.has_hub(&b));
    }
}
