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

/// How long a fence is held and how often it is renewed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) duration: Duration,
    pub(crate) renew: Duration,
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
        let call = lease::take(api, &name, me, timing.duration);
        match tokio::time::timeout(timing.call_timeout(), call).await {
            Err(_) => return Attempt::Failed("no answer from the API server".to_string()),
            Ok(Err(err)) => return Attempt::Failed(crate::redact::kube_error(&err)),
            Ok(Ok(Taken::HeldBy(holder))) => return Attempt::Busy(holder),
            Ok(Ok(Taken::Yes)) => {}
        }
        let fence = Self {
            name,
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
        };
        tokio::spawn(renew(
            api.clone(),
            fence.name.clone(),
            me.to_string(),
            timing,
            fence.lost.clone(),
            fence.stop.clone(),
            on_lost,
        ));
        Attempt::Taken(fence)
    }

    /// Fires when a renewal failed: the hold is over.
    pub(crate) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Stops renewing and clears the holder if it is still `me` (best
    /// effort: otherwise the Lease lapses on its own).
    pub(crate) async fn release(self, api: &Api<Lease>, me: &str, timeout: Duration) {
        self.stop.cancel();
        let call = lease::release(api, &self.name, me);
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(())) => tracing::debug!(lease = %self.name, "fence released"),
            Ok(Err(err)) => {
                tracing::warn!(lease = %self.name, error = %crate::redact::kube_error(&err), "could not release the fence; it lapses on its own")
            }
            Err(_) => {
                tracing::warn!(lease = %self.name, "no answer releasing the fence; it lapses on its own")
            }
        }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // A fence let go of without `release` stops renewing and lapses.
        self.stop.cancel();
    }
}

async fn renew(
    api: Api<Lease>,
    name: String,
    me: String,
    timing: Timing,
    lost: CancellationToken,
    stop: CancellationToken,
    on_lost: Arc<Notify>,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(timing.renew) => {}
        }
        let call = lease::renew(&api, &name, &me, timing.duration);
        let failure = tokio::select! {
            () = stop.cancelled() => return,
            result = tokio::time::timeout(timing.call_timeout(), call) => match result {
                Ok(Ok(true)) => continue,
                Ok(Ok(false)) => "another replica holds it".to_string(),
                Ok(Err(err)) => crate::redact::kube_error(&err),
                Err(_) => "no answer from the API server".to_string(),
            },
        };
        tracing::warn!(lease = %name, reason = %failure, "fence not renewed; stopping work on its cluster");
        lost.cancel();
        on_lost.notify_one();
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_renewal_gives_up_before_the_lease_can_lapse() {
        for (duration, renew) in [(20, 10), (4, 1), (30, 29), (2, 1)] {
            let timing = Timing {
                duration: Duration::from_secs(duration),
                renew: Duration::from_secs(renew),
            };
            let given_up = timing.renew + timing.call_timeout();
            assert!(
                given_up <= timing.duration,
                "{duration}s/{renew}s: gives up after {given_up:?}"
            );
        }
    }
}
