//! The HTTP stack under clients built from kubeconfigs: kube-rs's layers
//! (base URI, authentication, extra headers) over a connector that offers
//! HTTP/2, so that every request and watch to one cluster shares one
//! connection. kube-rs's own stack speaks HTTP/1.1 only, which holds a
//! connection per open watch: three watched types on 10,000 clusters would
//! be 30,000 sockets.
//!
//! Clusters that would connect alike (one server, one TLS identity, one
//! proxy and deadline: see `shared_pool`) share the client underneath
//! and so its connection, up to 32 clusters per client, as client-go
//! shares a transport among clients with equal TLS settings. Their own
//! layers (credentials, deadlines, retries, health) stay their own.
//!
//! That connection is kept as long as it is open, however long nothing is
//! sent over it but pings: hyper-util's pool forgets by default a
//! connection it has not handed out for 90 s, watches open or not, and the
//! next request (a re-watch every few minutes) paid for a new connection.
//!
//! Until the first connection's TLS handshake has said it is HTTP/2,
//! requests that race it may open connections of their own (hyper pools by
//! protocol once it is known); the manager's first request to a cluster is
//! its probe, so the watches that follow share one connection.
//!
//! HTTP/2 connections are checked with pings (every 30 s when idle, 15 s to
//! answer, as client-go does), so a member that stops answering breaks its
//! connection and its watches report it, rather than going quiet. An idle
//! fleet's only traffic is these pings, one per connection every 30 s, so
//! their timers are rounded up to a whole second of one grid for the
//! process ([`CoalescingTimer`]): the connections of a fleet engaged within
//! a second or two ping in one wake of the runtime, not one wake each.
//!
//! A member behind a proxy ([`super::proxy`] picks it) is reached through
//! a tunnel of the same stack (an HTTP or HTTPS proxy's `CONNECT`, or
//! SOCKS 5, the proxies client-go supports), and a kubeconfig's
//! `tls-server-name` is the name the server's certificate is checked for:
//! such members get the same HTTP/2 connection, pings, retries and
//! deadlines as the others. Connecting as a whole (TCP, the proxy's
//! `CONNECT` and TLS) has one deadline, [`ClientOptions::connect_timeout`]:
//! a server or proxy that accepts the TCP connection and then says nothing
//! fails the attempt instead of holding it. Attempts take turns
//! process-wide ([`super::pace`]): the deadline runs from an attempt's
//! turn, so thousands of clusters engaged at once do not time out on our
//! own queue of TLS handshakes. With `http2: false`, or a
//! server that does not offer HTTP/2, the same stack speaks HTTP/1.1:
//! deadlines and retries as above, but no pings, so the manager probes such
//! clusters instead (every 30 s, 15 s to answer: a silent partition is
//! found as soon as over HTTP/2). Every connection of this stack has TCP
//! keep-alive besides (a minute to give up on a peer gone without a word).
//! A plain-HTTP server (`kubectl proxy`, for one) gets the same stack too,
//! over HTTP/1.1 as client-go speaks to it. kube-rs's own stack, which logs
//! an ERROR line per failed request, is used for no member.
//!
//! [`ClientOptions::connect_timeout`]: super::ClientOptions::connect_timeout
//!
//! Compared with kube-rs's stack (`ClientBuilder::try_from`, kube 5), layer
//! by layer from the outside in:
//!
//! - kept: the base URI; the retry of 429, 503 and 504 answers with
//!   kube's own policy (`RetryPolicy::server_retry`: `Retry-After` honoured,
//!   5 ms doubling, 15 tries), when the config's `default_retry` asks for it
//!   (the default); authentication;
//! - added: reads whose connection broke under them are sent again
//!   ([`super::resend`]), as client-go does; extra headers; a debug span per request
//!   (tower-http's `TraceLayer`, without headers, its failures at debug
//!   level: the cluster's health reports them);
//! - replaced: kube's connector read and write timeouts (none by default)
//!   by the request deadline of [`crate::bounded`] and, for a connection as a
//!   whole, HTTP/2 pings;
//! - not used: gzip decompression, which kube-rs enables only with its
//!   `gzip` feature (off in this workspace), and kube's own handling of
//!   exec-plugin certificates, which [`crate::credentials`] does.

use std::pin::Pin;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::rt::{Sleep, Timer};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::SocksV5;
use hyper_util::client::proxy::matcher::{Intercept, Matcher};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tower::util::{BoxCloneSyncService, BoxService};
use tower::{BoxError, ServiceBuilder, ServiceExt};

