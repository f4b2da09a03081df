//! How clients built from kubeconfigs reach their clusters: deadlines,
//! HTTP/2, credential plugins' timeout and stderr, the request budget.

use std::time::Duration;

use super::budget::RequestBudget;
use super::credentials::DEFAULT_PLUGIN_TIMEOUT;

/// How long connecting to an API server (TCP and TLS) may take by default.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request that is not long-running may wait for its answer by
/// default.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How clients built from kubeconfigs reach their clusters. Every provider
/// that builds clients from kubeconfigs takes these in its options.
///
/// kube-rs sets no read timeout by default, so a request to a server that
/// accepts connections but never answers (a hung or paused process) waits
/// forever; these clients give every request that is not long-running a
/// deadline. Watches, followed logs and exec, attach, port-forward and
/// proxy sessions have none here (a watch ends on the server after its
/// `timeoutSeconds`, and kube-runtime's watcher gives up one silent 5 s
/// longer, as only a dead connection is).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientOptions {
    /// How long an exec credential plugin may run before it is stopped and
    /// the attempt fails (default `DEFAULT_PLUGIN_TIMEOUT`, 60 s). A
    /// failed attempt is that cluster's alone and is retried with backoff.
    pub plugin_timeout: Duration,
    /// How long connecting (TCP and TLS) may take (default
    /// `DEFAULT_CONNECT_TIMEOUT`, 10 s); `None` waits as long as the
    /// operating system does.
    pub connect_timeout: Option<Duration>,
    /// How long a request that is not long-running may wait for the
    /// response's head, and then for each piece of its body (default
    /// `DEFAULT_REQUEST_TIMEOUT`, 30 s); `None` waits forever. A request that times out fails with
    /// [`multicluster_core::health::RequestTimedOut`] and marks the cluster unreachable
    /// until one is answered again.
    pub request_timeout: Option<Duration>,
    /// Whether to offer HTTP/2 (default `true`): every request and watch
    /// to the cluster then shares one connection, checked with pings
    /// (every 30 s when idle, 15 s to answer, as client-go), also through
    /// a proxy's tunnel (HTTP, HTTPS or SOCKS 5). With `false` (or a
    /// server without HTTP/2, or one served over plain HTTP) the client
    /// speaks HTTP/1.1, a connection per open watch, with the same
    /// deadlines and TCP keep-alive. HTTP/1.1 has no pings: a manager
    /// probes such clusters every 30 s (15 s to answer), so a silent
    /// partition is reported as soon as over HTTP/2.
    pub http2: bool,
    /// Whether a credential plugin that fails is described with the last
    /// line of its stderr (default `false`: only its command and exit
    /// status). That line is often the plugin's own explanation, but it is
    /// whatever the plugin printed: some print their environment or the
    /// request they made when they fail, and the kubeconfig's `env:`
    /// entries (often API keys) then reach errors, logs and `/clusters`.
    /// Turn it on only for plugins you know.
    pub plugin_stderr: bool,
    /// How many requests the cluster's clients may send (default `None`:
    /// no budget, as the module [`super::budget`] explains why);
    /// shared by every client built for the cluster and everything that
    /// uses them. [`RequestBudget::CLIENT_GO`] is client-go's 5 a second,
    /// bursts of 10.
    pub request_budget: Option<RequestBudget>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            plugin_timeout: DEFAULT_PLUGIN_TIMEOUT,
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            http2: true,
            plugin_stderr: false,
            request_budget: None,
        }
    }
}

multicluster_core::option_setters!(ClientOptions {
    plugin_timeout: Duration,
    connect_timeout: Option<Duration>,
    request_timeout: Option<Duration>,
    http2: bool,
    plugin_stderr: bool,
    request_budget: Option<RequestBudget>,
});

/// Every setting counts, each field by name (a field added fails to
/// compile here until it is hashed too): a provider builds a member again
/// when its options change.
impl std::hash::Hash for ClientOptions {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let ClientOptions {
            plugin_timeout,
            connect_timeout,
            request_timeout,
            http2,
            plugin_stderr,
            request_budget,
        } = self;
        (
            plugin_timeout,
            connect_timeout,
            request_timeout,
            http2,
            plugin_stderr,
        )
            .hash(state);
        request_budget
            .map(|budget| (budget.qps.to_bits(), budget.burst))
            .hash(state);
    }
}
