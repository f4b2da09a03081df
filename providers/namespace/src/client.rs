//! A `kube::Client` for a virtual cluster: a tower service over the host
//! client that moves every request into the host namespace and every answer
//! back into `default` — paths, object bodies (create, update, all patch
//! types), lists and watch streams.

use multicluster_runtime::provider::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use http::{Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::client::Body;
use serde_json::Value;

use crate::rewrite::{Route, route, to_host, to_virtual};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// Builds the client of the virtual cluster for `namespace` on `host`.
pub(crate) fn scoped_client(
    host: kube::Client,
    namespace: &str,
    discovery: Arc<Discovery>,
) -> kube::Client {
    kube::Client::new(
        Scoped {
            host,
            namespace: namespace.into(),
            discovery,
        },
        crate::VIRTUAL_NAMESPACE,
    )
}

/// How long a group/version's resource list is trusted to know that a
/// resource does not exist: a CRD installed later is found after at most
/// this long, and a stream of requests for unknown resources asks the host
/// at most this often.
const MISS_REFRESH: Duration = Duration::from_secs(2);

/// How long the host's `/version` answer is shared by the virtual clusters.
const VERSION_TTL: Duration = Duration::from_secs(2);

/// What the virtual clusters of one host learn from it, shared by all of
/// them:
///
/// - which resources are namespaced, per group/version, learned on first
///   use; a resource the list lacks makes it be fetched again (at most every
///   [`MISS_REFRESH`]), so CRDs added to a known group/version are found;
/// - the host's `/version` answer, which every virtual cluster's health
///   probe asks for: hundreds of namespaces engaged at once would otherwise
///   send as many requests at once, each on a connection of its own that
///   the host client's pool then keeps. One request answers them all.
#[derive(Default)]
pub(crate) struct Discovery {
    known: Mutex<HashMap<String, Known>>,
    version: tokio::sync::Mutex<Option<(Instant, VersionAnswer)>>,
}

/// The host's answer to `/version`: status and body, or why there was none
/// (redacted).
type VersionAnswer = Result<(StatusCode, Bytes), String>;

/// One group/version's resources (name → namespaced), and when they were
/// fetched.
struct Known {
    resources: HashMap<String, bool>,
    fetched: Instant,
}

impl Discovery {
    async fn is_namespaced(
        &self,
        host: &kube::Client,
        group_version: &str,
        plural: &str,
    ) -> Result<Option<bool>, BoxError> {
        if let Some(known) = lock(&self.known).get(group_version) {
            let answer = known.resources.get(plural).copied();
            if answer.is_some() || known.fetched.elapsed() < MISS_REFRESH {
                return Ok(answer);
            }
        }
        let request = Request::get(format!("/{group_version}")).body(Vec::new())?;
        let list: APIResourceList = host.request(request).await?;
        let resources: HashMap<String, bool> = list
            .resources
            .into_iter()
            .map(|resource| (resource.name, resource.namespaced))
            .collect();
        let answer = resources.get(plural).copied();
        lock(&self.known).insert(
            group_version.to_string(),
            Known {
                resources,
                fetched: Instant::now(),
            },
        );
        Ok(answer)
    }
}

impl Discovery {
    /// The host's answer to `GET /version`, asked once for every virtual
    /// cluster asking within [`VERSION_TTL`].
    async fn version(&self, host: &kube::Client) -> Result<Response<ResponseBody>, BoxError> {
        let mut version = self.version.lock().await;
        let fresh = version
            .as_ref()
            .filter(|(fetched, _)| fetched.elapsed() < VERSION_TTL)
            .map(|(_, answer)| answer.clone());
        let answer = match fresh {
            Some(answer) => answer,
            None => {
                let request = Request::get("/version").body(Body::empty())?;
                let answer = match host.send(request).await {
                    Ok(response) => {
                        let status = response.status();
                        match response.into_body().collect_bytes().await {
                            Ok(bytes) => Ok((status, bytes)),
                            Err(err) => {
                                Err(multicluster_runtime::redact::Redacted::kube(&err).to_string())
                            }
                        }
                    }
                    Err(err) => Err(multicluster_runtime::redact::Redacted::kube(&err).to_string()),
                };
                *version = Some((Instant::now(), answer.clone()));
                answer
            }
        };
        let (status, bytes) = answer.map_err(BoxError::from)?;
        let mut response = Response::new(Full::new(bytes).map_err(BoxError::from).boxed_unsync());
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok(response)
    }
}

#[derive(Clone)]
struct Scoped {
    host: kube::Client,
    namespace: Arc<str>,
    discovery: Arc<Discovery>,
}

impl tower::Service<Request<Body>> for Scoped {
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        Box::pin(self.clone().handle(request))
    }
}

