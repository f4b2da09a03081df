//! Requests sent again by clients built from kubeconfigs over HTTP/2:
//! answers that say "later" (429, 503, 504) with kube's own policy, and
//! reads whose connection broke before they were answered.
//!
//! A connection can break under a request that never reached the server:
//! an API server under load closes a connection while the request is being
//! written ("broken pipe"), or resets it. client-go sends such a GET again;
//! kube's retry policy looks only at answers, so without this a member's
//! first probe could fail on a fresh, healthy server and the member be
//! reported unreachable for a second (seen at 10,000 clusters on one API
//! server). Only reads are sent again: a write whose connection broke may
//! have been applied.

use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use kube::client::retry::RetryPolicy;
use tower::BoxError;
use tower::retry::Policy;

/// How often a read whose connection broke is sent again.
const BROKEN_CONNECTION_RETRIES: u32 = 2;
/// The wait before sending it again, times the attempt.
const BROKEN_CONNECTION_DELAY: Duration = Duration::from_millis(100);

/// The retry policy of one request.
#[derive(Clone)]
pub(crate) struct Resend {
    /// kube's policy for 429, 503 and 504, if the config asks for it.
    throttled: Option<RetryPolicy>,
    /// Reads sent again after a broken connection so far.
    broken: u32,
}

impl Resend {
    /// With kube's retry of throttled answers when `throttled` is set (the
    /// config's `default_retry`).
    pub(crate) fn new(throttled: bool) -> Self {
        Self {
            throttled: throttled.then(RetryPolicy::server_retry),
            broken: 0,
        }
    }
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for Resend {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        request: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        match result {
            Err(error) => {
                let read = matches!(*request.method(), Method::GET | Method::HEAD);
                if !read || self.broken >= BROKEN_CONNECTION_RETRIES || !broke(error.as_ref()) {
                    return None;
                }
                self.broken += 1;
                Some(tokio::time::sleep(BROKEN_CONNECTION_DELAY * self.broken))
            }
            Ok(_) => self.throttled.as_mut()?.retry(request, result),
        }
    }

    fn clone_request(&mut self, request: &Request<Body>) -> Option<Request<Body>> {
        let body = request.body().try_clone()?;
        let mut copy = Request::builder()
            .method(request.method().clone())
            .uri(request.uri().clone())
            .version(request.version())
            .body(body)
            .ok()?;
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

/// Whether `error` says the connection broke under the request (closed or
/// reset by the other end), rather than that it could not be made or took
/// too long.
fn broke(error: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let cut = |io: &std::io::Error| {
        matches!(
            io.kind(),
            BrokenPipe | ConnectionReset | ConnectionAborted | UnexpectedEof
        )
    };
    let mut next = Some(error);
    while let Some(error) = next {
        if error.downcast_ref::<std::io::Error>().is_some_and(cut) {
            return true;
        }
        // h2 keeps the I/O error of a connection that ended under a stream
        // to itself (it is not the error's source); a GOAWAY means the
        // server will not take the stream on this connection.
        if let Some(h2) = error.downcast_ref::<h2::Error>()
            && (h2.get_io().is_some_and(cut) || h2.is_go_away())
        {
            return true;
        }
        if let Some(hyper) = error.downcast_ref::<hyper::Error>()
            && hyper.is_incomplete_message()
        {
            return true;
        }
        next = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri("/api/v1/namespaces/default/configmaps")
            .body(Body::empty())
            .expect("request")
    }

    /// An error as hyper's client reports a connection that broke: the I/O
    /// error under layers of its own.
    fn broken_pipe() -> BoxError {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (SendRequest)")]
        struct Outer(#[source] std::io::Error);
        Box::new(Outer(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        )))
    }

    fn retried(policy: &mut Resend, method: Method, error: BoxError) -> bool {
        let mut result: Result<Response<()>, BoxError> = Err(error);
        policy.retry(&mut request(method), &mut result).is_some()
    }

    #[tokio::test]
    async fn reads_whose_connection_broke_are_sent_again_twice() {
        let mut policy = Resend::new(true);
        assert!(retried(&mut policy, Method::GET, broken_pipe()));
        assert!(retried(&mut policy, Method::GET, broken_pipe()));
        assert!(
            !retried(&mut policy, Method::GET, broken_pipe()),
            "twice at most"
        );
    }

    #[tokio::test]
    async fn writes_and_other_failures_are_not_sent_again() {
        let mut policy = Resend::new(true);
        assert!(
            !retried(&mut policy, Method::POST, broken_pipe()),
            "a write may have been applied"
        );
        assert!(!retried(&mut policy, Method::PATCH, broken_pipe()));
        let refused: BoxError = Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert!(
            !retried(&mut policy, Method::GET, refused),
            "the server is not there"
        );
        let timed_out: BoxError = Box::new(multicluster_core::health::RequestTimedOut(
            Duration::from_secs(30),
        ));
        assert!(!retried(&mut policy, Method::GET, timed_out));
        let reset: BoxError = Box::new(h2::Error::from(h2::Reason::INTERNAL_ERROR));
        assert!(
            !retried(&mut policy, Method::GET, reset),
            "the server refused it"
        );
    }

    #[tokio::test]
    async fn throttled_answers_follow_kubes_policy() {
        let throttled = || {
            let response = Response::builder().status(429).body(()).expect("response");
            Ok::<_, BoxError>(response)
        };
        let mut with = Resend::new(true);
        assert!(
            with.retry(&mut request(Method::GET), &mut throttled())
                .is_some()
        );
        let mut without = Resend::new(false);
        assert!(
            without
                .retry(&mut request(Method::GET), &mut throttled())
                .is_none()
        );
        let mut ok = Ok::<_, BoxError>(Response::new(()));
        assert!(with.retry(&mut request(Method::GET), &mut ok).is_none());
    }

    #[test]
    fn a_copy_keeps_method_path_and_headers() {
        let mut policy = Resend::new(true);
        let mut original = request(Method::GET);
        original
            .headers_mut()
            .insert("accept", "application/json".parse().expect("header"));
        let copy =
            <Resend as Policy<_, Response<()>, BoxError>>::clone_request(&mut policy, &original)
                .expect("a GET can be copied");
        assert_eq!(copy.method(), Method::GET);
        assert_eq!(copy.uri(), original.uri());
        assert_eq!(copy.headers(), original.headers());
    }
}
