//! A fence: the Lease that says which replica works on a cluster. Work
//! starts only once the fence is taken and stops the moment a renewal
//! fails, so two replicas never work on one cluster at once, whatever
//! their views of the peers.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::lease::{self, Taken};

/// How long a fence is held, how often it is renewed, and how long
/// renewals may keep failing before the hold ends.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) duration: Duration,
    pub(crate) renew: Duration,
    /// The hold ends once no renewal has succeeded for this long (counted
    /// from when the last good one was sent). `None`: at the first failed
    /// renewal.
    pub(crate) deadline: Option<Duration>,
}

impl Timing {
    /// How long one renewal may take. A renewal that fails or hangs ends
    /// the hold by `renew + call_timeout` after the last good one, which
    /// stays inside `duration`, when others may take the Lease.
    fn call_timeout(self) -> Duration {
        self.renew
            .min(self.duration.saturating_sub(self.renew) / 2)
            .max(Duration::from_millis(100))
    }

    /// Whether, after a failed renewal, another attempt could still end
    /// before the deadline; otherwise the hold ends now.
    fn may_try_again(self, since_last_good: Duration) -> bool {
        self.deadline
            .is_some_and(|deadline| since_last_good + self.renew + self.call_timeout() <= deadline)
    }
}

/// Where this replica stands with its peer Lease, for fences held with it.
#[cfg(feature = "sharding")]
#[derive(Clone, Debug)]
pub(crate) struct Standing {
    /// The peer Lease's name.
    pub(crate) peer_lease: String,
    /// The epoch it announces.
    pub(crate) epoch: String,
    /// While the peer Lease is surely live for the others in this epoch:
    /// the token fences held with it stop on, cancelled once that cannot be
    /// said (which ends the epoch). `None` before the first renewal and
    /// after the epoch ended.
    pub(crate) live: Option<CancellationToken>,
}

#[cfg(feature = "sharding")]
impl Standing {
    /// No standing yet (the peer Lease was never written) for `peer_lease`
    /// in `epoch`: no fence can be held with it until a renewal gives one.
    pub(crate) fn not_yet(peer_lease: String, epoch: String) -> Self {
        Self {
            peer_lease,
            epoch,
            live: None,
        }
    }

    /// What a fence held with it in its epoch says it is held with.
    pub(crate) fn held_with(&self) -> String {
        lease::held_with(&self.peer_lease, &self.epoch)
    }

    /// The token fences held with it stop on, while it is live.
    pub(crate) fn live(&self) -> Option<&CancellationToken> {
        self.live.as_ref().filter(|token| !token.is_cancelled())
    }
}

/// How an attempt to take a fence ended.
pub(crate) enum Attempt {
    /// This replica holds it.
    Taken(Fence),
    /// Another replica holds it (named when known).
    Busy(Option<String>),
    /// The API server failed or did not answer.
    Failed(String),
}

/// A fence this replica holds, renewed in the background until released
/// or lost.
pub(crate) struct Fence {
    pub(crate) name: String,
    lost: CancellationToken,
    stop: CancellationToken,
    /// Held with the peer Lease (not renewed itself).
    with_peer: bool,
    /// The Lease as this replica last wrote it, when nothing has written
    /// it since (a fence held with the peer Lease): a release writes over
    /// it without reading first.
    written: Option<Box<Lease>>,
    /// The hold in an ended epoch this take wrote over, found by reading
    /// (only takes held with the peer Lease find one).
    #[cfg_attr(not(feature = "sharding"), allow(dead_code))]
    took_over: Option<lease::EndedHold>,
}

/// A take of a fence held with this replica's peer Lease
/// ([`Fence::take_with_peer`]).
#[cfg(feature = "sharding")]
pub(crate) struct WithPeer<'a> {
    pub(crate) api: &'a Api<Lease>,
    /// The fence Lease's name.
    pub(crate) name: String,
    /// This replica's peer ID.
    pub(crate) me: &'a str,
    /// This replica's peer Lease and epoch, while they live.
    pub(crate) standing: &'a Standing,
    pub(crate) timing: Timing,
    /// What is known of the other peers without a read.
    pub(crate) known: lease::KnownPeers<'a>,
    /// What this replica knows of the fence already.
    pub(crate) prior: lease::Prior,
}

impl Fence {
    /// Tries to take the Lease `name` for `me`. When a later renewal fails,
    /// [`Fence::lost`] fires and `on_lost` is notified.
    pub(crate) async fn take(
        api: &Api<Lease>,
        name: String,
        me: &str,
        timing: Timing,
        on_lost: Arc<Notify>,
    ) -> Attempt {
        let taking = lease::Taking {
            api,
            name: &name,
            me,
            duration: timing.duration,
            held_with: None,
        };
        let call = lease::take(&taking, &lease::NothingKnown, None);
        let written = match tokio::time::timeout(timing.call_timeout(), call).await {
            Err(_) => return Attempt::Failed("no answer from the API server".to_string()),
            Ok(Err(err)) => return Attempt::Failed(crate::kube_error(&err)),
            Ok(Ok(Taken::HeldBy(holder))) => return Attempt::Busy(holder),
            Ok(Ok(Taken::Yes(written))) => written,
        };
        // The renewals write over the Lease from here on (the first over
        // what the take wrote), so a release reads it.
        let fence = Self {
            name,
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            with_peer: false,
            written: None,
            took_over: None,
        };
        let renewal = Renewal {
            api: api.clone(),
            name: fence.name.clone(),
            me: me.to_string(),
            timing,
            written: Some(*written),
        };
        tokio::spawn(renewal.run(fence.lost.clone(), fence.stop.clone(), on_lost));
        Attempt::Taken(fence)
    }

