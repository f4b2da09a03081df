//! Exec credential plugins (`client.authentication.k8s.io`), run by us.
//!
//! kube-rs runs a kubeconfig's plugin synchronously, three times per client
//! build, with no deadline and no way to stop it; a plugin that hangs (a
//! cloud CLI waiting for a login or the network) then holds a thread, a
//! provider and the process's shutdown. Here the plugin runs on tokio's
//! process driver through [`crate::process`]: once per client build, again
//! only when its credential is about to expire or the server answered 401,
//! never past its deadline, and killed (with whatever it started) when the
//! caller stops waiting.
//!
//! The credential is presented by a service of ours, renewed (as client-go
//! does) shortly before its `expirationTimestamp` and after the server
//! answers 401, while requests go on with the old one as long as it works.
//! A token goes into each request's header, through the client kube-rs
//! builds without the plugin. A client certificate is presented in the TLS
//! handshake of a client built with it; a renewed certificate gets a new
//! one, whose new connections present it, while the connections of the old
//! one (a watch's) go on until they end. A plugin may switch from tokens to
//! certificates and back. None of this rebuilds the cluster: its caches
//! and watches stay.
//!
//! Error messages name the plugin's command and its exit status, never its
//! arguments, environment or output, which can all hold secrets. Its
//! stderr is withheld too (a plugin may print its environment when it
//! fails) unless [`ClientOptions::plugin_stderr`] asks for its last line.
//!
//! [`ClientOptions::plugin_stderr`]: crate::ClientOptions::plugin_stderr

mod plugin;

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response, StatusCode, header::AUTHORIZATION};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use secrecy::{ExposeSecret, SecretString};
use tokio::time::Instant;

use super::withhold::CredentialValues;
use crate::Error;
use multicluster_core::health::Requests;
use multicluster_core::redact::Redacted;

pub use plugin::CredentialError;
pub(crate) use plugin::DEFAULT_PLUGIN_TIMEOUT;
pub(crate) use plugin::{Credential, Plugin};

/// A token is renewed this long before it expires (or halfway through its
/// life, if that is sooner), so requests do not race its expiry.
const RENEW_MARGIN: Duration = Duration::from_secs(10);

/// After a plugin run that failed, the next waits this long, doubling
/// while runs keep failing, up to [`PLUGIN_RETRY_MAX`]: requests asked
/// meanwhile go on with the current credential if it still works, or fail
/// with the last run's reason, rather than running the plugin each.
const PLUGIN_RETRY_FIRST: Duration = Duration::from_secs(1);

/// The longest wait between two failing plugin runs.
const PLUGIN_RETRY_MAX: Duration = Duration::from_secs(60);

/// Builds the client a credential is presented through: without a client
/// certificate (tokens go into a header), or with one (presented in each
/// new connection's TLS handshake).
pub(crate) type Connect = std::sync::Arc<
    dyn Fn(Option<(&str, &SecretString)>) -> Result<kube::Client, Error> + Send + Sync,
>;

/// A client whose requests carry the credential of `plugin`, starting with
/// `first` (obtained when the client was built), renewed before it expires
/// or after the server refused it (401), whether the plugin hands out
/// tokens, certificates, or switches from one to the other: the client
/// stays the same, so the cluster and its caches do too.
pub(crate) fn authenticated(
    connect: Connect,
    plugin: Plugin,
    first: Credential,
    requests: Requests,
    values: CredentialValues,
) -> Result<kube::Client, Error> {
    first.withheld_in(&values);
    let plain = connect(None)?;
    let default_namespace = plain.default_namespace().to_string();
    let current = Current::new(Presented::of(first, &connect)?, 0);
    let credentials = Credentials {
        plugin,
        connect,
        plain,
        current: std::sync::Mutex::new(current),
        renewing: tokio::sync::Mutex::default(),
        requests,
        values,
    };
    Ok(kube::Client::new(
        ExecAuth {
            credentials: std::sync::Arc::new(credentials),
        },
        default_namespace,
    ))
}

/// The plugin and the credential it last handed out. One run of the plugin
/// at a time renews it: requests that find it stale while a renewal runs go
/// on with the current one if it still works, and wait for the renewal
/// only if it does not.
struct Credentials {
    plugin: Plugin,
    connect: Connect,
    /// The client tokens are sent through.
    plain: kube::Client,
    current: std::sync::Mutex<Current>,
    /// Held while the plugin runs; holds what its failing runs were.
    renewing: tokio::sync::Mutex<Failing>,
    /// The client's request record: a renewal that fails counts against
    /// the cluster's health, as a refused request does.
    requests: Requests,
    /// The values the member's error answers are cleared of: each
    /// credential the plugin hands out joins them.
    values: CredentialValues,
}

