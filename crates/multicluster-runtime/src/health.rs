//! How a cluster is doing, as the requests of its client and the watches of
//! its cache see it: the truth behind a cluster's state on `/clusters`.
//!
//! - A watch that the server refuses (403 after lost RBAC, 404 for a CRD
//!   that is not installed) makes the cluster [`Health::Degraded`] from its
//!   first refusal until the watch delivers again: the server is there, but
//!   part of the work cannot be done. Every failed watch starts over with a
//!   list, so its return always shows (see the cache's retry notes).
//! - A request the server refuses (403) makes it degraded too, until a
//!   request of the same verb, resource and namespace succeeds, or
//!   [`REFUSAL_MEMORY`] (5 min) after the last refusal if none is tried.
//! - A credential that does not work (a 401, a credential plugin that
//!   fails) makes it degraded until any request succeeds.
//! - A watch or a request that cannot reach the server (connection refused
//!   or reset, TLS failure, no answer within the request deadline) makes it
//!   [`Health::Unreachable`] until the server answers again.
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
    /// The server answers, but refuses some watches or requests, or the
    /// credential does not work (the reason says which, e.g. `403
    /// Forbidden: cannot patch configmaps in namespace "default"`).
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

/// How long a refused request counts against its cluster when no request
/// of the same kind is made again: a reconciler that gave up, or backs off
/// for long, leaves its last refusal on the record this long.
pub const REFUSAL_MEMORY: Duration = Duration::from_secs(300);

/// How the requests of one client have ended lately. Shared by the
/// client's layers and its cluster.
#[derive(Clone, Debug, Default)]
pub(crate) struct Requests(Arc<RequestOutcomes>);

#[derive(Debug, Default)]
struct RequestOutcomes {
    failures: Mutex<RequestFailures>,
    /// Whether `failures` holds anything: the manager asks every cluster
    /// every second, and a healthy one (nearly all of them) answers without
    /// a lock.
    failing: FailingFlag,
}

/// What is failing in a client's requests, by cause.
#[derive(Debug, Default)]
struct RequestFailures {
    /// The server could not be reached or did not answer in time; cleared
    /// by any answer.
    unreachable: Option<Failure>,
    /// The credential does not work: a 401, or a credential plugin that
    /// failed. Cleared by any successful answer.
    credential: Option<Failure>,
    /// Requests the server refused (403), by what they asked (verb,
    /// resource, namespace). Each is cleared by a success of the same
    /// kind, or forgotten [`REFUSAL_MEMORY`] after its last refusal.
    refused: std::collections::BTreeMap<String, Failure>,
}

impl RequestFailures {
    fn is_empty(&self) -> bool {
        self.unreachable.is_none() && self.credential.is_none() && self.refused.is_empty()
    }
}

impl Requests {
    /// The failure that says most about the cluster: unreachable first,
    /// then a credential that does not work, then the oldest refusal.
    pub(crate) fn failure(&self) -> Option<Failure> {
        if !self.0.failing.get() {
            return None;
        }
        let mut failures = lock(&self.0.failures);
        let now = Instant::now();
        failures
            .refused
            .retain(|_, failure| now.duration_since(failure.last) < REFUSAL_MEMORY);
        let found = failures
            .unreachable
            .clone()
            .or_else(|| failures.credential.clone())
            .or_else(|| {
                failures
                    .refused
                    .values()
                    .min_by_key(|failure| failure.since)
                    .cloned()
            });
        self.0.failing.set(!failures.is_empty());
        found
    }