    #[cfg(feature = "sharding")]
    /// Tries to take the Lease `name` for `me` for as long as `me`'s peer
    /// Lease lives in the epoch of `standing`: nothing renews the fence, and
    /// the hold ends when `standing`'s token does (this replica can no
    /// longer be sure its peer Lease is live for the others). Whether
    /// another holder's peer Lease holds is asked of `known` first; `prior`
    /// is what this replica knows of the fence already.
    pub(crate) async fn take_with_peer(take: WithPeer<'_>) -> Attempt {
        let WithPeer {
            api,
            name,
            me,
            standing,
            timing,
            known,
            prior,
        } = take;
        let Some(lost) = standing.live().cloned() else {
            return Attempt::Failed("this replica's peer Lease is not renewed".to_string());
        };
        let held_with = standing.held_with();
        let taking = lease::Taking {
            api,
            name: &name,
            me,
            duration: timing.duration,
            held_with: Some(&held_with),
        };
        let call = lease::take_guessing(&taking, known, prior);
        match tokio::time::timeout(timing.call_timeout(), call).await {
            Err(_) => Attempt::Failed("no answer from the API server".to_string()),
            Ok(Err(err)) => Attempt::Failed(crate::kube_error(&err)),
            Ok(Ok((Taken::HeldBy(holder), _))) => Attempt::Busy(holder),
            Ok(Ok((Taken::Yes(written), took_over))) => Attempt::Taken(Self {
                name,
                lost,
                stop: CancellationToken::new(),
                with_peer: true,
                written: Some(written),
                took_over,
            }),
        }
    }

    /// A fence handed to this replica in its epoch (`lease`, as its last
    /// holder wrote it), held until `standing` ends: nothing to write.
    #[cfg(feature = "sharding")]
    pub(crate) fn handed(name: String, standing: &CancellationToken, lease: Lease) -> Self {
        Self {
            name,
            lost: standing.clone(),
            stop: CancellationToken::new(),
            with_peer: true,
            written: Some(Box::new(lease)),
            took_over: None,
        }
    }

    /// A fence held with the peer Lease, as taking it would give, for tests
    /// of what holds fences.
    #[cfg(all(test, feature = "sharding"))]
    pub(crate) fn held_with_peer(name: &str, standing: &CancellationToken) -> Self {
        Self {
            name: name.to_string(),
            lost: standing.clone(),
            stop: CancellationToken::new(),
            with_peer: true,
            written: None,
            took_over: None,
        }
    }

    /// The fence as this replica last wrote it (or as it was handed or
    /// inherited), if known.
    #[cfg(feature = "sharding")]
    pub(crate) fn written(&self) -> Option<&Lease> {
        self.written.as_deref()
    }

    /// Remembers `lease` as what this replica last wrote to the fence.
    #[cfg(feature = "sharding")]
    pub(crate) fn set_written(&mut self, lease: Lease) {
        self.written = Some(Box::new(lease));
    }

    /// What this replica last wrote to the fence, if known (a fence held
    /// with the peer Lease), for taking it again later without a read.
    #[cfg(feature = "sharding")]
    pub(crate) fn take_written(&mut self) -> Option<Lease> {
        self.written.take().map(|lease| *lease)
    }

    /// The hold in an ended epoch that taking this fence wrote over, if
    /// the take found one by reading.
    #[cfg(feature = "sharding")]
    pub(crate) fn take_over_found(&mut self) -> Option<lease::EndedHold> {
        self.took_over.take()
    }

    /// Fires when a renewal failed: the hold is over.
    pub(crate) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Stops renewing and clears the holder if it is still `me` (or, with
    /// `next`, hands it straight to that replica). A fence
    /// that is renewed lapses on its own when that fails; one held with the
    /// peer Lease does not while this replica's epoch lasts, so it comes
    /// back to be released again later. A fence whose epoch has ended needs
    /// nothing: the new epoch freed it.
    pub(crate) async fn release(
        mut self,
        api: &Api<Lease>,
        me: &str,
        timeout: Duration,
        next: Option<&lease::Next>,
    ) -> Option<Fence> {
        self.stop.cancel();
        if self.with_peer && self.lost.is_cancelled() {
            return None;
        }
        let last = self.written.take().map(|lease| *lease);
        let call = lease::release(api, &self.name, me, last, next);
        let failure = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(())) => {
                tracing::debug!(lease = %self.name, "fence released");
                return None;
            }
            Ok(Err(err)) => crate::kube_error(&err),
            Err(_) => "no answer from the API server".to_string(),
        };
        if self.with_peer {
            tracing::warn!(lease = %self.name, reason = %failure, "could not release the fence; trying again");
            Some(self)
        } else {
            tracing::warn!(lease = %self.name, reason = %failure, "could not release the fence; it lapses on its own");
            None
        }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // A fence let go of without `release` stops renewing and lapses.
        self.stop.cancel();
    }
}

