//! The steps of a sharded replica's `run`, named: readiness at the latest
//! after the inventory wait, the peer registry, the fences it follows, and
//! the looks.

use tokio_util::sync::{CancellationToken, DropGuard};

use super::lifecycle::Phase;
use super::{FenceHold, MIRROR_UNSETTLED, ShardedCoordinator, handover, peers};
use crate::lease_name;

impl ShardedCoordinator {
    /// Until its provider has engaged the inventory, this replica's peer
    /// Lease says it is not ready, and the others keep the clusters it owns
    /// (a restarted replica was handed thousands it could not work on yet,
    /// at 100,000 clusters for a minute); after `inventory_wait` it says it
    /// is ready anyway. Stops waiting when the guard is dropped.
    pub(super) fn ready_after_the_inventory_wait(&self, stop: &CancellationToken) -> DropGuard {
        let lifecycle = self.inner.lifecycle.clone();
        let wait = self.inner.options.inventory_wait;
        let waiting = stop.child_token();
        let guard = waiting.clone().drop_guard();
        tokio::spawn(async move {
            tokio::select! {
                () = waiting.cancelled() => {}
                () = lifecycle.until(Phase::Ready) => {}
                () = tokio::time::sleep(wait) => {
                    tracing::info!(?wait, "the provider has not said its inventory is engaged; this replica says it is ready anyway");
                    lifecycle.advance(Phase::Ready);
                }
            }
        });
        guard
    }

    /// The registry that keeps this replica's peer Lease and reads the
    /// others' into its view.
    pub(super) fn registry(&self) -> peers::Registry {
        let options = &self.inner.options;
        peers::Registry {
            api: self.inner.leases.clone(),
            prefix: options.peer_prefix.clone(),
            lease_name: lease_name(&options.peer_prefix, &self.inner.me.id),
            me: self.inner.me.clone(),
            duration: options.peer_lease_duration,
            renew: options.peer_renew_interval,
            view: self.inner.view.clone(),
            known: CancellationToken::new(),
            standing: self.inner.standing.clone(),
            wake: self.inner.working.waker(),
            lifecycle: self.inner.lifecycle.clone(),
            with_heirs: options.fence_hold == FenceHold::WithPeer,
            left_behind: self.inner.inheritance.left_behind(),
            heirs_news: self.inner.inheritance.news(),
            stood_since: std::sync::Mutex::default(),
            written: std::sync::Mutex::default(),
        }
    }

    /// With fences held with the peer Lease: follows the fences handed to
    /// this replica, what it inherits, and (once its share settled) every
    /// fence of the namespace, until the guard is dropped.
    pub(super) fn follow_fences(&self) -> DropGuard {
        let watching = CancellationToken::new();
        let guard = watching.clone().drop_guard();
        if self.inner.options.fence_hold != FenceHold::WithPeer {
            return guard;
        }
        let handed = handover::watch(self.clone(), self.inner.standing.subscribe());
        let inheriting = self.clone().keep_inheriting();
        let (mirror, api) = (
            self.inner.inheritance.mirror().clone(),
            self.inner.leases.clone(),
        );
        let (lifecycle, settled) = (self.inner.lifecycle.clone(), self.inner.working.settled());
        // Only ready replicas are named heirs, and until the mirror has
        // listed an heir lists instead. Following every fence while the
        // fleet's fences are written (a cold start: 100,000 writes, each
        // sent to every replica) made the start at 100,000 clusters a
        // quarter slower on the benchmark machine. A share that never
        // settles (a fence busy for good) waits a while, not for ever.
        let mirroring = async move {
            lifecycle.until(Phase::Ready).await;
            tokio::select! {
                () = settled.cancelled() => {}
                () = tokio::time::sleep(MIRROR_UNSETTLED) => {}
            }
            mirror.follow(api).await;
        };
        let tasks: [futures::future::BoxFuture<'static, ()>; 3] =
            [Box::pin(handed), Box::pin(inheriting), Box::pin(mirroring)];
        for task in tasks {
            let watching = watching.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = watching.cancelled() => {}
                    () = task => {}
                }
            });
        }
        guard
    }

    /// Looks at the fleet until `stop`: at once when woken (a fence lost
    /// or handed, a cluster come or gone) or the peers change, else when
    /// the next look is due. Waits for the first read of the peers
    /// (`known`): until the others are known this replica would own every
    /// cluster, and claiming them all only to hand most back is churn.
    /// While leaving, looks again at once until a whole look found nothing
    /// more to hand over.
    pub(super) async fn look_until(&self, stop: &CancellationToken, known: &CancellationToken) {
        let mut peers = self.inner.view.follow();
        tokio::select! {
            () = stop.cancelled() => {}
            () = known.cancelled() => {}
        }
        while !stop.is_cancelled() {
            let handed = self.balance(stop).await;
            if self.inner.lifecycle.reached(Phase::SaidLeaving) {
                if handed != Some(0) {
                    continue;
                }
                self.inner.lifecycle.advance(Phase::HandedOver);
            }
            let next = self.next_look();
            tokio::select! {
                () = stop.cancelled() => break,
                () = self.inner.working.woken() => {}
                _ = peers.changed() => {}
                () = tokio::time::sleep_until(next) => {}
            }
        }
    }
}