    /// The server answered `what` with `status`.
    fn answered(&self, what: &RequestKind, status: http::StatusCode) {
        let refused = matches!(
            status,
            http::StatusCode::UNAUTHORIZED | http::StatusCode::FORBIDDEN
        );
        if !refused && !self.0.failing.get() {
            return;
        }
        let mut failures = lock(&self.0.failures);
        failures.unreachable = None;
        if status == http::StatusCode::UNAUTHORIZED {
            failures.credential = Some(Failure::continuing(
                failures.credential.as_ref(),
                Redacted::ours(what.refusal(status)),
                false,
            ));
        } else if status == http::StatusCode::FORBIDDEN {
            let key = what.key();
            let before = failures.refused.get(&key);
            let failure = Failure::continuing(before, Redacted::ours(what.refusal(status)), false);
            failures.refused.insert(key, failure);
        } else if status.is_success() {
            failures.credential = None;
            failures.refused.remove(&what.key());
        }
        self.0.failing.set(!failures.is_empty());
    }

    /// A request got no answer: `reason` says why.
    fn unreachable(&self, reason: Redacted) {
        let mut failures = lock(&self.0.failures);
        failures.unreachable = Some(Failure::continuing(
            failures.unreachable.as_ref(),
            reason,
            true,
        ));
        self.0.failing.set(true);
    }

    /// No credential could be obtained for a request (a credential plugin
    /// failed): `reason` says why.
    pub(crate) fn credential_failed(&self, reason: Redacted) {
        let mut failures = lock(&self.0.failures);
        failures.credential = Some(Failure::continuing(
            failures.credential.as_ref(),
            reason,
            false,
        ));
        self.0.failing.set(true);
    }
}

/// What a request asked for, as RBAC sees it: verb, resource (with its
/// group) and namespace, read from its method and path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RequestKind {
    verb: &'static str,
    /// `configmaps`, `deployments.apps`, `pods/log`; or the path, for
    /// requests outside the resource API (`/version`).
    resource: String,
    namespace: Option<String>,
}

impl RequestKind {
    pub(crate) fn of<B>(request: &Request<B>) -> Self {
        let path = request.uri().path();
        let parts: Vec<&str> = path.split('/').filter(|part| !part.is_empty()).collect();
        // `/api/v1/...` or `/apis/<group>/<version>/...`.
        let (group, rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => ("", &[][..]),
        };
        let (namespace, rest) = match rest {
            // `/namespaces/<name>` alone is the namespace object itself.
            ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
                (Some((*namespace).to_string()), rest)
            }
            _ => (None, rest),
        };
        let named = rest.len() >= 2;
        let verb = match *request.method() {
            http::Method::GET | http::Method::HEAD if named => "get",
            http::Method::GET | http::Method::HEAD => "list",
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE if named => "delete",
            http::Method::DELETE => "deletecollection",
            _ => "request",
        };
        let resource = match rest {
            [] => path.to_string(),
            [resource] | [resource, _] => with_group(resource, group),
            [resource, _, subresource, ..] => {
                format!("{}/{subresource}", with_group(resource, group))
            }
        };
        Self {
            verb,
            resource,
            namespace,
        }
    }

    fn key(&self) -> String {
        format!(
            "{} {} {}",
            self.verb,
            self.resource,
            self.namespace.as_deref().unwrap_or_default()
        )
    }

    /// `403 Forbidden: cannot patch configmaps in namespace "default"`.
    fn refusal(&self, status: http::StatusCode) -> String {
        let place = self
            .namespace
            .as_ref()
            .map(|namespace| format!(" in namespace {namespace:?}"))
            .unwrap_or_default();
        format!(
            "{} {}: cannot {} {}{place}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("refused"),
            self.verb,
            self.resource
        )
    }
}

fn with_group(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
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
    /// The server, as reasons name it (without user information).
    pub(crate) server: Arc<str>,
}

impl<S> tower::Layer<S> for BoundedLayer {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Bounded<S> {
        Bounded {
            inner,
            timeout: self.timeout,
            requests: self.requests.clone(),
            server: self.server.clone(),
        }
    }
}

