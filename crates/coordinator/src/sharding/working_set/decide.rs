//! What a look decides for one cluster of the working set, from the
//! cluster's share and the look's snapshot of the peers.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::Held;
use super::WorkingSet;
use crate::lease;
use crate::lock;
use crate::sharding::heirs;
use crate::sharding::look::Look;
use crate::sharding::owner_of;
use k8s_openapi::api::coordination::v1::Lease;
use multicluster_runtime::{Aware, ClusterName};
use std::sync::Arc;

/// What one look at a cluster decided.
pub(in crate::sharding) enum Step {
    Nothing,
    Take {
        generation: u64,
    },
    Release {
        held: Held,
        why: String,
        /// Components whose running work must end before the fence goes.
        settle: Vec<Arc<dyn Aware>>,
        /// The next owner, to hand the fence to straight away.
        next: Option<Box<lease::Next>>,
    },
    /// Write an inherited fence, as listed, as this replica's own.
    Rewrite {
        generation: u64,
        inherited: Box<Lease>,
    },
}

/// What a look's decisions depend on besides the look itself.
pub(in crate::sharding) struct Rules<'a> {
    /// This replica's peer ID.
    pub(in crate::sharding) me: &'a str,
    /// Whether this replica has said it is leaving: every cluster goes to
    /// its next owner.
    pub(in crate::sharding) leaving: bool,
    /// How long after a failed or lost hold a cluster is tried again.
    pub(in crate::sharding) retry_delay: Duration,
}

impl WorkingSet {
    /// What to do with `name` now, as `look` sees the peers.
    ///
    /// Long on purpose: one rule per case, in the order they apply (gone,
    /// inherited and overdue, leaving, kept for a joiner, rewrite, release,
    /// take); split up, that order would be spread over several functions.
    pub(in crate::sharding) fn decide(
        &self,
        name: &ClusterName,
        look: &Look,
        rules: &Rules,
    ) -> Step {
        let mut clusters = lock(&self.clusters);
        let engaged = &mut clusters.engaged;
        let Some(entry) = engaged.get_mut(name) else {
            return Step::Nothing;
        };
        if !entry.is_live() {
            let held = engaged.remove(name).and_then(|entry| entry.data.held);
            return held.map_or(Step::Nothing, |held| Step::Release {
                held,
                why: "the cluster left the fleet".to_string(),
                settle: Vec::new(),
                next: None,
            });
        }
        let generation = entry.generation;
        let entry = &mut entry.data;
        let now = Instant::now();
        if let Some(mut held) = entry.held.take_if(|held| held.is_lost()) {
            entry.retry_at = Some(now + rules.retry_delay);
            entry.last_written = held.fence.take_written();
            return Step::Release {
                held,
                why: "its fence was lost (not renewed, or this replica's epoch ended)".to_string(),
                settle: Vec::new(),
                next: None,
            };
        }
        if entry
            .held
            .as_ref()
            .and_then(|held| held.inherited_until)
            .is_some_and(|until| Timestamp::now() >= until)
            && let Some(held) = entry.held.take()
        {
            held.work.cancel();
            entry.retry_at = Some(now + rules.retry_delay);
            tracing::warn!(cluster = %name, "an inherited fence was not written as this replica's own in time; stopped working on the cluster");
            return Step::Nothing;
        }
        let me = rules.me;
        if rules.leaving {
            // Leaving: every cluster goes to its next owner, one by one,
            // while the controllers work on those not handed yet. One with
            // nobody ready to take it is freed with the peer Lease.
            return match entry.held.take() {
                Some(held) => match look.hand_over_to(name, me) {
                    Some(next) => Step::Release {
                        held,
                        why: format!("this replica is leaving; handed to {}", next.holder),
                        settle: entry.components.clone(),
                        next: Some(Box::new(next)),
                    },
                    None => {
                        entry.held = Some(held);
                        Step::Nothing
                    }
                },
                None => Step::Nothing,
            };
        }
        let owner = owner_of(name.as_str(), &look.peers);
        // Kept for an owner that has not engaged its inventory yet: handed
        // over now, it would sit unworked until its provider got to it.
        let keep_for_joiner = owner.is_some_and(|peer| look.joining.contains(&peer.id));
        let owns = owner.is_some_and(|peer| peer.id == me)
            || keep_for_joiner && look.stands_in_for(name.as_str(), owner, me);
        // While peers leave or join, their hand-overs and takes come first
        // (rewrites would slow them down), unless the window is half gone.
        let settled = look.leaving.is_empty() && look.joining.is_empty();
        let inherited = entry
            .held
            .as_ref()
            .filter(|held| !held.is_lost())
            .filter(|held| {
                held.inherited_until
                    .is_some_and(|until| settled || heirs::rewrite_is_due(until))
            })
            .and_then(|held| held.fence.written());
        // Kept for a joiner too: it may not be ready before the window ends.
        let keeps = owns || keep_for_joiner;
        if let Some(inherited) = inherited.filter(|_| keeps && look.may_rewrite()) {
            return Step::Rewrite {
                generation,
                inherited: Box::new(inherited.clone()),
            };
        }
        match (owns, entry.held.take()) {
            (false, Some(held)) if keep_for_joiner && !held.is_lost() => {
                entry.held = Some(held);
                Step::Nothing
            }
            (false, Some(held)) => Step::Release {
                held,
                why: format!(
                    "now owned by {}",
                    owner.map_or("nobody", |peer| peer.id.as_str())
                ),
                settle: entry.components.clone(),
                next: look.next_for(owner, name).map(Box::new),
            },
            // Handed over by the leaving peer that holds it, or freed with
            // its Lease.
            (true, None) if look.awaits_hand_over(name.as_str()) => Step::Nothing,
            // Most likely inherited: listed in a moment, without a write.
            (true, None) if look.inheriting => Step::Nothing,
            (true, None) if entry.retry_at.is_none_or(|at| now >= at) => Step::Take { generation },
            (owns, held) => {
                entry.held = held;
                if !owns {
                    // A retry due for a cluster that is another's now would
                    // have the loop look again at once, over and over.
                    entry.retry_at = None;
                    entry.busy = 0;
                }
                Step::Nothing
            }
        }
    }
}
