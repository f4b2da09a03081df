//! The record of how one client's requests end: unanswered, refused by
//! verb, resource and namespace, refused for the credential, answered.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Request;
use tokio::time::Instant;

use super::{FailingFlag, Failure};
use crate::lock;
use crate::redact::Redacted;

/// How long a refused request counts against its cluster when no request
/// of the same kind is made again: a reconciler that gave up, or backs off
/// for long, leaves its last refusal on the record this long.
#[doc(hidden)]
pub const REFUSAL_MEMORY: Duration = Duration::from_secs(300);

/// How the requests of one client have ended lately. Shared by the
/// client's layers and its cluster.
#[derive(Clone, Debug, Default)]
#[doc(hidden)]
pub struct Requests(Arc<RequestOutcomes>);

#[derive(Debug, Default)]
struct RequestOutcomes {
    failures: Mutex<RequestFailures>,
    /// Whether `failures` holds anything: the manager asks every cluster
    /// every second, and a healthy one (nearly all of them) answers without
    /// a lock.
    failing: FailingFlag,
    /// Whether the latest answer came over HTTP/2, whose connection is
    /// checked with pings; over HTTP/1.1 nothing notices a connection that
    /// stopped carrying anything, so the manager probes such clusters.
    over_http2: std::sync::atomic::AtomicBool,
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
    pub fn failure(&self) -> Option<Failure> {
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

    /// Whether an answer with `status` changes the record: a refusal
    /// does, any answer does while something is failing. A healthy client's
    /// successful answer (nearly all of them) does not.
    fn would_record(&self, status: http::StatusCode) -> bool {
        matches!(
            status,
            http::StatusCode::UNAUTHORIZED | http::StatusCode::FORBIDDEN
        ) || self.0.failing.get()
    }

    /// The server answered a request for `method` on `uri` with
    /// `status`. What the request asked ([`RequestKind`]) is worked out
    /// only when the answer changes the record, which on a client's hot
    /// path is seldom.
    pub fn answered_to(&self, method: &http::Method, uri: &http::Uri, status: http::StatusCode) {
        if self.would_record(status) {
            self.answered(&RequestKind::asked(method, uri), status);
        }
    }

    /// The server answered `what` with `status`.
    pub fn answered(&self, what: &RequestKind, status: http::StatusCode) {
        if !self.would_record(status) {
            return;
        }
        let mut failures = lock(&self.0.failures);
        failures.unreachable = None;
        if status == http::StatusCode::UNAUTHORIZED {
            failures.credential = Some(Failure::continuing(
                failures.credential.as_ref(),
                Redacted::new(what.refusal(status)),
                false,
            ));
        } else if status == http::StatusCode::FORBIDDEN {
            let key = what.key();
            let before = failures.refused.get(&key);
            let failure = Failure::continuing(before, Redacted::new(what.refusal(status)), false);
            failures.refused.insert(key, failure);
        } else if status.is_success() {
            failures.credential = None;
            failures.refused.remove(&what.key());
        }
        self.0.failing.set(!failures.is_empty());
    }

    /// An answer came over `version` of HTTP.
    pub fn answered_over(&self, version: http::Version) {
        self.0.over_http2.store(
            version == http::Version::HTTP_2,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether the latest answer came over HTTP/2 (false before any).
    pub fn over_http2(&self) -> bool {
        self.0.over_http2.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A request got no answer: `reason` says why.
    pub fn unreachable(&self, reason: Redacted) {
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
    pub fn credential_failed(&self, reason: Redacted) {
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
#[doc(hidden)]
pub struct RequestKind {
    verb: &'static str,
    /// `configmaps`, `deployments.apps`, `pods/log`; or the path, for
    /// requests outside the resource API (`/version`).
    resource: String,
    namespace: Option<String>,
}

impl RequestKind {
    /// The kind of `request`: its verb, resource and namespace.
    pub fn of<B>(request: &Request<B>) -> Self {
        Self::asked(request.method(), request.uri())
    }

    /// The kind of a request for `method` on `uri`.
    pub fn asked(method: &http::Method, uri: &http::Uri) -> Self {
        let path = uri.path();
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
        let verb = match *method {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str) -> Request<()> {
        Request::get(uri).body(()).expect("request")
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_keeps_its_start_until_an_answer_clears_it() {
        let requests = Requests::default();
        requests.unreachable(Redacted::new("no answer within 1s"));
        let first = requests.failure().expect("failing").since;
        tokio::time::advance(Duration::from_secs(5)).await;
        requests.unreachable(Redacted::new("connection refused"));
        let failure = requests.failure().expect("failing");
        assert_eq!(failure.since, first);
        assert_eq!(failure.reason.as_str(), "connection refused");
        let version = RequestKind::of(&request("/version"));
        requests.answered(&version, http::StatusCode::NOT_FOUND);
        assert!(requests.failure().is_none(), "any answer means reachable");
    }

    #[test]
    fn only_refusals_and_answers_while_failing_change_the_record() {
        use http::StatusCode;
        let requests = Requests::default();
        assert!(!requests.would_record(StatusCode::OK));
        assert!(!requests.would_record(StatusCode::NOT_FOUND));
        assert!(requests.would_record(StatusCode::FORBIDDEN));
        assert!(requests.would_record(StatusCode::UNAUTHORIZED));
        let get = kind(http::Method::GET, "/api/v1/namespaces/a/configmaps/c");
        requests.answered(&get, StatusCode::FORBIDDEN);
        assert!(
            requests.would_record(StatusCode::OK),
            "a success may clear the refusal"
        );
        requests.answered(&get, StatusCode::OK);
        assert!(requests.failure().is_none());
        assert!(!requests.would_record(StatusCode::OK));
        let uri: http::Uri = "/api/v1/namespaces/a/configmaps/c".parse().expect("uri");
        requests.answered_to(&http::Method::PATCH, &uri, StatusCode::FORBIDDEN);
        let refusal = requests.failure().expect("refused");
        assert_eq!(
            refusal.reason.as_str(),
            "403 Forbidden: cannot patch configmaps in namespace \"a\""
        );
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