/// What the plugin's failing runs were, since its last success: when it
/// may run again, and what has been told of them.
#[derive(Default)]
struct Failing {
    /// The latest failure's reason, and when the plugin may run again.
    latest: Option<(String, Instant)>,
    /// The wait after the next failure.
    delay: Option<Duration>,
    repeats: multicluster_core::health::repeats::Repeats,
}

impl Failing {
    /// A run failed with `reason`: the next waits longer (but comes before
    /// `expires_at`, while the current credential works); told once, then
    /// as a reminder.
    fn failed(&mut self, reason: &str, expires_at: Option<Instant>) {
        let now = Instant::now();
        let delay = self.delay.unwrap_or(PLUGIN_RETRY_FIRST);
        self.delay = Some((delay * 2).min(PLUGIN_RETRY_MAX));
        let mut next = now + delay;
        if let Some(expires_at) = expires_at.filter(|at| *at > now) {
            next = next.min(expires_at);
        }
        self.latest = Some((reason.to_string(), next));
        let redacted = Redacted::new(reason);
        match self.repeats.tell(&redacted, now.into_std()) {
            multicluster_core::health::repeats::Telling::New => tracing::warn!(
                error = %redacted,
                retry_in = ?delay,
                "renewing a credential failed; using the current one until it expires"
            ),
            multicluster_core::health::repeats::Telling::Reminder(attempts) => tracing::warn!(
                error = %redacted,
                attempts,
                "renewing a credential still fails"
            ),
            multicluster_core::health::repeats::Telling::Repeat(attempts) => tracing::debug!(
                error = %redacted,
                attempts,
                "renewing a credential failed again"
            ),
        }
    }

    /// The latest failure's reason while the plugin is not to run again yet.
    fn waiting(&self) -> Option<&str> {
        self.latest
            .as_ref()
            .filter(|(_, next)| Instant::now() < *next)
            .map(|(reason, _)| reason.as_str())
    }

    /// A run worked.
    fn succeeded(&mut self) {
        if let Some(attempts) = self.repeats.succeeded()
            && attempts > 1
        {
            tracing::info!(attempts, "renewing a credential works again");
        }
        *self = Self {
            repeats: std::mem::take(&mut self.repeats),
            ..Self::default()
        };
    }
}

/// A credential as requests present it.
#[derive(Clone)]
enum Presented {
    /// A bearer token, sent in a header through the plain client.
    Token(SecretString),
    /// A client certificate, presented by a client of its own: new
    /// connections shake hands with it. Connections the previous
    /// certificate opened (a watch's) go on until they end.
    Certificate(kube::Client),
}

impl Presented {
    fn of(credential: Credential, connect: &Connect) -> Result<(Self, Option<Timestamp>), Error> {
        Ok(match credential {
            Credential::Token { token, expires } => (Presented::Token(token), expires),
            Credential::Certificate {
                certificate,
                key,
                expires,
            } => (
                Presented::Certificate(connect(Some((&certificate, &key)))?),
                expires,
            ),
        })
    }
}

#[derive(Clone)]
struct Current {
    presented: Presented,
    /// Tells this credential from the ones before and after it.
    generation: u64,
    /// When to run the plugin again; `None` for a credential without
    /// expiry.
    renew_at: Option<Instant>,
    /// When the credential stops working, as the plugin said.
    expires_at: Option<Instant>,
    /// The server refused it (401): renew before the next request.
    refused: bool,
}

impl Current {
    fn new((presented, expires): (Presented, Option<Timestamp>), generation: u64) -> Self {
        let now = Instant::now();
        let left = expires.map(|expires| {
            let seconds = expires.duration_since(Timestamp::now()).as_secs_f64();
            Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::MAX)
        });
        Self {
            presented,
            generation,
            renew_at: left.map(|left| now + left.saturating_sub(RENEW_MARGIN.min(left / 2))),
            expires_at: left.map(|left| now + left),
            refused: false,
        }
    }

    fn fresh(&self) -> bool {
        !self.refused && self.renew_at.is_none_or(|at| Instant::now() < at)
    }

    fn usable(&self) -> bool {
        !self.refused && self.expires_at.is_none_or(|at| Instant::now() < at)
    }
}

impl Credentials {
    fn current(&self) -> Current {
        multicluster_core::lock(&self.current).clone()
    }