/// Gives each request that is not long-running a deadline, and records
/// how requests end: unanswered, refused, or answered.
pub(crate) struct Bounded<S> {
    inner: S,
    timeout: Option<Duration>,
    requests: Requests,
    server: Arc<str>,
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
        let kind = RequestKind::of(&request);
        let call = self.inner.call(request);
        let (requests, server) = (self.requests.clone(), self.server.clone());
        Box::pin(async move {
            let result = match deadline {
                Some(after) => match tokio::time::timeout(after, call).await {
                    Ok(result) => result.map_err(Into::into),
                    Err(_) => Err(Box::new(RequestTimedOut(after)) as BoxError),
                },
                None => call.await.map_err(Into::into),
            };
            match &result {
                Ok(response) => requests.answered(&kind, response.status()),
                Err(err) if is_unreachable(err.as_ref()) => {
                    requests.unreachable(Redacted::unreachable(&server, err.as_ref()));
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
        requests.unreachable(Redacted::ours("no answer within 1s"));
        let first = requests.failure().expect("failing").since;
        tokio::time::advance(Duration::from_secs(5)).await;
        requests.unreachable(Redacted::ours("connection refused"));
        let failure = requests.failure().expect("failing");
        assert_eq!(failure.since, first);
        assert_eq!(failure.reason.as_str(), "connection refused");
        let version = RequestKind::of(&request("/version"));
        requests.answered(&version, http::StatusCode::NOT_FOUND);
        assert!(requests.failure().is_none(), "any answer means reachable");
    }

    fn kind(method: http::Method, uri: &str) -> RequestKind {
        RequestKind::of(
            &Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .expect("request"),
        )
    }

    #[test]
    fn requests_are_described_as_rbac_sees_them() {
        use http::Method;
        let refusal = |method, uri| kind(method, uri).refusal(http::StatusCode::FORBIDDEN);
        for (method, uri, expected) in [
            (
                Method::PATCH,
                "/api/v1/namespaces/default/configmaps/a?fieldManager=x",
                "403 Forbidden: cannot patch configmaps in namespace \"default\"",
            ),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/team/deployments",
                "403 Forbidden: cannot list deployments.apps in namespace \"team\"",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/team/pods/p/log",
                "403 Forbidden: cannot get pods/log in namespace \"team\"",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/team",
                "403 Forbidden: cannot get namespaces",
            ),
            (
                Method::DELETE,
                "/api/v1/nodes",
                "403 Forbidden: cannot deletecollection nodes",
            ),
            (
                Method::POST,
                "/apis/x.io/v1/things",
                "403 Forbidden: cannot create things.x.io",
            ),
            (
                Method::GET,
                "/version",
                "403 Forbidden: cannot list /version",
            ),
        ] {
            assert_eq!(refusal(method, uri), expected, "{uri}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_clear_by_kind_and_are_forgotten_in_time() {
        use http::{Method, StatusCode};
        let requests = Requests::default();
        let patch = kind(Method::PATCH, "/api/v1/namespaces/a/configmaps/x");
        let get = kind(Method::GET, "/api/v1/namespaces/a/configmaps/x");
        requests.answered(&patch, StatusCode::FORBIDDEN);
        requests.answered(&get, StatusCode::OK);
        let failure = requests
            .failure()
            .expect("a read does not clear a refused write");
        assert!(!failure.unreachable);
        assert!(
            failure.reason.contains("cannot patch configmaps"),
            "{}",
            failure.reason
        );
        requests.answered(&patch, StatusCode::OK);
        assert!(requests.failure().is_none(), "the same kind works again");

        requests.answered(&patch, StatusCode::FORBIDDEN);
        tokio::time::advance(REFUSAL_MEMORY).await;
        assert!(
            requests.failure().is_none(),
            "forgotten when not tried again"
        );

        requests.answered(&get, StatusCode::UNAUTHORIZED);
        assert!(
            requests
                .failure()
                .expect("401")
                .reason
                .starts_with("401 Unauthorized")
        );
        requests.answered(&patch, StatusCode::OK);
        assert!(
            requests.failure().is_none(),
            "a success shows the credential works"
        );
    }
}
