//! How a cluster is doing, as the requests of its client and the watches of
//! its cache see it: the truth behind a cluster's state on `/clusters`.
//!
//! - A watch that keeps failing with an answer from the server (403 after
//!   lost RBAC, say) makes the cluster [`Health::Degraded`]: the server is
//!   there, but part of the work cannot be done.
//! - A watch or a request that cannot reach the server (connection refused
//!   or reset, TLS failure, no answer within the request deadline) makes it
//!   [`Health::Unreachable`].
//! - Both clear by themselves: a request's next answer; a watch's next
//!   event, or the end of its errors (a watch that starts again quietly
//!   reports nothing, so one whose retries, at most a few seconds apart,
//!   stop failing counts as working again).
//!
//! Reasons are built from redacted error text ([`crate::redact`]): they can
//! be logged and served.
//!
//! Requests are watched by a layer that clients built from kubeconfigs
//! carry ([`crate::provider::kubeconfig::ClientOptions`]); it also gives every request
//! that is not long-running (watches, log follows, exec sessions are) a
//! deadline. Clusters with clients of their own are judged by their watches.

use std::error::Error as StdError;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::client::Body;
use tokio::time::Instant;

use crate::redact::Redacted;
use crate::sync::lock;

/// How a cluster is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Its watches and requests work.
    Healthy,
    /// The server answers, but some of its watches fail (the reason says
    /// why, e.g. `403 Forbidden`).
    Degraded(Redacted),
    /// The server cannot be reached or does not answer in time.
    Unreachable(Redacted),
}

/// A failure that lasts: what went wrong, since when, and whether it means
/// the server cannot be reached.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub(crate) reason: Redacted,
    pub(crate) unreachable: bool,
    /// When the first error of this failure was seen.
    pub(crate) since: Instant,
    /// When the latest was.
    pub(crate) last: Instant,
}

impl Failure {
    /// `reason` as a failure starting now, or continuing `before` if that
    /// was already failing (a failure's age is that of the first error).
    pub(crate) fn continuing(
        before: Option<&Failure>,
        reason: Redacted,
        unreachable: bool,
    ) -> Self {
        let now = Instant::now();
        Self {
            reason,
            unreachable,
            since: before.map_or(now, |before| before.since),
            last: now,
        }
    }

    pub(crate) fn health(&self) -> Health {
        if self.unreachable {
            Health::Unreachable(self.reason.clone())
        } else {
            Health::Degraded(self.reason.clone())
        }
    }
}

/// Whether an error means the server could not be reached or did not
/// answer (rather than answered with an error).
pub(crate) fn is_unreachable(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = current {
        if err.is::<RequestTimedOut>() {
            return true;
        }
        if let Some(kube_error) = err.downcast_ref::<kube::Error>() {
            match kube_error {
                kube::Error::Api(_) | kube::Error::Auth(_) => return false,
                kube::Error::HyperError(_) => return true,
                _ => {}
            }
        }
        if err.is::<kube::client::AuthError>() {
            return false;
        }
        if err.is::<hyper::Error>()
            || err.is::<hyper_util::client::legacy::Error>()
            || err.is::<std::io::Error>()
        {
            return true;
        }
        current = err.source();
    }
    false
}

/// A request that is not long-running got no answer within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct RequestTimedOut(pub Duration);

/// How the requests of one client have ended lately: the failure since the
/// last answer, if any. Shared by the client's layer and its cluster.
#[derive(Clone, Debug, Default)]
pub(crate) struct Requests(Arc<RequestOutcomes>);

#[derive(Debug, Default)]
struct RequestOutcomes {
    failure: Mutex<Option<Failure>>,
    /// Whether `failure` is set: the manager asks every cluster every
    /// second, and a healthy one (nearly all of them) answers without a
    /// lock.
    failing: FailingFlag,
}

impl Requests {
    pub(crate) fn failure(&self) -> Option<Failure> {
        if !self.0.failing.get() {
            return None;
        }
        lock(&self.0.failure).clone()
    }

    fn answered(&self) {
        if !self.0.failing.get() {
            return;
        }
        let mut failure = lock(&self.0.failure);
        *failure = None;
        self.0.failing.set(false);
    }

    fn failed(&self, reason: Redacted) {
        let mut failure = lock(&self.0.failure);
        *failure = Some(Failure::continuing(failure.as_ref(), reason, true));
        self.0.failing.set(true);
    }
}

/// Whether something is failing, readable without the lock that guards the
/// failure itself. Written under that lock; a reader that races a write
/// sees the change at its next look.
#[derive(Debug, Default)]
pub(crate) struct FailingFlag(std::sync::atomic::AtomicBool);