    /// The credential to present now, renewed first if it is stale.
    async fn credential(&self) -> Result<Current, kube::Error> {
        let seen = self.current();
        if seen.fresh() {
            return Ok(seen);
        }
        let mut failing = match self.renewing.try_lock() {
            Ok(guard) => guard,
            // Someone is renewing it; the current one works meanwhile.
            Err(_) if seen.usable() => return Ok(seen),
            Err(_) => self.renewing.lock().await,
        };
        // Renewed while this request waited?
        let seen = self.current();
        if seen.fresh() {
            return Ok(seen);
        }
        // The plugin failed a moment ago: not run again until its wait is
        // over.
        if let Some(reason) = failing.waiting() {
            return if seen.usable() {
                Ok(seen)
            } else {
                Err(auth_error(reason))
            };
        }
        // A plugin's last stderr line, when shown, may print the token it
        // handed out before.
        let renewed = self
            .plugin
            .run()
            .await
            .map_err(|err| self.values.withhold_text(&err.to_string()));
        let renewed = renewed.and_then(|credential| {
            credential.withheld_in(&self.values);
            Presented::of(credential, &self.connect).map_err(|err| err.to_string())
        });
        match renewed {
            Ok(presented) => {
                failing.succeeded();
                let renewed = Current::new(presented, seen.generation + 1);
                *multicluster_core::lock(&self.current) = renewed.clone();
                Ok(renewed)
            }
            // Renewing early failed: the old credential still works for now.
            Err(reason) if seen.usable() => {
                failing.failed(&reason, seen.expires_at);
                Ok(seen)
            }
            Err(reason) => {
                failing.failed(&reason, None);
                self.requests.credential_failed(Redacted::new(&reason));
                Err(auth_error(&reason))
            }
        }
    }

    /// The server refused the credential of `generation`: the next request
    /// renews it, unless it was renewed meanwhile.
    fn refused(&self, generation: u64) {
        let mut current = multicluster_core::lock(&self.current);
        if current.generation == generation {
            current.refused = true;
        }
    }
}

/// A client authentication error kube-rs callers and our redaction know,
/// carrying an already safe message.
fn auth_error(message: &str) -> kube::Error {
    kube::Error::Auth(kube::client::AuthError::AuthExec(message.to_string()))
}

fn bearer(token: &SecretString) -> Result<HeaderValue, kube::Error> {
    let mut value =
        HeaderValue::try_from(format!("Bearer {}", token.expose_secret())).map_err(|_| {
            auth_error("the credential plugin's token cannot be sent in an HTTP header")
        })?;
    value.set_sensitive(true);
    Ok(value)
}

/// Presents the plugin's credential with each request; a 401 answer marks
/// it refused, as client-go does, so the next request runs the plugin
/// again.
#[derive(Clone)]
struct ExecAuth {
    credentials: std::sync::Arc<Credentials>,
}