/// A renewed fence's renewals: the Lease, its holder, its timing, and the
/// Lease as last written.
struct Renewal {
    api: Api<Lease>,
    name: String,
    me: String,
    timing: Timing,
    written: Option<Lease>,
}

impl Renewal {
    /// Renews every renew interval until `stop`; when the hold ends,
    /// cancels `lost` and notifies `on_lost`.
    async fn run(mut self, lost: CancellationToken, stop: CancellationToken, on_lost: Arc<Notify>) {
        let (timing, name) = (self.timing, self.name.clone());
        let mut last_good = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(timing.renew) => {}
            }
            let sent = tokio::time::Instant::now();
            let call = lease::renew(
                &self.api,
                &self.name,
                &self.me,
                timing.duration,
                &mut self.written,
            );
            let failure = tokio::select! {
                () = stop.cancelled() => return,
                result = tokio::time::timeout(timing.call_timeout(), call) => match result {
                    Ok(Ok(true)) => {
                        last_good = sent;
                        continue;
                    }
                    // Taken by another: trying again cannot help.
                    Ok(Ok(false)) => "another replica holds it".to_string(),
                    Ok(Err(err)) if timing.may_try_again(last_good.elapsed()) => {
                        tracing::debug!(lease = %name, error = %crate::kube_error(&err), "renewal failed; trying again");
                        continue;
                    }
                    Err(_) if timing.may_try_again(last_good.elapsed()) => {
                        tracing::debug!(lease = %name, "no answer renewing; trying again");
                        continue;
                    }
                    Ok(Err(err)) => crate::kube_error(&err),
                    Err(_) => "no answer from the API server".to_string(),
                },
            };
            tracing::warn!(lease = %name, reason = %failure, "fence not renewed; stopping work on its cluster");
            lost.cancel();
            on_lost.notify_one();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewed_fence_writes_over_what_its_take_wrote_without_reading() {
        use kube::api::ListParams;
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let timing = Timing {
            duration: Duration::from_secs(4),
            renew: Duration::from_secs(1),
            deadline: None,
        };
        let Attempt::Taken(fence) = Fence::take(
            &api,
            "fence".to_string(),
            "me",
            timing,
            Arc::new(Notify::new()),
        )
        .await
        else {
            panic!("not taken");
        };
        let renewed = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone());
        // Read by LIST, which the count of reads (GET) leaves out.
        let read = || async {
            api.list(&ListParams::default())
                .await
                .expect("list")
                .items
                .into_iter()
                .find(|lease| lease.metadata.name.as_deref() == Some("fence"))
                .expect("the fence")
        };
        let taken = renewed(&read().await);
        let before = lease::tests::lease_reads(&client).await;
        // Polled: the renewal shows only on the API server.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while renewed(&read().await) == taken {
            assert!(tokio::time::Instant::now() < deadline, "never renewed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            lease::tests::lease_reads(&client).await,
            before,
            "the first renewal read the Lease"
        );
        assert!(!fence.lost().is_cancelled());
        drop(fence);
    }

    #[test]
    fn a_hung_renewal_gives_up_before_the_lease_can_lapse() {
        for (duration, renew) in [(20, 10), (4, 1), (30, 29), (2, 1)] {
            let timing = Timing {
                duration: Duration::from_secs(duration),
                renew: Duration::from_secs(renew),
                deadline: None,
            };
            let given_up = timing.renew + timing.call_timeout();
            assert!(
                given_up <= timing.duration,
                "{duration}s/{renew}s: gives up after {given_up:?}"
            );
            assert!(!timing.may_try_again(Duration::ZERO));
        }
    }

    #[test]
    fn failed_renewals_are_retried_only_while_the_deadline_allows() {
        let timing = Timing {
            duration: Duration::from_secs(15),
            renew: Duration::from_secs(2),
            deadline: Some(Duration::from_secs(10)),
        };
        // Each attempt ends at most renew + call timeout (2 s + 2 s) later.
        assert!(timing.may_try_again(Duration::from_secs(4)));
        assert!(timing.may_try_again(Duration::from_secs(6)));
        assert!(!timing.may_try_again(Duration::from_millis(6001)));
        // So the hold ends by the deadline, inside the Lease's duration.
        let mut since = Duration::ZERO;
        while timing.may_try_again(since) {
            since += timing.renew + timing.call_timeout();
        }
        assert!(since <= timing.deadline.expect("deadline"));
        assert!(since < timing.duration);
    }
}
