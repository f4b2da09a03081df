//! A look at the fleet: which clusters this replica takes, keeps, hands
//! back or hands straight to their next owner, decided per cluster from
//! one snapshot of the peers, the fences and the working set.

use super::*;

impl ShardedCoordinator {
    /// Looks at every cluster once: takes the fences of clusters this
    /// replica owns, hands back those it no longer owns. Returns how many
    /// it handed straight to another replica, or `None` when this replica
    /// is leaving and the peers changed during the look: it stopped handing
    /// over, and the next look starts at once.
    pub(super) async fn balance(&self, stop: &CancellationToken) -> Option<usize> {
        self.release_again().await;
        // A look with thousands of takes lasts long; once the peers change
        // (one left, came back or became ready) its remaining takes are
        // left to the next look, which starts at once. Looks at 100,000
        // clusters lasted tens of seconds, and a peer that left meanwhile
        // had its clusters wait for them.
        let peers_then = self.inner.view.peers.subscribe();
        let joining_then = self.inner.view.joining.subscribe();
        let leaving_then = self.inner.view.leaving.subscribe();
        let outdated = || {
            [
                peers_then.has_changed(),
                joining_then.has_changed(),
                leaving_then.has_changed(),
            ]
            .into_iter()
            .any(|changed| changed.unwrap_or(false))
        };
        let leaving = self.inner.lifecycle.reached(Phase::SaidLeaving);
        // A leaving replica hands its clusters over as the look sees the
        // peers: once another peer is seen leaving too, the clusters still
        // to go would be handed to it, and passed on again.
        let cut_short = || leaving && outdated();
        let look = Look {
            inheriting: self.inheriting(),
            ..self.look()
        };
        let names = lock(&self.inner.working.clusters).names();
        let handed = std::sync::atomic::AtomicUsize::new(0);
        let steps = if leaving {
            LEAVING_STEPS
        } else {
            CONCURRENT_STEPS
        };
        futures::stream::iter(names)
            .for_each_concurrent(steps, |name| {
                let (look, outdated, handed, cut_short) = (&look, &outdated, &handed, &cut_short);
                async move {
                    if cut_short() {
                        return;
                    }
                    if self.balance_one(&name, look, outdated, stop).await {
                        handed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
            .await;
        self.give_back_unclaimed().await;
        self.inner.working.show();
        if look.moves.into_inner() == 0 && self.inner.lifecycle.reached(Phase::Ready) && !leaving {
            self.inner.working.settled.cancel();
        }
        (!cut_short()).then(|| handed.into_inner())
    }

    /// The peers as one look sees them.
    pub(super) fn look(&self) -> Look {
        let peers = self.peers();
        let joining = self.inner.view.joining.borrow().clone();
        // Only a ready replica stands in, and only for peers that came back.
        let came_back = if self.inner.lifecycle.reached(Phase::Ready) {
            let epochs = lock(&self.inner.view.epochs);
            let now = Timestamp::now();
            joining
                .iter()
                .filter(|id| epochs.departed_lately(id, now))
                .cloned()
                .collect()
        } else {
            std::collections::BTreeSet::new()
        };
        self.inner.working.standing_in.send_if_modified(|before| {
            if *before == came_back {
                return false;
            }
            tracing::info!(came_back = ?came_back, joining = ?joining, "standing in for peers that restarted and are not ready yet");
            before.clone_from(&came_back);
            true
        });
        let ready: Vec<Peer> = peers
            .iter()
            .filter(|peer| !joining.contains(&peer.id))
            .cloned()
            .collect();
        let next = if self.inner.options.fence_hold == FenceHold::WithPeer {
            let epochs = lock(&self.inner.view.epochs);
            let now = Timestamp::now();
            let options = &self.inner.options;
            ready
                .iter()
                .filter(|peer| peer.id != self.inner.me.id)
                .filter_map(|peer| {
                    let peer_lease = lease_name(&options.peer_prefix, &peer.id);
                    let epoch = epochs.live_epoch(&peer_lease, &peer.id, now)?;
                    let held_with = format!("{peer_lease}/{epoch}");
                    let next = lease::Next {
                        holder: peer.id.clone(),
                        held_with,
                        duration: options.fence_lease_duration,
                        cluster: String::new(),
                    };
                    Some((peer.id.clone(), next))
                })
                .collect()
        } else {
            std::collections::HashMap::new()
        };
        let leaving = self.inner.view.leaving.borrow().clone();
        let mut with_leaving = peers.clone();
        with_leaving.extend(leaving.iter().cloned());
        with_leaving.sort_by(|a, b| a.id.cmp(&b.id));
        with_leaving.dedup_by(|a, b| a.id == b.id);
        Look {
            peers,
            joining,
            came_back,
            ready,
            next,
            leaving: leaving.into_iter().map(|peer| peer.id).collect(),
            with_leaving,
            rewrites_left: heirs::REWRITES_PER_LOOK.into(),
            // Only the looks take; `balance` says.
            inheriting: false,
            moves: 0.into(),
        }
    }

    /// Looks at `name`; whether it handed it straight to another replica.
    pub(super) async fn balance_one(
        &self,
        name: &ClusterName,
        look: &Look,
        outdated: &(dyn Fn() -> bool + Sync),
        stop: &CancellationToken,
    ) -> bool {
        if stop.is_cancelled() {
            // The rest of the look is left to the hand-back, which frees
            // what is held with the peer Lease in one request, not a write
            // per cluster (the clusters' lifetimes end with the stop: each
            // would be "leaving the fleet"). Read here, not from a task
            // woken by the stop: ending 100,000 lifetimes takes seconds,
            // and the look goes on meanwhile.
            return false;
        }
        let step = self.decide(name, look);
        if matches!(step, Step::Take { .. } | Step::Release { .. }) {
            look.moves
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        match step {
            Step::Nothing => false,
            Step::Release {
                held,
                why,
                settle,
                next,
            } => {
                held.work.cancel();
                tracing::info!(cluster = %name, peer = %self.inner.me.id, %why, "stopped working on the cluster");
                // Reconciles already running finish before the next owner
                // may start; the fence is still renewed meanwhile.
                let settled = futures::future::join_all(settle.iter().map(|c| c.settled(name)));
                if tokio::time::timeout(self.inner.options.handover_timeout, settled)
                    .await
                    .is_err()
                {
                    tracing::warn!(cluster = %name, timeout = ?self.inner.options.handover_timeout, "reconciles still running; handing the cluster over anyway");
                }
                self.release(held.fence, next.as_deref()).await;
                next.is_some()
            }
            Step::Rewrite {
                generation,
                inherited,
            } => {
                self.rewrite(name, generation, *inherited).await;
                false
            }
            Step::Take { .. } if outdated() => false,
            Step::Take { generation } => {
                self.take(name, generation, &look.peers).await;
                false
            }
        }
    }

    /// What to do with `name` now, as `look` sees the peers.
    ///
    /// Long on purpose: one rule per case, in the order they apply (gone,
    /// inherited and overdue, leaving, kept for a joiner, rewrite, release,
    /// take); split up, that order would be spread over several functions.
    pub(super) fn decide(&self, name: &ClusterName, look: &Look) -> Step {
        let mut clusters = lock(&self.inner.working.clusters);
        let Some(entry) = clusters.get_mut(name) else {
            return Step::Nothing;
        };
        if !entry.is_live() {
            let held = clusters.remove(name).and_then(|entry| entry.data.held);
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
            entry.retry_at = Some(now + self.inner.options.fence_retry_delay);
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
            entry.retry_at = Some(now + self.inner.options.fence_retry_delay);
            tracing::warn!(cluster = %name, "an inherited fence was not written as this replica's own in time; stopped working on the cluster");
            return Step::Nothing;
        }
        let me = &self.inner.me.id;
        if self.inner.lifecycle.reached(Phase::SaidLeaving) {
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
        let owns = owner.is_some_and(|peer| peer.id == *me)
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
