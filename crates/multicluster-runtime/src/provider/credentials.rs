//! Exec credential plugins (`client.authentication.k8s.io`), run by us.
//!
//! kube-rs runs a kubeconfig's plugin synchronously, three times per client
//! build, with no deadline and no way to stop it; a plugin that hangs (a
//! cloud CLI waiting for a login or the network) then holds a thread, a
//! provider and the process's shutdown. Here the plugin runs on tokio's
//! process driver through [`crate::provider::process`]: once per client build, again
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
//! [`ClientOptions::plugin_stderr`]: crate::provider::kubeconfig::ClientOptions::plugin_stderr

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response, StatusCode, header::AUTHORIZATION};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use kube::config::{ExecConfig, ExecInteractiveMode};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::Error;
use crate::health::Requests;
use crate::provider::process::{self, ProcessError};
use crate::redact::Redacted;

/// How long a credential plugin may take by default before it is stopped
/// and the attempt counts as failed.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// A token is renewed this long before it expires (or halfway through its
/// life, if that is sooner), so requests do not race its expiry.
const RENEW_MARGIN: Duration = Duration::from_secs(10);

/// Why a plugin gave no credential. Never quotes its arguments, environment
/// or output.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PluginError {
    /// Not started, timed out, or lost while running.
    #[error("the credential plugin {command:?} {source}{hint}")]
    Run {
        command: String,
        #[source]
        source: ProcessError,
        /// The kubeconfig's `installHint`, when the command was not found.
        hint: String,
    },
    /// It ran and exited with a failure.
    #[error("the credential plugin {command:?} failed ({status}){}", match stderr {
        Stderr::Withheld => format!("; {}", crate::redact::STDERR_WITHHELD),
        Stderr::Empty => String::new(),
        Stderr::LastLine(line) => format!(": {line}"),
    })]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: Stderr,
    },
    /// It exited successfully but what it printed is not usable.
    #[error("the credential plugin {command:?} gave no usable credential: {reason}")]
    Unusable { command: String, reason: String },
}

/// Why a credential plugin gave no credential, as [`Error::Credentials`]
/// carries it: its command, and how it failed (could not be started, timed
/// out, exited with a failure, printed nothing usable). Never its arguments,
/// environment or output.
#[derive(Debug)]
pub struct CredentialError(PluginError);

impl std::fmt::Display for CredentialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for CredentialError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

impl From<PluginError> for CredentialError {
    fn from(err: PluginError) -> Self {
        Self(err)
    }
}

/// What a failed plugin's description shows of its stderr.
#[derive(Debug)]
pub(crate) enum Stderr {
    /// Nothing: it may hold secrets (the default).
    Withheld,
    /// It printed nothing.
    Empty,
    /// Its last non-empty line, shortened (when the user asked for it).
    LastLine(String),
}

/// What a plugin handed out.
pub(crate) enum Credential {
    /// A bearer token, valid until `expires` if given.
    Token {
        token: SecretString,
        expires: Option<Timestamp>,
    },
    /// A client certificate and key, both PEM, valid until `expires` if
    /// given.
    Certificate {
        certificate: String,
        key: SecretString,
        expires: Option<Timestamp>,
    },
}

/// One kubeconfig user's exec plugin, ready to run.
#[derive(Clone)]
pub(crate) struct Plugin {
    exec: ExecConfig,
    command: String,
    interactive: bool,
    timeout: Duration,
    /// Whether a failure may show the last line of its stderr.
    show_stderr: bool,
}

impl Plugin {
    /// The plugin `exec` describes; `None` without a command. It is
    /// interactive as client-go decides: `Always`, or `IfAvailable` (also
    /// the default) when `stdin_is_terminal`.
    pub(crate) fn new(
        exec: ExecConfig,
        stdin_is_terminal: bool,
        timeout: Duration,
    ) -> Option<Self> {
        let command = exec.command.clone()?;
        let interactive = match exec.interactive_mode {
            Some(ExecInteractiveMode::Never) => false,
            Some(ExecInteractiveMode::Always) => true,
            Some(ExecInteractiveMode::IfAvailable) | None => stdin_is_terminal,
        };
        Some(Self {
            exec,
            command,
            interactive,
            timeout,
            show_stderr: false,
        })
    }

