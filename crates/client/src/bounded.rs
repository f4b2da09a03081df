//! The layer under clients built from kubeconfigs that gives each request
//! that is not long-running a deadline and records how requests end.
//!
//! The deadline is for the response's head; its body then has as long
//! between two pieces (`tower_http`'s `TimeoutBody`), so an answer cut off
//! by a server that stops mid-body (a paused or hung API server) fails too
//! instead of waiting for the connection's keep-alive to give up. Watches
//! have none: kube-runtime's watcher gives one up when it has been silent
//! for its `timeoutSeconds` and 5 s more (295 s), which only a dead
//! connection is, as the server ends every watch at its timeout.

use std::error::Error as StdError;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::Either;
use kube::client::Body;
use tower_http::timeout::TimeoutBody;

use multicluster_core::health::{RequestDeadline, RequestTimedOut, Requests, is_unreachable};
use multicluster_core::redact::Redacted;

/// Whether a request runs for as long as its caller wants: a watch, a
/// followed log, an exec, attach or port-forward session. Those get no
/// deadline (a watch has its own, on the server).
fn is_long_running<B>(request: &Request<B>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    let long_query = query
        .split('&')
        .any(|pair| matches!(pair, "watch=true" | "watch=1" | "follow=true" | "follow=1"));
    long_query
        || request.headers().contains_key(http::header::UPGRADE)
        || request
            .uri()
            .path()
            .split('/')
            .any(|part| matches!(part, "exec" | "attach" | "portforward" | "proxy"))
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
    type Response = Response<Either<TimeoutBody<B>, B>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let deadline = match request.extensions().get::<RequestDeadline>() {
            Some(RequestDeadline(own)) => Some(*own),
            None => self.timeout.filter(|_| !is_long_running(&request)),
        };
        let asked = (request.method().clone(), request.uri().clone());
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
                Ok(response) => {
                    requests.answered_over(response.version());
                    let (method, uri) = &asked;
                    requests.answered_to(method, uri, response.status());
                }
                Err(err) if is_unreachable(err.as_ref()) => {
                    requests.unreachable(Redacted::unreachable(&server, err.as_ref()));
                }
                Err(_) => {}
            }
            result.map(|response| {
                response.map(|body| match deadline {
                    Some(after) => Either::Left(TimeoutBody::new(after, body)),
                    None => Either::Right(body),
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::{Layer as _, Service, ServiceExt};

    type Stalled = http_body_util::StreamBody<
        futures::stream::Pending<Result<hyper::body::Frame<hyper::body::Bytes>, std::io::Error>>,
    >;

    /// A server that sends the head of its answer and then nothing: what a
    /// client sees of an API server paused in the middle of a response.
    fn stalls_after_the_head() -> impl Service<
        Request<Body>,
        Response = Response<Stalled>,
        Error = std::io::Error,
        Future = std::future::Ready<Result<Response<Stalled>, std::io::Error>>,
    > {
        tower::service_fn(|_request: Request<Body>| {
            std::future::ready(Ok(Response::new(http_body_util::StreamBody::new(
                futures::stream::pending(),
            ))))
        })
    }

    fn bounded<S>(inner: S, timeout: Duration) -> Bounded<S> {
        BoundedLayer {
            timeout: Some(timeout),
            requests: Requests::default(),
            server: Arc::from("https://member"),
        }
        .layer(inner)
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_cut_off_after_its_head_fails_at_the_deadline() {
        let deadline = Duration::from_secs(3);
        let mut client = bounded(stalls_after_the_head(), deadline);
        let request = Request::get("/api/v1/namespaces/a/configmaps")
            .body(Body::empty())
            .expect("request");
        let response = client.ready().await.expect("ready").call(request).await;
        let body = response.expect("the head arrives").into_body();
        let started = tokio::time::Instant::now();
        let read = tokio::time::timeout(deadline * 10, body.collect()).await;
        assert!(
            matches!(read, Ok(Err(_))),
            "the body must fail at the deadline, not wait for more"
        );
        assert_eq!(started.elapsed(), deadline);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_body_may_stay_quiet() {
        let mut client = bounded(stalls_after_the_head(), Duration::from_secs(3));
        let request = Request::get("/api/v1/configmaps?watch=true")
            .body(Body::empty())
            .expect("request");
        let response = client.ready().await.expect("ready").call(request).await;
        let mut body = std::pin::pin!(response.expect("the head arrives").into_body());
        let quiet = tokio::time::timeout(Duration::from_secs(600), body.frame()).await;
        assert!(quiet.is_err(), "a watch has no deadline");
    }

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
}
