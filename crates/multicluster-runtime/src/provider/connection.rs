//! The HTTP stack under clients built from kubeconfigs: kube-rs's layers
//! (base URI, authentication, extra headers) over a connector that offers
//! HTTP/2, so that every request and watch to one cluster shares one
//! connection. kube-rs's own stack speaks HTTP/1.1 only, which holds a
//! connection per open watch: three watched types on 10,000 clusters would
//! be 30,000 sockets.
//!
//! Until the first connection's TLS handshake has said it is HTTP/2,
//! requests that race it may open connections of their own (hyper pools by
//! protocol once it is known); the manager's first request to a cluster is
//! its probe, so the watches that follow share one connection.
//!
//! HTTP/2 connections are checked with pings (every 30 s when idle, 15 s to
//! answer, as client-go does), so a member that stops answering breaks its
//! connection and its watches report it, rather than going quiet.
//!
//! Proxies, plain-HTTP servers and kubeconfigs that name a TLS server name
//! keep kube-rs's stack (HTTP/1.1): its proxy tunnels and server-name
//! resolution are not public.
//!
//! Compared with kube-rs's stack (`ClientBuilder::try_from`, kube 5), layer
//! by layer from the outside in:
//!
//! - kept: the base URI; the retry of 429, 503 and 504 answers with
//!   kube's own policy (`RetryPolicy::server_retry`: `Retry-After` honoured,
//!   5 ms doubling, 15 tries), when the config's `default_retry` asks for it
//!   (the default); authentication; extra headers; a debug span per request
//!   (tower-http's `TraceLayer`, without headers);
//! - replaced: kube's connector read and write timeouts (none by default)
//!   by the request deadline of [`crate::health`] and, for a connection as a
//!   whole, HTTP/2 pings;
//! - not used: gzip decompression, which kube-rs enables only with its
//!   `gzip` feature (off in this workspace), and kube's own handling of
//!   exec-plugin certificates, which [`crate::provider::credentials`] does.

use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// The service a client is built on (kube-rs's `GenericService`).
pub(crate) type Service = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// How often an idle HTTP/2 connection is pinged (client-go's
/// `ReadIdleTimeout`).
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed
/// (client-go's `PingTimeout`).
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client builder for `config`: HTTP/2 when `http2` is set and the
/// server offers it (ALPN), HTTP/1.1 otherwise.
pub(crate) fn builder(
    config: kube::Config,
    http2: bool,
) -> Result<ClientBuilder<Service>, kube::Error> {
    let https = config.cluster_url.scheme_str() == Some("https");
    if !http2 || !https || config.proxy_url.is_some() || config.tls_server_name.is_some() {
        return ClientBuilder::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let tls = config.rustls_client_config()?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    let client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(PING_INTERVAL)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .map_err(BoxError::from)
        .service(client)
        .map_response(|response| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        });
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace,
    ))
}
