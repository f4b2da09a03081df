//! The HTTPS server: TLS from reloaded files, one task per connection,
//! each request dispatched to its webhook with its cluster under a
//! deadline.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::handler::{Unanswered, Webhook};
use super::parse_path;
use super::tls::CertificateFiles;
use crate::lock;
use multicluster_runtime::Aware;
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::Error;
use multicluster_runtime::engagements::{Engagements, when_ended};
use multicluster_runtime::metrics::Metrics;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// Where and how the server listens. The defaults are controller-runtime's
/// (port 9443, `tls.crt` and `tls.key` in
/// `/tmp/k8s-webhook-server/serving-certs`), so manifests written for it
/// fit.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WebhookServerOptions {
    /// The address to listen on (default `0.0.0.0:9443`).
    pub address: SocketAddr,
    /// PEM certificate chain, server certificate first.
    pub cert_file: PathBuf,
    /// PEM private key of that certificate.
    pub key_file: PathBuf,
    /// How long a request may take, body and handler (default 9 s: under
    /// the API server's default `timeoutSeconds` of 10, so it learns of a
    /// hung handler from us, as a `503`, and applies the failure policy
    /// before its own deadline).
    pub request_deadline: Duration,
    /// The largest request body accepted (default 7 MiB: an
    /// AdmissionReview carries the object and its old version, each at
    /// most the API server's 3 MiB).
    pub max_request_bytes: usize,
}

impl Default for WebhookServerOptions {
    fn default() -> Self {
        let dir = PathBuf::from("/tmp/k8s-webhook-server/serving-certs");
        Self {
            address: SocketAddr::from(([0, 0, 0, 0], 9443)),
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
            request_deadline: Duration::from_secs(9),
            max_request_bytes: 7 * 1024 * 1024,
        }
    }
}

impl WebhookServerOptions {
    /// Certificate and key from these files.
    #[must_use]
    pub fn certificate(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.cert_file = cert_file.into();
        self.key_file = key_file.into();
        self
    }

    /// Listen on `address`.
    #[must_use]
    pub fn address(mut self, address: SocketAddr) -> Self {
        self.address = address;
        self
    }

    /// Answer within `deadline`.
    #[must_use]
    pub fn request_deadline(mut self, deadline: Duration) -> Self {
        self.request_deadline = deadline;
        self
    }
}

/// The webhook server; see [`super`]. Cheap to clone; clones share the
/// server.
#[derive(Clone)]
pub struct WebhookServer {
    inner: Arc<Inner>,
}

