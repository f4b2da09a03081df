//! A request budget per member: at most so many requests a second, after a
//! burst, shared by every client and controller of that member (client-go's
//! `QPS` and `Burst`).
//!
//! Off by default ([`crate::ClientOptions::request_budget`]):
//! API servers protect themselves with API Priority and Fairness (on by
//! default since Kubernetes 1.20, GA in 1.29) and answer 429 with a
//! `Retry-After`, which these clients honour; and each cluster runs one
//! reconcile at a time by default, so a fleet controller's fan-out gives one
//! member one request at a time. A budget at client-go's defaults (5 a
//! second, bursts of 10) would slow every healthy member's reconciles to
//! protect servers that already protect themselves. Set one for members
//! whose API servers cannot (old, small, or shared with tenants you must not
//! crowd out).
//!
//! The budget is a generic cell rate (a token bucket without a timer): each
//! request reserves the next free moment at once, in the order requests
//! arrive, and waits for it outside any lock. A watch counts once, when it
//! starts; a request retried after a 429 counts once. Waiting for the budget
//! is not part of a request's deadline, so a busy member is not reported
//! unreachable for it.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::Request;
use kube::client::Body;
use tokio::time::Instant;

/// How many requests a member's clients may send: `qps` a second on
/// average, up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestBudget {
    /// Requests a second, on average (client-go's `QPS`).
    pub qps: f32,
    /// Requests that may go at once after a quiet spell (client-go's
    /// `Burst`).
    pub burst: u32,
}

impl RequestBudget {
    /// client-go's defaults: 5 a second, bursts of 10.
    pub const CLIENT_GO: RequestBudget = RequestBudget {
        qps: 5.0,
        burst: 10,
    };

    /// `qps` a second on average, up to `burst` at once.
    pub fn new(qps: f32, burst: u32) -> Self {
        Self { qps, burst }
    }

    /// Whether the numbers make a budget: a positive, finite rate and a
    /// burst of at least one.
    pub(crate) fn is_valid(&self) -> bool {
        self.qps.is_finite() && self.qps > 0.0 && self.burst >= 1
    }
}

/// One member's budget, shared by all its clients.
#[derive(Clone, Debug)]
pub(crate) struct Budget(Arc<Cells>);

#[derive(Debug)]
struct Cells {
    /// Time between two requests at the average rate.
    interval: Duration,
    /// How far ahead of now requests may have reserved: the burst.
    ahead: Duration,
    /// The moment the next request may go, if no burst were allowed.
    next: Mutex<Option<Instant>>,
}

impl Budget {
    pub(crate) fn new(budget: RequestBudget) -> Self {
        let interval = Duration::from_secs_f64(1.0 / f64::from(budget.qps));
        Self(Arc::new(Cells {
            interval,
            ahead: interval * budget.burst.saturating_sub(1),
            next: Mutex::new(None),
        }))
    }

    /// Reserves the next moment the budget allows; returns how long to wait
    /// for it.
    fn reserve(&self) -> Duration {
        let cells = &self.0;
        let now = Instant::now();
        let mut next = multicluster_core::lock(&cells.next);
        let start = next.map_or(now, |next| next.max(now));
        *next = Some(start + cells.interval);
        start.saturating_duration_since(now + cells.ahead)
    }
}

/// The layer of [`Budgeted`].
#[derive(Clone, Debug)]
pub(crate) struct BudgetLayer(pub(crate) Budget);

impl<S> tower::Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted {
            inner,
            budget: self.0.clone(),
        }
    }
}

/// Sends each request when the member's budget allows. The stack below
/// (kube-rs's layers over hyper's client) sends nothing until its future is
/// polled, so holding that future back for the wait holds the request back.
pub(crate) struct Budgeted<S> {
    inner: S,
    budget: Budget,
}

impl<S> tower::Service<Request<Body>> for Budgeted<S>
where
    S: tower::Service<Request<Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let wait = self.budget.reserve();
        let call = self.inner.call(request);
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            call.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_and_the_rest_at_the_rate() {
        let budget = Budget::new(RequestBudget::new(10.0, 3));
        let waits: Vec<Duration> = (0..6).map(|_| budget.reserve()).collect();
        let millis: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [0, 0, 0, 100, 200, 300]);
        // A quiet second refills the burst, no more.
        tokio::time::advance(Duration::from_secs(2)).await;
        let again: Vec<u128> = (0..4).map(|_| budget.reserve().as_millis()).collect();
        assert_eq!(again, [0, 0, 0, 100]);
    }

    #[test]
    fn only_a_positive_rate_and_burst_make_a_budget() {
        assert!(RequestBudget::CLIENT_GO.is_valid());
        for invalid in [
            RequestBudget::new(0.0, 10),
            RequestBudget::new(f32::NAN, 10),
            RequestBudget::new(5.0, 0),
        ] {
            assert!(!invalid.is_valid(), "{invalid:?}");
        }
    }
}