    /// This plugin, showing the last line of its stderr when it fails
    /// (see [`ClientOptions::plugin_stderr`] for the risk).
    ///
    /// [`ClientOptions::plugin_stderr`]: crate::provider::kubeconfig::ClientOptions::plugin_stderr
    pub(crate) fn showing_stderr(mut self, show: bool) -> Self {
        self.show_stderr = show;
        self
    }

    /// Runs the plugin once and reads its credential.
    pub(crate) async fn run(&self) -> Result<Credential, PluginError> {
        let mut command = tokio::process::Command::new(&self.command);
        command.args(self.exec.args.iter().flatten());
        for entry in self.exec.env.iter().flatten() {
            if let (Some(name), Some(value)) = (entry.get("name"), entry.get("value")) {
                command.env(name, value);
            }
        }
        for name in self.exec.drop_env.iter().flatten() {
            command.env_remove(name);
        }
        command.env("KUBERNETES_EXEC_INFO", self.exec_info());
        let run = if self.interactive {
            process::output_interactive(command, self.timeout).await
        } else {
            process::output(command, self.timeout).await
        };
        let output = run.map_err(|source| {
            let hint = match (&source, &self.exec.install_hint) {
                (ProcessError::Start(err), Some(hint))
                    if err.kind() == std::io::ErrorKind::NotFound =>
                {
                    format!(" ({})", hint.trim())
                }
                _ => String::new(),
            };
            PluginError::Run {
                command: self.command.clone(),
                source,
                hint,
            }
        })?;
        if !output.status.success() {
            let stderr = if self.show_stderr {
                crate::redact::last_line(&String::from_utf8_lossy(&output.stderr))
                    .map_or(Stderr::Empty, Stderr::LastLine)
            } else {
                Stderr::Withheld
            };
            return Err(PluginError::Failed {
                command: self.command.clone(),
                status: output.status,
                stderr,
            });
        }
        self.read(&output.stdout)
    }