use super::pace::Pace;
use super::resend::Resend;
use super::shared_pool::{self, TransportKey};
use super::tunnel::Tunnelled;
use super::withhold::{CredentialValues, Withheld};

/// The service a client is built on (kube-rs's `GenericService`).
pub(crate) type Service = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// How often an idle HTTP/2 connection is pinged (client-go's
/// `ReadIdleTimeout`).
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed
/// (client-go's `PingTimeout`).
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// TCP keep-alive: the first probe after this long without traffic, then
/// one every [`TCP_KEEPALIVE_INTERVAL`], the connection given up after
/// [`TCP_KEEPALIVE_PROBES`] unanswered (a minute in all).
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE_PROBES: u32 = 3;

/// How much a server may send on one HTTP/2 stream before this client
/// reads it (hyper's default, stated beside the next one).
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
/// How much a server may send on one HTTP/2 connection, all streams
/// together, before this client reads it: 1 GiB, as Go's HTTP/2 transport
/// (client-go's) allows. A stream nobody reads holds its window of it
/// until read; at hyper's default of 5 MiB three such streams stalled
/// every other stream of the connection, and clusters share connections.
/// Memory stays bounded by the stream window of each unread stream.
const CONNECTION_WINDOW: u32 = 1024 * 1024 * 1024;

/// How many idle connections a client keeps to a server that speaks only
/// HTTP/1.1 (one that speaks HTTP/2 needs one connection in all): enough
/// for a cluster's requests in turn, while its watches hold connections of
/// their own. More are closed as their requests end.
const IDLE_HTTP1_CONNECTIONS: usize = 2;

/// How finely keep-alive deadlines are rounded: at most this much later
/// than asked, and every connection's timer on the same ticks.
const KEEP_ALIVE_GRID: Duration = Duration::from_secs(1);

/// hyper's timer for the HTTP/2 keep-alive (the only timer it is given
/// here): tokio's, with each deadline rounded up to the next tick of a grid
/// shared by the process ([`KEEP_ALIVE_GRID`]), so that connections pinging
/// at about the same time are woken together.
#[derive(Clone, Copy, Debug)]
struct CoalescingTimer;

impl CoalescingTimer {
    fn round_up(deadline: Instant) -> Instant {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(Instant::now);
        let since = deadline.saturating_duration_since(origin).as_nanos();
        let tick = KEEP_ALIVE_GRID.as_nanos();
        let ticks = since.div_ceil(tick);
        u64::try_from(ticks * tick)
            .ok()
            .and_then(|nanos| origin.checked_add(Duration::from_nanos(nanos)))
            .unwrap_or(deadline)
    }
}

impl Timer for CoalescingTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        TokioTimer::new().sleep_until(Self::round_up(deadline))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn Sleep>>, new_deadline: Instant) {
        TokioTimer::new().reset(sleep, Self::round_up(new_deadline));
    }

    fn now(&self) -> Instant {
        TokioTimer::new().now()
    }
}

