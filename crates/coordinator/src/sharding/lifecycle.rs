//! Where a replica is in its life: one channel of phases, read by the
//! looks, the peer registry, the hand-over and the inheritance, instead of
//! one token per milestone.
//!
//! ```text
//! Joining ─▶ Ready ─▶ Leaving ─▶ SaidLeaving ─▶ HandedOver ─▶ Stopping ─▶ Stopped
//!    └──────────┴─────────┴───────────┴─────────────────────────▲
//!                                  (stopped without handing over)
//! ```
//!
//! A phase once reached is never left for an earlier one; phases may be
//! skipped (a replica stopped before its provider engaged the inventory,
//! or whose fences are not held with its peer Lease and so never hands
//! over). Each reader asks "has this replica reached X", which stays true.

use tokio::sync::watch;

/// A replica's phase, in the order it goes through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Its provider has not engaged the inventory it first found (nor has
    /// `inventory_wait` passed): its peer Lease says it is not ready to be
    /// handed clusters.
    Joining,
    /// Ready: the others hand it the clusters it owns.
    Ready,
    /// Asked to leave: its next renewal says so.
    Leaving,
    /// Its peer Lease says it leaves: each look hands its clusters to
    /// their next owners, and it is nobody's heir.
    SaidLeaving,
    /// A look of the leaving replica found nothing more to hand over.
    HandedOver,
    /// The looks have ended: what it still holds is handed back, and a
    /// fence handed to it from now on is not taken up (it goes with the
    /// peer Lease).
    Stopping,
    /// The coordinator's `run` returned (or was dropped): nothing hands
    /// clusters over any more.
    Stopped,
}

/// The phase of this replica, shared by everything that reads or moves it.
#[derive(Clone, Debug)]
pub(crate) struct Lifecycle {
    phase: watch::Sender<Phase>,
    /// Whether this replica hands its clusters over when it leaves (fences
    /// held with the peer Lease, a hand-over time): only then does its
    /// peer Lease say it leaves.
    hands_over: bool,
}

impl Lifecycle {
    /// A replica that has just started, joining.
    pub(crate) fn new(hands_over: bool) -> Self {
        Self {
            phase: watch::Sender::new(Phase::Joining),
            hands_over,
        }
    }

    /// Moves on to `to`, unless this replica is there or beyond already.
    /// Returns whether it moved.
    pub(crate) fn advance(&self, to: Phase) -> bool {
        self.phase.send_if_modified(|now| {
            let moves = *now < to;
            if moves {
                tracing::debug!(from = ?*now, to = ?to, "sharding phase");
                *now = to;
            }
            moves
        })
    }

    /// The phase now.
    pub(crate) fn now(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Whether this replica has reached `phase` (or gone beyond).
    pub(crate) fn reached(&self, phase: Phase) -> bool {
        self.now() >= phase
    }

    /// Waits until this replica has reached `phase`.
    pub(crate) async fn until(&self, phase: Phase) {
        self.until_that(|now| now >= phase).await;
    }

    /// Waits until the phase is one `that` accepts.
    pub(crate) async fn until_that(&self, that: impl Fn(Phase) -> bool) {
        // The sender lives as long as `self`: waiting cannot fail.
        let _ = self.phase.subscribe().wait_for(|now| that(*now)).await;
    }

    /// What the peer Lease says of this replica in `phase`, after it said
    /// `before`: whether it is ready, and whether it leaves. A replica that
    /// stops before its Lease ever said it was ready (phases may be
    /// skipped) does not say so on its way out.
    pub(crate) fn lease_says(&self, phase: Phase, before: LeaseSays) -> LeaseSays {
        LeaseSays {
            ready: phase >= Phase::Ready && (phase < Phase::Stopping || before.ready),
            leaving: self.hands_over && phase >= Phase::Leaving,
        }
    }

    /// Whether this replica may be named an heir: ready, and neither
    /// leaving nor stopping.
    pub(crate) fn may_inherit(&self) -> bool {
        self.now() == Phase::Ready
    }

    /// Moves on to [`Phase::Stopped`] when the returned guard is dropped,
    /// however `run` ends.
    pub(crate) fn stops_on_drop(&self) -> StopsOnDrop {
        StopsOnDrop(self.clone())
    }
}

/// What a peer Lease says of its replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeaseSays {
    /// Ready to be handed clusters.
    pub(crate) ready: bool,
    /// Leaving: the others no longer count it as an owner.
    pub(crate) leaving: bool,
}

/// See [`Lifecycle::stops_on_drop`].
pub(crate) struct StopsOnDrop(Lifecycle);

impl Drop for StopsOnDrop {
    fn drop(&mut self) {
        self.0.advance(Phase::Stopped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_once_reached_is_never_left_for_an_earlier_one() {
        let lifecycle = Lifecycle::new(true);
        assert!(lifecycle.advance(Phase::Ready));
        assert!(lifecycle.advance(Phase::Stopping));
        assert!(!lifecycle.advance(Phase::SaidLeaving));
        assert_eq!(lifecycle.now(), Phase::Stopping);
        assert!(lifecycle.reached(Phase::HandedOver));
        drop(lifecycle.stops_on_drop());
        assert_eq!(lifecycle.now(), Phase::Stopped);
    }

    #[test]
    fn only_a_replica_that_hands_over_says_it_leaves() {
        let handing = Lifecycle::new(true);
        let not = Lifecycle::new(false);
        for lifecycle in [&handing, &not] {
            assert_eq!(
                lifecycle.lease_says(Phase::Joining, LeaseSays::default()),
                LeaseSays {
                    ready: false,
                    leaving: false
                }
            );
        }
        let ready = LeaseSays {
            ready: true,
            leaving: false,
        };
        assert!(handing.lease_says(Phase::Leaving, ready).leaving);
        assert!(!not.lease_says(Phase::Stopping, ready).leaving);
        assert!(not.lease_says(Phase::Stopping, ready).ready);
    }

    #[test]
    fn a_replica_stopped_before_it_said_it_was_ready_never_says_so() {
        let lifecycle = Lifecycle::new(true);
        let joining = lifecycle.lease_says(Phase::Joining, LeaseSays::default());
        let stopping = lifecycle.lease_says(Phase::Stopping, joining);
        assert!(!stopping.ready);
        assert!(stopping.leaving, "it still says it leaves");
    }

    #[tokio::test]
    async fn waiting_for_a_phase_ends_when_a_later_one_is_reached() {
        let lifecycle = Lifecycle::new(true);
        let waiting = tokio::spawn({
            let lifecycle = lifecycle.clone();
            async move { lifecycle.until(Phase::HandedOver).await }
        });
        lifecycle.advance(Phase::Stopped);
        waiting.await.expect("waited");
    }

    #[test]
    fn only_a_ready_replica_that_is_not_leaving_may_inherit() {
        let lifecycle = Lifecycle::new(true);
        assert!(!lifecycle.may_inherit());
        lifecycle.advance(Phase::Ready);
        assert!(lifecycle.may_inherit());
        lifecycle.advance(Phase::Leaving);
        assert!(!lifecycle.may_inherit());
    }
}