    /// `KUBERNETES_EXEC_INFO` as client-go sets it.
    fn exec_info(&self) -> String {
        #[derive(Serialize)]
        struct Info<'a> {
            #[serde(rename = "apiVersion", skip_serializing_if = "Option::is_none")]
            api_version: Option<&'a str>,
            kind: &'static str,
            spec: Spec<'a>,
        }
        #[derive(Serialize)]
        struct Spec<'a> {
            interactive: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            cluster: Option<&'a kube::config::ExecAuthCluster>,
        }
        let info = Info {
            api_version: self.exec.api_version.as_deref(),
            kind: "ExecCredential",
            spec: Spec {
                interactive: self.interactive,
                cluster: self
                    .exec
                    .provide_cluster_info
                    .then_some(self.exec.cluster.as_ref())
                    .flatten(),
            },
        };
        // Serialising plain strings, booleans and JSON values cannot fail.
        serde_json::to_string(&info).unwrap_or_default()
    }

    /// Reads an ExecCredential. client-go decodes it with a YAML-tolerant
    /// decoder, so some plugins print YAML; YAML parsers take JSON too.
    fn read(&self, stdout: &[u8]) -> Result<Credential, PluginError> {
        #[derive(Deserialize)]
        struct ExecCredential {
            #[serde(rename = "apiVersion")]
            api_version: Option<String>,
            status: Option<Status>,
        }
        #[derive(Deserialize)]
        struct Status {
            token: Option<String>,
            #[serde(rename = "expirationTimestamp")]
            expiration: Option<String>,
            #[serde(rename = "clientCertificateData")]
            certificate: Option<String>,
            #[serde(rename = "clientKeyData")]
            key: Option<String>,
        }
        let unusable = |reason: &str| PluginError::Unusable {
            command: self.command.clone(),
            reason: reason.to_string(),
        };
        // Parser messages can quote the output, i.e. the credential.
        let credential: ExecCredential = serde_saphyr::from_slice(stdout)
            .map_err(|_| unusable("its output is not an ExecCredential"))?;
        if let (Some(wanted), Some(got)) = (&self.exec.api_version, &credential.api_version)
            && wanted != got
        {
            return Err(unusable(&format!(
                "it answered with apiVersion {got:?}, but the kubeconfig asks for {wanted:?}"
            )));
        }
        let status = credential
            .status
            .ok_or_else(|| unusable("its ExecCredential has no status"))?;
        let expires = status
            .expiration
            .as_deref()
            .map(|text| {
                text.parse::<Timestamp>()
                    .map_err(|_| unusable("its expirationTimestamp is not an RFC 3339 time"))
            })
            .transpose()?;
        match (status.token, status.certificate, status.key) {
            (_, Some(certificate), Some(key)) => Ok(Credential::Certificate {
                certificate,
                key: key.into(),
                expires,
            }),
            (Some(token), _, _) if !token.is_empty() => Ok(Credential::Token {
                token: token.into(),
                expires,
            }),
            _ => Err(unusable(
                "its ExecCredential holds neither a token nor a client certificate and key",
            )),
        }
    }
}

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
) -> Result<kube::Client, Error> {
    let plain = connect(None)?;
    let default_namespace = plain.default_namespace().to_string();
    let current = Current::new(Presented::of(first, &connect)?, 0);
    let credentials = Credentials {
        plugin,
        connect,
        plain,
        current: std::sync::Mutex::new(current),
        renewing: tokio::sync::Mutex::new(()),
        requests,
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
    renewing: tokio::sync::Mutex<()>,
    /// The client's request record: a renewal that fails counts against
    /// the cluster's health, as a refused request does.
    requests: Requests,
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
        crate::sync::lock(&self.current).clone()
    }

    /// The credential to present now, renewed first if it is stale.
    async fn credential(&self) -> Result<Current, kube::Error> {
        let seen = self.current();
        if seen.fresh() {
            return Ok(seen);
        }
        let _renewing = match self.renewing.try_lock() {
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
        let renewed = self.plugin.run().await.map_err(|err| err.to_string());
        let renewed = renewed.and_then(|credential| {
            Presented::of(credential, &self.connect).map_err(|err| err.to_string())
        });
        match renewed {
            Ok(presented) => {
                let renewed = Current::new(presented, seen.generation + 1);
                *crate::sync::lock(&self.current) = renewed.clone();
                Ok(renewed)
            }
            // Renewing early failed: the old credential still works for now.
            Err(reason) if seen.usable() => {
                tracing::warn!(error = %reason, "renewing a credential failed; using the current one until it expires");
                Ok(seen)
            }
            Err(reason) => {
                self.requests.credential_failed(Redacted::ours(&reason));
                Err(auth_error(&reason))
            }
        }
    }

    /// The server refused the credential of `generation`: the next request
    /// renews it, unless it was renewed meanwhile.
    fn refused(&self, generation: u64) {
        let mut current = crate::sync::lock(&self.current);
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

    fn plugin(script: &str) -> Plugin {
        let exec = ExecConfig {
            api_version: Some("client.authentication.k8s.io/v1".into()),
            command: Some("sh".into()),
            args: Some(vec!["-c".into(), script.into()]),
            env: None,
            drop_env: None,
            install_hint: None,
            interactive_mode: Some(ExecInteractiveMode::Never),
            provide_cluster_info: false,
            cluster: None,
            other: Default::default(),
        };
        Plugin::new(exec, false, Duration::from_secs(10)).expect("command")
    }

    #[tokio::test]
    async fn tokens_and_expiry_are_read_from_json_or_yaml() {
        let json = plugin(
            r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t1","expirationTimestamp":"2099-01-01T00:00:00Z"}}'"#,
        );
        match json.run().await.expect("token") {
            Credential::Token { token, expires } => {
                assert_eq!(token.expose_secret(), "t1");
                assert_eq!(
                    expires.map(|t| t.to_string()),
                    Some("2099-01-01T00:00:00Z".into())
                );
            }
            Credential::Certificate { .. } => panic!("a token was handed out"),
        }
        let yaml = plugin("printf 'kind: ExecCredential\\nstatus:\\n  token: t2\\n'");
        assert!(matches!(
            yaml.run().await.expect("token"),
            Credential::Token { expires: None, .. }
        ));
    }

    #[tokio::test]
    async fn unusable_answers_are_explained_without_quoting_them() {
        for (script, expected) in [
            ("echo 'not: [json'", "not an ExecCredential"),
            (
                r#"echo '{"apiVersion":"client.authentication.k8s.io/v1beta1","status":{"token":"secret-1"}}'"#,
                "apiVersion \"client.authentication.k8s.io/v1beta1\"",
            ),
            (r#"echo '{"kind":"ExecCredential"}'"#, "has no status"),
            (
                r#"echo '{"status":{"token":"secret-1","expirationTimestamp":"tomorrow"}}'"#,
                "expirationTimestamp",
            ),
            (r#"echo '{"status":{}}'"#, "neither a token"),
        ] {
            let err = plugin(script)
                .run()
                .await
                .err()
                .unwrap_or_else(|| panic!("{script} was accepted"));
            let message = err.to_string();
            assert!(message.contains(expected), "{message}");
            assert!(!message.contains("secret-1"), "{message}");
        }
    }

    #[tokio::test]
    async fn a_failure_is_described_by_status_and_its_stderr_only_when_asked() {
        let script = "echo secret-token; echo API_KEY=secret-env >&2; echo 'no grant' >&2; exit 4";
        let withheld = plugin(script).run().await.err().expect("fails").to_string();
        assert!(withheld.contains("exit status: 4"), "{withheld}");
        assert!(withheld.contains("stderr is withheld"), "{withheld}");
        for secret in ["secret-token", "secret-env", "no grant"] {
            assert!(!withheld.contains(secret), "{withheld}");
        }
        let shown = plugin(script)
            .showing_stderr(true)
            .run()
            .await
            .err()
            .expect("fails")
            .to_string();
        assert!(shown.ends_with("exit status: 4): no grant"), "{shown}");
        assert!(!shown.contains("secret-token"), "stdout never: {shown}");
    }

    #[tokio::test]
    async fn a_hanging_plugin_is_stopped_at_its_deadline() {
        let mut hanging = plugin("exec sleep 1000");
        hanging.timeout = Duration::from_millis(300);
        let err = hanging.run().await.err().expect("times out");
        assert!(err.to_string().contains("did not finish within"), "{err}");
    }

    #[tokio::test]
    async fn exec_info_carries_the_version_interactivity_and_cluster_when_asked() {
        let mut with_cluster = plugin("true");
        with_cluster.exec.provide_cluster_info = true;
        with_cluster.exec.cluster = Some(kube::config::ExecAuthCluster {
            server: Some("https://example:6443".into()),
            ..Default::default()
        });
        let info: serde_json::Value =
            serde_json::from_str(&with_cluster.exec_info()).expect("json");
        assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1");
        assert_eq!(info["kind"], "ExecCredential");
        assert_eq!(info["spec"]["interactive"], false);
        assert_eq!(info["spec"]["cluster"]["server"], "https://example:6443");
        let without: serde_json::Value =
            serde_json::from_str(&plugin("true").exec_info()).expect("json");
        assert!(without["spec"].get("cluster").is_none());
    }

    #[test]
    fn plugins_are_interactive_only_when_asked_and_possible() {
        use ExecInteractiveMode::{Always, IfAvailable, Never};
        for (configured, terminal, expected) in [
            (None, false, false),
            (None, true, true),
            (Some(IfAvailable), false, false),
            (Some(IfAvailable), true, true),
            (Some(Never), true, false),
            (Some(Always), false, true),
        ] {
            let mut exec = plugin("true").exec;
            exec.interactive_mode = configured.clone();
            let plugin = Plugin::new(exec, terminal, Duration::from_secs(1)).expect("command");
            assert_eq!(
                plugin.interactive, expected,
                "{configured:?}, terminal: {terminal}"
            );
        }
    }

    /// A client that is never asked anything here.
    fn offline() -> kube::Client {
        crate::testing::offline_cluster("offline").client()
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

    /// A renewal whose plugin hangs holds up no request while the current
    /// token still works.
    #[tokio::test]
    async fn requests_go_on_with_a_working_token_while_it_is_renewed() {
        let mut hanging = plugin("exec sleep 1000");
        hanging.timeout = Duration::from_secs(600);
        let now = Instant::now();
        let credentials = std::sync::Arc::new(Credentials {
            plugin: hanging,
            connect: std::sync::Arc::new(|_| Ok(offline())),
            plain: offline(),
            current: std::sync::Mutex::new(Current {
                presented: token("current"),
                generation: 0,
                renew_at: Some(now),
                expires_at: Some(now + Duration::from_secs(600)),
                refused: false,
            }),
            renewing: tokio::sync::Mutex::new(()),
            requests: Requests::default(),
        });
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
            plugin: plugin(
                r#"echo '{"apiVersion":"client.authentication.k8s.io/v1","status":{"clientCertificateData":"CERT","clientKeyData":"KEY"}}'"#,
            ),
            connect,
            plain: offline(),
            current: std::sync::Mutex::new(Current::new((token("old"), None), 0)),
            renewing: tokio::sync::Mutex::new(()),
            requests: Requests::default(),
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