impl tower::Service<Request<Body>> for ExecAuth {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let credentials = self.credentials.clone();
        Box::pin(async move {
            let current = credentials.credential().await?;
            let response = match &current.presented {
                Presented::Token(token) => {
                    request.headers_mut().insert(AUTHORIZATION, bearer(token)?);
                    credentials.plain.send(request).await?
                }
                Presented::Certificate(client) => client.send(request).await?,
            };
            if response.status() == StatusCode::UNAUTHORIZED {
                credentials.refused(current.generation);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that is never asked anything here.
    fn offline() -> kube::Client {
        let config = kube::Config::new(http::Uri::from_static("https://127.0.0.1:1"));
        kube::Client::try_from(config).expect("a client that sends nothing until asked")
    }

    fn token(value: &str) -> Presented {
        Presented::Token(value.to_string().into())
    }

    fn presented_token(current: &Current) -> &str {
        match &current.presented {
            Presented::Token(token) => token.expose_secret(),
            Presented::Certificate(_) => "a certificate",
        }
    }

    /// Credentials of `plugin` whose token ("current") is due for renewal
    /// and works for ten more minutes.
    fn due_for_renewal(plugin: Plugin) -> Credentials {
        let now = Instant::now();
        Credentials {
            plugin,
            connect: std::sync::Arc::new(|_| Ok(offline())),
            plain: offline(),
            current: std::sync::Mutex::new(Current {
                presented: token("current"),
                generation: 0,
                renew_at: Some(now),
                expires_at: Some(now + Duration::from_secs(600)),
                refused: false,
            }),
            renewing: tokio::sync::Mutex::default(),
            requests: Requests::default(),
            values: CredentialValues::default(),
        }
    }

    /// A renewal whose plugin hangs holds up no request while the current
    /// token still works.
    #[tokio::test]
    async fn requests_go_on_with_a_working_token_while_it_is_renewed() {
        let mut hanging = plugin::shell_plugin("exec sleep 1000");
        hanging.timeout = Duration::from_secs(600);
        let credentials = std::sync::Arc::new(due_for_renewal(hanging));
        let renewal = tokio::spawn({
            let credentials = credentials.clone();
            async move { credentials.credential().await.map(|_| ()) }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while credentials.renewing.try_lock().is_ok() {
            assert!(Instant::now() < deadline, "the renewal did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let current = tokio::time::timeout(Duration::from_secs(10), credentials.credential())
            .await
            .expect("not held up by the renewal")
            .expect("a token");
        assert_eq!(presented_token(&current), "current");
        renewal.abort();
    }

    /// Log lines written while it is held, as text.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A plugin that keeps failing is run again after growing waits, not
    /// at every request (requests go on with the credential that still
    /// works), and its failure is warned about once.
    #[tokio::test]
    async fn a_failing_plugin_is_run_again_with_backoff_and_told_once() {
        let scratch = tempfile::tempdir().expect("scratch");
        let runs = scratch.path().join("runs");
        let failing = plugin::shell_plugin(&format!(
            "echo run >> '{}'; echo 'login required' >&2; exit 1",
            runs.display()
        ));
        let credentials = due_for_renewal(failing);
        let log = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let log = log.clone();
                move || log.clone()
            })
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .finish();
        let _logging = tracing::subscriber::set_default(subscriber);
        // Requests for 2.5 s, one every 100 ms (the scenario's clock).
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(2500) {
            let current = credentials.credential().await.expect("the current one");
            assert_eq!(presented_token(&current), "current");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ran = std::fs::read_to_string(&runs)
            .expect("runs")
            .lines()
            .count();
        // At once, after 1 s, then not before 3 s: two runs, where every
        // request ran it before (about 25).
        assert_eq!(ran, 2, "the plugin ran {ran} times");
        let text = String::from_utf8(log.0.lock().expect("log").clone()).expect("utf-8");
        let warned = text
            .lines()
            .filter(|line| line.contains("WARN") && line.contains("renewing a credential"))
            .count();
        assert_eq!(warned, 1, "{text}");
    }

    /// A plugin that hands out a certificate after a token (a cluster
    /// manager that switched) is followed: the next credential is the
    /// certificate, presented through a client of its own.
    #[tokio::test]
    async fn a_plugin_that_switches_to_a_certificate_is_followed() {
        let built = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let connect: Connect = {
            let built = built.clone();
            std::sync::Arc::new(move |certificate: Option<(&str, &SecretString)>| {
                built
                    .lock()
                    .expect("lock")
                    .push(certificate.map(|(pem, _)| pem.to_string()));
                Ok(offline())
            })
        };
        let credentials = Credentials {
            plugin: plugin::shell_plugin(
                r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","status":{"clientCertificateData":"CERT","clientKeyData":"KEY"}}'"#,
            ),
            connect,
            plain: offline(),
            current: std::sync::Mutex::new(Current::new((token("old"), None), 0)),
            renewing: tokio::sync::Mutex::default(),
            requests: Requests::default(),
            values: CredentialValues::default(),
        };
        credentials.refused(0);
        let renewed = credentials.credential().await.expect("renewed");
        assert!(matches!(renewed.presented, Presented::Certificate(_)));
        assert_eq!(renewed.generation, 1);
        assert_eq!(*built.lock().expect("lock"), [Some("CERT".to_string())]);
        credentials.refused(0);
        assert!(
            credentials.current().fresh(),
            "a stale refusal changes nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_credential_is_renewed_before_it_expires_and_after_a_refusal() {
        let expires = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(100);
        let current = Current::new((token("t"), Some(expires)), 0);
        assert!(current.fresh());
        tokio::time::advance(Duration::from_secs(89)).await;
        assert!(current.fresh(), "renewed only 10 s before expiry");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!current.fresh());
        assert!(current.usable(), "still works until it expires");

        let short = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(4);
        let current = Current::new((token("t"), Some(short)), 0);
        assert!(
            current.fresh(),
            "a short-lived credential is used for half its life"
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!current.fresh());

        let mut forever = Current::new((token("t"), None), 0);
        assert!(forever.fresh());
        forever.refused = true;
        assert!(!forever.fresh() && !forever.usable());
    }
}