/// A client builder for `config`: HTTP/2 when `http2` is set and the
/// server offers it (ALPN), HTTP/1.1 otherwise (a plain-HTTP server, one
/// without HTTP/2). `config.proxy_url` is the proxy [`super::proxy`]
/// picked, if any.
pub(crate) fn builder(
    config: kube::Config,
    http2: bool,
    values: CredentialValues,
) -> Result<ClientBuilder<Service>, kube::Error> {
    let server_name = config
        .tls_server_name
        .clone()
        .map(ServerName::try_from)
        .transpose()
        .map_err(|err| {
            kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(err))
        })?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    // Found by the kernel: a peer gone without a word (a host that died, a
    // link or a NAT entry that dropped the connection). A silent relay still
    // answers these; the manager's liveness probes find that on HTTP/1.1,
    // pings on HTTP/2.
    http.set_keepalive(Some(TCP_KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(TCP_KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(TCP_KEEPALIVE_PROBES));
    let inner = to_server(&config, http)?;
    let mut tls = config.rustls_client_config()?;
    // No TLS session is kept for resumption, as client-go keeps none: the
    // connection lasts as long as it works, and the reconnects that follow
    // a break mostly reach a server that cannot resume it (restarted, or
    // another replica behind the address), while the tickets cost a client
    // 2-3 KiB for its whole life (14 KiB with rustls's default cache).
    tls.resumption = rustls::client::Resumption::disabled();
    let tls = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
    // A plain-HTTP server is spoken to in the clear, as its kubeconfig says.
    let mut tls = if config.cluster_url.scheme_str() == Some("https") {
        tls.https_only()
    } else {
        tls.https_or_http()
    };
    if let Some(name) = server_name {
        tls = tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let deadline = config.connect_timeout;
    let tls = tls.enable_http1();
    if http2 {
        let tls = tls.enable_http2().wrap_connector(inner);
        // Over HTTP/2, clusters that connect alike share a connection; over
        // HTTP/1.1 each open watch holds a connection anyway, and a shared
        // pool would only keep fewer idle ones per cluster.
        let share = Some(TransportKey::of(&config));
        stack(config, ConnectDeadline::new(tls, deadline), share, values)
    } else {
        stack(
            config,
            ConnectDeadline::new(tls.wrap_connector(inner), deadline),
            None,
            values,
        )
    }
}

/// A connection to a server, in the clear or (to an HTTPS proxy) in TLS.
type Stream = MaybeHttpsStream<TokioIo<TcpStream>>;

/// What the member's TLS runs over: a TCP connection to the server, or a
/// tunnel to it through `config.proxy_url` (an HTTP proxy's `CONNECT`, the
/// same in TLS to an HTTPS proxy, or SOCKS 5), as client-go supports.
fn to_server(
    config: &kube::Config,
    http: HttpConnector,
) -> Result<BoxCloneSyncService<Uri, Stream, BoxError>, kube::Error> {
    fn boxed<C>(connector: C) -> BoxCloneSyncService<Uri, Stream, BoxError>
    where
        C: tower::Service<Uri> + Clone + Send + Sync + 'static,
        C::Response: Into<Stream>,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        BoxCloneSyncService::new(connector.map_response(Into::into).map_err(Into::into))
    }
    let Some(proxy) = config.proxy_url.as_ref() else {
        return Ok(boxed(http));
    };
    let intercept = Matcher::builder()
        .all(proxy.to_string())
        .build()
        .intercept(&config.cluster_url);
    // The proxy's address without the user and password its URL may carry
    // (percent-decoded by the matcher, as kube-rs and curl decode them).
    let address = intercept
        .as_ref()
        .map_or_else(|| proxy.clone(), |intercept| intercept.uri().clone());
    match proxy.scheme_str() {
        Some("http") => Ok(boxed(Tunnelled::new(address, http, basic_auth(&intercept)))),
        // TLS to the proxy is checked against the kubeconfig's CA, and the
        // kubeconfig's client certificate offered, as Go's transport does
        // with a client's TLS settings; the name checked is the proxy's.
        Some("https") => {
            let tls = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(config.rustls_client_config()?)
                .https_only()
                .enable_http1()
                .wrap_connector(http);
            Ok(boxed(Tunnelled::new(address, tls, basic_auth(&intercept))))
        }
        // Names are resolved by the proxy (Go's transport does the same
        // for both schemes).
        Some("socks5" | "socks5h") => {
            let socks = SocksV5::new(address, http);
            Ok(boxed(
                match intercept
                    .as_ref()
                    .and_then(|intercept| intercept.raw_auth())
                {
                    Some((user, password)) => {
                        socks.with_auth(user.to_string(), password.to_string())
                    }
                    None => socks,
                },
            ))
        }
        _ => Err(kube::Error::ProxyProtocolUnsupported {
            proxy_url: Box::new(proxy.clone()),
        }),
    }
}

/// The proxy's user and password, if its URL has them, as a
/// `Proxy-Authorization` value.
fn basic_auth(intercept: &Option<Intercept>) -> Option<http::HeaderValue> {
    intercept.as_ref().and_then(Intercept::basic_auth).cloned()
}

/// The client over `connector`, with kube-rs's layers (see the module
/// notes).
fn stack<C>(
    config: kube::Config,
    connector: C,
    share: Option<TransportKey>,
    values: CredentialValues,
) -> Result<ClientBuilder<Service>, kube::Error>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let make = || -> hyper_util::client::legacy::Client<C, Body> {
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(CoalescingTimer)
            .http2_keep_alive_interval(PING_INTERVAL)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            // The server indexes no response header for this client
            // (SETTINGS_HEADER_TABLE_SIZE 0). An API server's answers repeat
            // little worth indexing (each has its own audit ID and date),
            // while the table kept up to 4 KiB of them, and the read buffers
            // they were decoded from, for the connection's life: 8 KiB a
            // cluster once its client has sent a hundred requests.
            .http2_header_table_size(0)
            .http2_initial_stream_window_size(STREAM_WINDOW)
            .http2_initial_connection_window_size(CONNECTION_WINDOW)
            // Kept while open, however quiet (see above; pings check it). To
            // a server without HTTP/2, a few idle HTTP/1.1 connections are.
            .pool_idle_timeout(None)
            .pool_max_idle_per_host(IDLE_HTTP1_CONNECTIONS)
            .build(connector)
    };
    let client = Pooled(match share {
        Some(key) => shared_pool::shared(key, make),
        None => std::sync::Arc::new(make()),
    });
    let retry = tower::retry::RetryLayer::new(Resend::new(config.default_retry));
    let service =
        ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .layer(retry)
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            // Failures at debug level: the cluster's health and the caller
            // report them, once and redacted; tower-http's default is an
            // ERROR line per failed request, every retry of a member that is
            // down.
            .layer(tower_http::trace::TraceLayer::new_for_http().on_failure(
                tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
            ))
            .map_err(BoxError::from)
            .service(client)
            .map_response(|response| {
                response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
            });
    // Outside the retries: only the answer kube-rs reads is read whole,
    // and the server's own words about a failure (an error answer, a
    // watch's ERROR event) never carry a credential this client sent
    // ([`super::withhold`]).
    let service = Withheld {
        inner: service,
        values,
    };
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace,
    ))
}

