//! Taking a fence and starting work under it, and letting fences go:
//! released, handed to their next owner, retried later.

use super::*;

impl ShardedCoordinator {
    /// Long on purpose: the take for each way of holding fences, and what each
    /// answer means for the cluster.
    pub(super) async fn take(&self, name: &ClusterName, generation: u64, peers: &[Peer]) {
        let fence_name = self.fence_name(name);
        let taken = match self.inner.options.fence_hold {
            FenceHold::Renewed => {
                fence::Fence::take(
                    &self.inner.leases,
                    fence_name.clone(),
                    &self.inner.me.id,
                    self.timing(),
                    self.inner.working.waker(),
                )
                .await
            }
            FenceHold::WithPeer => {
                let standing = self.inner.standing.borrow().clone();
                if standing.live().is_none() {
                    // Until the peer Lease is renewed again; the registry
                    // wakes the loop then.
                    self.retry_later(name, generation);
                    return;
                }
                let epochs = self.inner.view.epochs();
                let known = epochs::TakeKnowledge {
                    epochs,
                    cluster: name.as_str(),
                };
                let last = self.inner.working.take_last_written(name, generation);
                // Inherited and not written yet when its work stopped (the
                // peer Lease went unrenewed a while, in the same epoch):
                // still this replica's by the records, and nobody took it
                // (that takes ending this epoch first). Resumed as it is.
                if let Some((resumed, until)) = last
                    .as_ref()
                    .and_then(|last| self.still_inherited(last, name, &standing))
                {
                    self.start(name, generation, resumed, Some(until)).await;
                    return;
                }
                // This replica's own earlier epoch too, once a take found it
                // (see `Epochs::learn`): after a restart, the fences nobody
                // stood in for are still held in it, and those stood in for
                // are handed back without a take.
                let ended = lock(epochs).ended_hold(name.as_str(), peers, Timestamp::now());
                fence::Fence::take_with_peer(fence::WithPeer {
                    api: &self.inner.leases,
                    name: fence_name.clone(),
                    me: &self.inner.me.id,
                    standing: &standing,
                    timing: self.timing(),
                    known: &known,
                    prior: lease::Prior { last, ended },
                })
                .await
            }
        };
        let fence = match taken {
            fence::Attempt::Taken(mut fence) => {
                if let Some(found) = fence.take_over_found() {
                    let weight = self
                        .peers()
                        .iter()
                        .find(|peer| peer.id == found.holder)
                        .map_or(1, |peer| peer.weight);
                    lock(self.inner.view.epochs()).learn(&found, weight, Timestamp::now());
                }
                fence
            }
            fence::Attempt::Busy(holder) => {
                tracing::debug!(cluster = %name, lease = %fence_name, holder = holder.as_deref().unwrap_or("unknown"), "fence busy; trying again later");
                self.retry_busy_later(name, generation);
                return;
            }
            fence::Attempt::Failed(reason) => {
                tracing::warn!(cluster = %name, lease = %fence_name, %reason, "could not take the fence; trying again later");
                self.retry_later(name, generation);
                return;
            }
        };
        self.start(name, generation, fence, None).await;
    }

    /// Starts the work on `name` (the engagement of `generation`) under
    /// `fence`, just taken (or resumed as inherited until
    /// `inherited_until`); hands the fence back if the cluster was
    /// replaced or left meanwhile.
    pub(super) async fn start(
        &self,
        name: &ClusterName,
        generation: u64,
        fence: fence::Fence,
        inherited_until: Option<Timestamp>,
    ) {
        let fence_name = fence.name.clone();
        match self
            .inner
            .working
            .start(name, Some(generation), fence, inherited_until)
        {
            Starting::Started((work, cluster, components)) => {
                let resumed = inherited_until.is_some();
                tracing::info!(cluster = %name, peer = %self.inner.me.id, lease = %fence_name, resumed, "working on the cluster");
                engage_or_hand_back(&components, &work, name, &cluster);
            }
            Starting::AlreadyHeld => {}
            // The next look starts over.
            Starting::Unheld(fence) | Starting::HandingBack(fence) => {
                self.release(fence, None).await;
                self.inner.working.wake();
            }
        }
    }

