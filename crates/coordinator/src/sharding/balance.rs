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
        let changes = self.inner.view.changes();
        let outdated = || changes.any();
        let leaving = self.inner.lifecycle.reached(Phase::SaidLeaving);
        // A leaving replica hands its clusters over as the look sees the
        // peers: once another peer is seen leaving too, the clusters still
        // to go would be handed to it, and passed on again.
        let cut_short = || leaving && outdated();
        let look = Look {
            inheriting: self.inheriting(),
            ..self.look()
        };
        let names = self.inner.working.names();
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
            self.inner.working.settle();
        }
        (!cut_short()).then(|| handed.into_inner())
    }

    /// The peers as one look sees them.
    pub(super) fn look(&self) -> Look {
        let peers = self.peers();
        let joining = self.inner.view.joining();
        // Only a ready replica stands in, and only for peers that came back.
        let came_back = if self.inner.lifecycle.reached(Phase::Ready) {
            let epochs = lock(self.inner.view.epochs());
            let now = Timestamp::now();
            joining
                .iter()
                .filter(|id| epochs.departed_lately(id, now))
                .cloned()
                .collect()
        } else {
            std::collections::BTreeSet::new()
        };
        self.inner.working.stand_in_for(&came_back, &joining);
        let ready: Vec<Peer> = peers
            .iter()
            .filter(|peer| !joining.contains(&peer.id))
            .cloned()
            .collect();
        let next = if self.inner.options.fence_hold == FenceHold::WithPeer {
            let epochs = lock(self.inner.view.epochs());
            let now = Timestamp::now();
            let options = &self.inner.options;
            ready
                .iter()
                .filter(|peer| peer.id != self.inner.me.id)
                .filter_map(|peer| {
                    let peer_lease = lease_name(&options.peer_prefix, &peer.id);
                    let epoch = epochs.live_epoch(&peer_lease, &peer.id, now)?;
                    let held_with = lease::held_with(&peer_lease, epoch);
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
        let leaving = self.inner.view.leaving();
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
        let step = self.inner.working.decide(name, look, &self.rules());
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

    /// What this replica's looks decide by, besides the look.
    pub(super) fn rules(&self) -> working_set::Rules<'_> {
        working_set::Rules {
            me: &self.inner.me.id,
            leaving: self.inner.lifecycle.reached(Phase::SaidLeaving),
            retry_delay: self.inner.options.fence_retry_delay,
        }
    }
}