/// A client's pool of connections, maybe shared with other clusters'
/// clients ([`shared_pool`]).
struct Pooled<C>(std::sync::Arc<hyper_util::client::legacy::Client<C, Body>>);

impl<C> Clone for Pooled<C> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<C> tower::Service<Request<Body>> for Pooled<C>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    type Response = Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = hyper_util::client::legacy::ResponseFuture;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.0.request(request)
    }
}

/// Connecting took longer than its deadline.
#[derive(Debug, thiserror::Error)]
#[error("connecting (TCP, a proxy's CONNECT, TLS) took longer than {0:?}")]
pub(crate) struct ConnectTimedOut(Duration);

/// A connector whose whole connection attempt has a deadline: hyper-util's
/// own covers the TCP connection only. Attempts are paced process-wide
/// ([`Pace`]), the deadline running from an attempt's start.
#[derive(Clone, Debug)]
struct ConnectDeadline<C> {
    inner: C,
    deadline: Option<Duration>,
}

impl<C> ConnectDeadline<C> {
    fn new(inner: C, deadline: Option<Duration>) -> Self {
        Self { inner, deadline }
    }
}

impl<C> tower::Service<Uri> for ConnectDeadline<C>
where
    C: tower::Service<Uri> + Clone + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let inner = self.inner.clone();
        let deadline = self.deadline;
        // The attempt starts at its turn ([`Pace`]), and its deadline with it.
        Box::pin(Pace::process().run(move || async move {
            let connecting = inner.oneshot(uri);
            match deadline {
                Some(deadline) => match tokio::time::timeout(deadline, connecting).await {
                    Ok(connected) => connected.map_err(Into::into),
                    Err(_) => Err(ConnectTimedOut(deadline).into()),
                },
                None => connecting.await.map_err(Into::into),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_deadlines_are_rounded_up_onto_one_grid() {
        let now = Instant::now();
        for offset_ms in [0, 1, 250, 999, 1000, 1001, 30_500] {
            let deadline = now + Duration::from_millis(offset_ms);
            let rounded = CoalescingTimer::round_up(deadline);
            assert!(rounded >= deadline, "never earlier than asked");
            assert!(
                rounded - deadline < KEEP_ALIVE_GRID,
                "at most one tick later"
            );
            // Deadlines a little apart land on the same tick or the next.
            let near = CoalescingTimer::round_up(deadline + Duration::from_millis(1));
            let ticks = (near - rounded).as_nanos() % KEEP_ALIVE_GRID.as_nanos();
            assert_eq!(ticks, 0, "{offset_ms} ms: both on the grid");
        }
        // Two connections whose pings are due within one tick wake together.
        let base = CoalescingTimer::round_up(now) + Duration::from_millis(10);
        assert_eq!(
            CoalescingTimer::round_up(base),
            CoalescingTimer::round_up(base + Duration::from_millis(500))
        );
    }
}