    /// Writes `inherited`, the fence of `name` as listed when this replica
    /// inherited it, as its own (see `heirs`). Should someone else have
    /// written it since, the work on it stops: the fence is not this
    /// replica's. A failure is tried again at the next look.
    pub(super) async fn rewrite(&self, name: &ClusterName, generation: u64, inherited: Lease) {
        let standing = self.inner.standing.borrow().clone();
        if standing.live().is_none() {
            return;
        }
        let held_with = standing.held_with();
        let options = &self.inner.options;
        let call = lease::inherit(
            &self.inner.leases,
            &self.inner.me.id,
            options.fence_lease_duration,
            &held_with,
            inherited,
        );
        let outcome = tokio::time::timeout(options.fence_renew_interval, call).await;
        let fence_name = self.fence_name(name);
        match outcome {
            Ok(Ok(written)) => {
                let delay = options.fence_retry_delay;
                let stopped = self.inner.working.inherited_written(
                    name,
                    generation,
                    &fence_name,
                    written,
                    delay,
                );
                if stopped {
                    tracing::warn!(cluster = %name, lease = %fence_name, "an inherited fence was written by another replica; stopped working on the cluster");
                }
            }
            Ok(Err(err)) => {
                tracing::debug!(cluster = %name, lease = %fence_name, error = %crate::kube_error(&err), "could not write an inherited fence as this replica's own; trying again");
            }
            Err(_) => {
                tracing::debug!(cluster = %name, lease = %fence_name, "no answer writing an inherited fence as this replica's own; trying again");
            }
        }
    }

    /// Clears `fence` (or hands it to `next`); one whose release failed is
    /// cleared again at the next look.
    pub(super) async fn release(&self, fence: fence::Fence, next: Option<&lease::Next>) {
        let timeout = self.inner.options.fence_renew_interval;
        if let Some(unreleased) = fence
            .release(&self.inner.leases, &self.inner.me.id, timeout, next)
            .await
        {
            self.inner.working.keep_unreleased(unreleased);
        }
    }

    /// Tries again to release the fences whose release failed, but not one
    /// this replica has taken again since (its cluster came back to it):
    /// clearing that would let another replica take a cluster worked on
    /// here. Only the balancing loop takes fences by a write, and this runs
    /// in it, so none is taken while this looks (a fence handed over is
    /// one another replica held, never one of these).
    pub(super) async fn release_again(&self) {
        for fence in self.inner.working.take_unreleased() {
            if !self.inner.working.holds(&fence.name) {
                self.release(fence, None).await;
            }
        }
    }

    pub(super) fn retry_later(&self, name: &ClusterName, generation: u64) {
        let delay = self.inner.options.fence_retry_delay;
        self.inner.working.retry_later(name, generation, delay);
    }

    /// A fence found held by another replica (which hands it over once it
    /// sees this one own the cluster, or which this one sees gone) is tried
    /// again after the retry delay, doubled with each busy attempt in a row
    /// up to the probe interval: a replica that joins a large fleet finds
    /// thousands of fences busy at once, and asking for each of them every
    /// retry delay would load the API server the releases go through.
    pub(super) fn retry_busy_later(&self, name: &ClusterName, generation: u64) {
        let options = &self.inner.options;
        let cap = options.probe_interval.max(options.fence_retry_delay);
        self.inner
            .working
            .retry_busy_later(name, generation, options.fence_retry_delay, cap);
    }

    /// When the next look is due: the probe interval, or sooner when a busy
    /// fence may be tried again.
    pub(super) fn next_look(&self) -> Instant {
        let probe = Instant::now() + self.inner.options.probe_interval;
        self.inner.working.next_retry(probe)
    }

    /// Stops all work and hands every fence back once it has stopped (as a
    /// hand-over does, within the hand-over timeout). Fences held with the
    /// peer Lease are not written one by one: the registry deletes the peer
    /// Lease right after, in a new epoch, which frees all of them with one
    /// request (or, should that fail, when the Lease lapses, as after a
    /// crash).
    pub(super) async fn release_all(&self) {
        let held: Vec<HandedBack> = self.inner.working.hand_back_all();
        let count = held.len();
        self.inner.inheritance.leave_behind(count);
        tracing::info!(clusters = count, peer = %self.inner.me.id, "shutting down: handing every cluster back");
        let with_peer = self.inner.options.fence_hold == FenceHold::WithPeer;
        let mut renewed = Vec::new();
        let mut settling = Vec::new();
        for (name, held, components) in held {
            held.work.cancel();
            tracing::debug!(cluster = %name, "shutting down: handing the cluster back");
            settling.extend(components.iter().map(|component| component.settled(&name)));
            if !with_peer {
                renewed.push(held.fence);
            }
        }
        let timeout = self.inner.options.handover_timeout;
        if tokio::time::timeout(timeout, futures::future::join_all(settling))
            .await
            .is_err()
        {
            tracing::warn!(
                ?timeout,
                "work still running; handing the clusters back anyway"
            );
        }
        let timeout = self.inner.options.fence_renew_interval;
        let unreleased = self.inner.working.take_unreleased();
        // What a release leaves unreleased is freed when the peer Lease goes.
        futures::stream::iter(renewed.into_iter().chain(unreleased))
            .for_each_concurrent(CONCURRENT_STEPS, |fence| async move {
                fence
                    .release(&self.inner.leases, &self.inner.me.id, timeout, None)
                    .await;
            })
            .await;
    }
}