/// How many times any flag in this process has changed: a walk over every
/// cluster that found them all well need not be repeated until it moves.
static FLAG_CHANGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl FailingFlag {
    pub(crate) fn get(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn set(&self, failing: bool) {
        if self.0.swap(failing, std::sync::atomic::Ordering::AcqRel) != failing {
            FLAG_CHANGES.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// A number that moves whenever a request or watch of any cluster starts or
/// stops failing.
pub(crate) fn failure_changes() -> u64 {
    FLAG_CHANGES.load(std::sync::atomic::Ordering::Acquire)
}

/// Whether a request runs for as long as its caller wants: a watch, a
/// followed log, an exec, attach or port-forward session. Those get no
/// deadline (a watch has its own, on the server).
fn is_long_running<B>(request: &Request<B>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    let long_query = query
        .split('&')
        .any(|pair| matches!(pair, "watch=true" | "watch=1" | "follow=true" | "follow=1"));
    let path = request.uri().path();
    long_query
        || request.headers().contains_key(http::header::UPGRADE)
        || ["/exec", "/attach", "/portforward", "/proxy"]
            .iter()
            .any(|end| path.ends_with(end) || path.contains(&format!("{end}/")))
}

/// The layer of [`Bounded`].
#[derive(Clone, Debug)]
pub(crate) struct BoundedLayer {
    pub(crate) timeout: Option<Duration>,
    pub(crate) requests: Requests,
}

impl<S> tower::Layer<S> for BoundedLayer {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Bounded<S> {
        Bounded {
            inner,
            timeout: self.timeout,
            requests: self.requests.clone(),
        }
    }
}

/// Gives each request that is not long-running a deadline, and records
/// whether requests are answered.
pub(crate) struct Bounded<S> {
    inner: S,
    timeout: Option<Duration>,
    requests: Requests,
}

type BoxError = Box<dyn StdError + Send + Sync>;

impl<S, B> tower::Service<Request<Body>> for Bounded<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let deadline = self.timeout.filter(|_| !is_long_running(&request));
        let call = self.inner.call(request);
        let requests = self.requests.clone();
        Box::pin(async move {
            let result = match deadline {
                Some(after) => match tokio::time::timeout(after, call).await {
                    Ok(result) => result.map_err(Into::into),
                    Err(_) => Err(Box::new(RequestTimedOut(after)) as BoxError),
                },
                None => call.await.map_err(Into::into),
            };
            match &result {
                Ok(_) => requests.answered(),
                Err(err) if is_unreachable(err.as_ref()) => {
                    requests.failed(Redacted::error(err.as_ref()));
                }
                Err(_) => {}
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str) -> Request<()> {
        Request::get(uri).body(()).expect("request")
    }

    #[test]
    fn watches_follows_and_sessions_are_long_running() {
        for uri in [
            "/api/v1/configmaps?watch=true&timeoutSeconds=290",
            "/api/v1/namespaces/a/pods/p/log?follow=true",
            "/api/v1/namespaces/a/pods/p/exec?command=sh",
            "/api/v1/namespaces/a/pods/p/portforward?ports=80",
            "/api/v1/namespaces/a/services/s/proxy/metrics",
        ] {
            assert!(is_long_running(&request(uri)), "{uri}");
        }
        for uri in [
            "/version",
            "/api/v1/namespaces/a/configmaps?limit=500",
            "/api/v1/namespaces/a/configmaps/watch-list",
            "/apis/apps/v1/namespaces/a/deployments/exec-thing",
        ] {
            assert!(!is_long_running(&request(uri)), "{uri}");
        }
    }

    #[test]
    fn timeouts_and_transport_errors_mean_unreachable_answers_do_not() {
        assert!(is_unreachable(&RequestTimedOut(Duration::from_secs(1))));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(is_unreachable(&refused));
        let forbidden = kube::Error::Api(Box::new(kube::core::Status::failure(
            "forbidden",
            "Forbidden",
        )));
        assert!(!is_unreachable(&forbidden));
        let plugin = kube::Error::Auth(kube::client::AuthError::AuthExec("failed".into()));
        assert!(!is_unreachable(&plugin));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_keeps_its_start_until_an_answer_clears_it() {
        let requests = Requests::default();
        requests.failed(Redacted::ours("no answer within 1s"));
        let first = requests.failure().expect("failing").since;
        tokio::time::advance(Duration::from_secs(5)).await;
        requests.failed(Redacted::ours("connection refused"));
        let failure = requests.failure().expect("failing");
        assert_eq!(failure.since, first);
        assert_eq!(failure.reason.as_str(), "connection refused");
        requests.answered();
        assert!(requests.failure().is_none());
    }
}