struct Inner {
    options: WebhookServerOptions,
    tls: Arc<rustls::ServerConfig>,
    webhooks: Mutex<BTreeMap<String, Webhook>>,
    clusters: Mutex<Engagements<()>>,
    requests: Family<Vec<(&'static str, String)>, Counter>,
    durations: Family<Vec<(&'static str, String)>, Histogram>,
    /// Whether metrics carry a `cluster` label; set with the registry.
    per_cluster: OnceLock<bool>,
}

impl std::fmt::Debug for WebhookServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookServer")
            .field("options", &self.inner.options)
            .field(
                "webhooks",
                &lock(&self.inner.webhooks).keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl WebhookServer {
    /// A server with `options`, its certificate read now: a missing or
    /// unusable file is an error naming it (the key's contents are never
    /// quoted).
    pub fn new(options: WebhookServerOptions) -> Result<Self, Error> {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let certs = CertificateFiles::load(
            options.cert_file.clone(),
            options.key_file.clone(),
            provider.clone(),
        )?;
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| Error::InvalidOptions {
                component: "webhook server".to_string(),
                reason: format!("TLS: {err}"),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(certs));
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            inner: Arc::new(Inner {
                options,
                tls: Arc::new(tls),
                webhooks: Mutex::default(),
                clusters: Mutex::default(),
                requests: Family::default(),
                durations: Family::new_with_constructor(
                    (|| Histogram::new(exponential_buckets(0.0001, 2.0, 18))) as fn() -> Histogram,
                ),
                per_cluster: OnceLock::new(),
            }),
        })
    }

    /// Serves `webhook` from now on; a second webhook of the same name is
    /// refused.
    pub fn add(&self, webhook: Webhook) -> Result<(), Error> {
        let mut webhooks = lock(&self.inner.webhooks);
        if webhooks.contains_key(webhook.name()) {
            return Err(Error::InvalidOptions {
                component: "webhook server".to_string(),
                reason: format!("a webhook named {:?} is served already", webhook.name()),
            });
        }
        webhooks.insert(webhook.name().to_string(), webhook);
        Ok(())
    }

    /// The webhooks served, by name.
    pub fn webhooks(&self) -> Vec<Webhook> {
        lock(&self.inner.webhooks).values().cloned().collect()
    }

    /// The clusters answered now, sorted.
    pub fn engaged_clusters(&self) -> Vec<ClusterName> {
        lock(&self.inner.clusters).names()
    }

    /// Records the server's metrics in `metrics` (the manager's:
    /// `manager.metrics()`); the first registry given is kept.
    pub fn use_metrics(&self, metrics: &Metrics) {
        if self
            .inner
            .per_cluster
            .set(metrics.per_cluster_labels())
            .is_ok()
        {
            let (requests, durations) = (self.inner.requests.clone(), self.inner.durations.clone());
            metrics.register(|registry| {
                registry.register(
                    "mcr_webhook_requests",
                    "Admission requests per webhook and result",
                    requests,
                );
                registry.register(
                    "mcr_webhook_request_duration_seconds",
                    "Time to answer an admission request, per webhook",
                    durations,
                );
            });
        }
    }

    /// Binds [`WebhookServerOptions::address`] and serves until `shutdown`
    /// fires.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), Error> {
        let address = self.inner.options.address;
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| Error::Bind { address, source })?;
        self.serve(listener, shutdown).await;
        Ok(())
    }

    /// Serves on `listener` until `shutdown` fires; requests under way
    /// then are answered (within the request deadline) before it returns.
    pub async fn serve(&self, listener: TcpListener, shutdown: CancellationToken) {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.inner.tls.clone());
        let connections = tokio_util::task::TaskTracker::new();
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "webhook server: accept failed");
                    // Out of descriptors, say: let the moment pass.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (acceptor, server, shutdown) = (acceptor.clone(), self.clone(), shutdown.clone());
            connections.spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(stream));
                let stream = tokio::select! {
                    // Stopping: a handshake under way holds nothing up.
                    () = shutdown.cancelled() => return,
                    handshake = handshake => match handshake {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, error = %err, "webhook server: TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "webhook server: TLS handshake timed out");
                            return;
                        }
                    },
                };
                server.connection(stream, shutdown).await;
            });
        }
        connections.close();
        connections.wait().await;
    }

    async fn connection(
        &self,
        stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        shutdown: CancellationToken,
    ) {
        let server = self.clone();
        let service = service_fn(move |request| {
            let server = server.clone();
            async move { Ok::<_, Infallible>(server.respond(request).await) }
        });
        let connection = http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HANDSHAKE_DEADLINE)
            .serve_connection(TokioIo::new(stream), service);
        tokio::pin!(connection);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "webhook server: connection ended");
                }
                return;
            }
            () = shutdown.cancelled() => {}
        }
        // Stopping: the request under way is answered, no other is read.
        connection.as_mut().graceful_shutdown();
        let grace = self.inner.options.request_deadline + Duration::from_secs(1);
        let _ = tokio::time::timeout(grace, connection).await;
    }

    /// Long on purpose: an admission request's way from its path to its answer
    /// (route, method, webhook, cluster, size, deadline), each step its own
    /// status code.
    async fn respond(&self, request: http::Request<Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path().to_string();
        if path == "/healthz" {
            return plain(StatusCode::OK, "ok\n".to_string());
        }
        let Some((name, cluster_name)) = parse_path(&path) else {
            return plain(StatusCode::NOT_FOUND, "not found\n".to_string());
        };
        if request.method() != http::Method::POST {
            return plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "admission requests are POSTed\n".to_string(),
            );
        }
        let webhook = lock(&self.inner.webhooks).get(name).cloned();
        let Some(webhook) = webhook else {
            self.count(name, &cluster_name, "unknown-webhook", None);
            return plain(
                StatusCode::NOT_FOUND,
                format!("no webhook named {name:?}\n"),
            );
        };
        let cluster = lock(&self.inner.clusters)
            .live(&cluster_name)
            .map(|engaged| engaged.cluster.clone());
        let Some(cluster) = cluster else {
            self.count(name, &cluster_name, "unknown-cluster", None);
            return plain(
                StatusCode::NOT_FOUND,
                format!("cluster {cluster_name} is not served here\n"),
            );
        };
        let started = Instant::now();
        let deadline = self.inner.options.request_deadline;
        let limit = self.inner.options.max_request_bytes;
        let answer = tokio::time::timeout(deadline, async {
            let body = read_body(request.into_body(), limit).await?;
            (webhook.handle)(cluster, body).await
        })
        .await;
        let (status, result, body, content_type) = match answer {
            Ok(Ok((allowed, json))) => (
                StatusCode::OK,
                if allowed { "allowed" } else { "denied" },
                json,
                "application/json",
            ),
            Ok(Err(Unanswered::BadRequest(why))) => {
                tracing::warn!(webhook = name, cluster = %cluster_name, "webhook request refused: {why}");
                (
                    StatusCode::BAD_REQUEST,
                    "bad-request",
                    why.into_bytes(),
                    "text/plain",
                )
            }
            Ok(Err(Unanswered::TooLarge(limit))) => {
                let why = format!("the request body is over {limit} bytes");
                tracing::warn!(webhook = name, cluster = %cluster_name, "webhook request refused: {why}");
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too-large",
                    why.into_bytes(),
                    "text/plain",
                )
            }
            Ok(Err(Unanswered::Failed(why))) => {
                tracing::warn!(webhook = name, cluster = %cluster_name, "webhook handler failed: {why}");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "error",
                    why.into_bytes(),
                    "text/plain",
                )
            }
            Err(_) => {
                tracing::warn!(webhook = name, cluster = %cluster_name, "webhook handler did not answer within {deadline:?}");
                let why = format!("the webhook did not answer within {deadline:?}");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "timeout",
                    why.into_bytes(),
                    "text/plain",
                )
            }
        };
        self.count(name, &cluster_name, result, Some(started.elapsed()));
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        response
    }

    fn count(&self, webhook: &str, cluster: &ClusterName, result: &str, took: Option<Duration>) {
        let mut labels = vec![("webhook", webhook.to_string())];
        if self.inner.per_cluster.get().copied().unwrap_or(false) {
            labels.push(("cluster", cluster.to_string()));
        }
        if let Some(took) = took {
            self.inner
                .durations
                .get_or_create(&labels)
                .observe(took.as_secs_f64());
        }
        labels.push(("result", result.to_string()));
        self.inner.requests.get_or_create(&labels).inc();
    }

    fn disengage(&self, name: &ClusterName, generation: u64) {
        if lock(&self.inner.clusters).end(name, generation).is_some() {
            tracing::debug!(cluster = %name, "webhook server no longer answers the cluster");
        }
    }
}

/// The body, or `TooLarge` once it passes `limit`. The rest of a body
/// over the limit is read and dropped (up to the limit again), so the
/// client, still writing, gets the answer rather than a reset connection.
async fn read_body(mut body: Incoming, limit: usize) -> Result<Bytes, Unanswered> {
    let unreadable = |err: hyper::Error| {
        Unanswered::BadRequest(format!("the request body could not be read: {err}"))
    };
    let mut read = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(unreadable)?.into_data() else {
            continue;
        };
        seen += data.len();
        if seen > limit.saturating_mul(2) {
            break;
        }
        if seen <= limit {
            read.extend_from_slice(&data);
        }
    }
    if seen > limit {
        return Err(Unanswered::TooLarge(limit));
    }
    Ok(Bytes::from(read))
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    response
}

impl Aware for WebhookServer {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
    ) -> Result<(), Error> {
        let engaged = lock(&self.inner.clusters).insert_new(&name, &cluster, &lifetime, ());
        let Some((stop, generation)) = engaged else {
            return Ok(());
        };
        let this = self.clone();
        when_ended(&stop, move || this.disengage(&name, generation));
        Ok(())
    }
}