impl Scoped {
    /// Long on purpose: one request's way through the scoped client in order
    /// (route, body rewritten, sent, answer rewritten for lists and watches).
    async fn handle(self, request: Request<Body>) -> Result<Response<ResponseBody>, BoxError> {
        if request.method() == http::Method::GET && request.uri().path() == "/version" {
            return self.discovery.version(&self.host).await;
        }
        let (mut parts, body) = request.into_parts();
        let namespace = &*self.namespace;
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().map(str::to_string);
        let target = match route(&path, namespace) {
            Route::PassThrough => None,
            Route::Rewritten(path) => Some(path),
            Route::ClusterWide {
                group_version,
                plural,
                narrowed,
            } => match self
                .discovery
                .is_namespaced(&self.host, &group_version, &plural)
                .await?
            {
                Some(true) => Some(narrowed),
                Some(false) => {
                    return Ok(refused(&format!(
                        "{plural} is cluster-scoped and not visible in a namespace-backed virtual cluster"
                    )));
                }
                None => {
                    return Ok(refused(&format!(
                        "unknown resource {plural} in {group_version}"
                    )));
                }
            },
            Route::Refused(reason) => return Ok(refused(&reason)),
        };
        let Some(target) = target else {
            let response = self.host.send(Request::from_parts(parts, body)).await?;
            return Ok(response.map(|body| body.map_err(BoxError::from).boxed_unsync()));
        };
        parts.uri = match &query {
            Some(query) => format!("{target}?{query}"),
            None => target,
        }
        .parse()?;

        let bytes = body.collect_bytes().await?;
        let bytes = if bytes.is_empty() {
            bytes
        } else {
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(mut value) => {
                    if let Err(reason) = to_host(&mut value, namespace) {
                        return Ok(refused(&reason));
                    }
                    Bytes::from(serde_json::to_vec(&value)?)
                }
                // Not JSON (e.g. YAML apply patches): nothing to move.
                Err(_) => bytes,
            }
        };
        parts.headers.remove(header::CONTENT_LENGTH);
        let watching = query.as_deref().is_some_and(|query| {
            query
                .split('&')
                .any(|pair| pair == "watch=true" || pair == "watch=1")
        });

        let response = self
            .host
            .send(Request::from_parts(parts, Body::from(bytes)))
            .await?;
        let (mut parts, body) = response.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        let body = if watching {
            rename_stream(body, self.namespace.clone())
        } else {
            let bytes = body.collect_bytes().await?;
            let bytes = match serde_json::from_slice::<Value>(&bytes) {
                Ok(mut value) => {
                    to_virtual(&mut value, namespace);
                    Bytes::from(serde_json::to_vec(&value)?)
                }
                Err(_) => bytes,
            };
            Full::new(bytes).map_err(BoxError::from).boxed_unsync()
        };
        Ok(Response::from_parts(parts, body))
    }
}

/// Rewrites a watch stream line by line: each line is one JSON event.
fn rename_stream(body: Body, namespace: Arc<str>) -> ResponseBody {
    let chunks = body.into_data_stream();
    let lines = stream::unfold(
        (chunks, Vec::<u8>::new(), false),
        move |(mut chunks, mut buffer, done)| {
            let namespace = namespace.clone();
            async move {
                if done {
                    return None;
                }
                loop {
                    if let Some(end) = buffer.iter().position(|byte| *byte == b'\n') {
                        let line: Vec<u8> = buffer.drain(..=end).collect();
                        return Some((Ok(rename_line(&line, &namespace)), (chunks, buffer, false)));
                    }
                    match chunks.next().await {
                        Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                        Some(Err(err)) => {
                            return Some((Err(BoxError::from(err)), (chunks, buffer, true)));
                        }
                        None if buffer.is_empty() => return None,
                        None => {
                            let rest = std::mem::take(&mut buffer);
                            return Some((
                                Ok(rename_line(&rest, &namespace)),
                                (chunks, buffer, true),
                            ));
                        }
                    }
                }
            }
        },
    );
    StreamBody::new(lines.map(|line| line.map(http_body::Frame::data))).boxed_unsync()
}

fn rename_line(line: &[u8], namespace: &str) -> Bytes {
    match serde_json::from_slice::<Value>(line) {
        Ok(mut event) => {
            to_virtual(&mut event, namespace);
            let mut out = serde_json::to_vec(&event).unwrap_or_else(|_| line.to_vec());
            out.push(b'\n');
            Bytes::from(out)
        }
        Err(_) => Bytes::copy_from_slice(line),
    }
}

/// A `403 Forbidden` Status, so callers get an ordinary API error naming
/// the reason.
fn refused(reason: &str) -> Response<ResponseBody> {
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": reason,
        "reason": "Forbidden",
        "code": 403,
    });
    let mut response = Response::new(
        Full::new(Bytes::from(status.to_string()))
            .map_err(BoxError::from)
            .boxed_unsync(),
    );
    *response.status_mut() = StatusCode::FORBIDDEN;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
