//! Running one exec credential plugin and reading its answer: a token or a
//! client certificate, or an error that names the command and its exit
//! status and quotes nothing it printed (stderr only when asked).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::config::{ExecConfig, ExecInteractiveMode};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use crate::process::{self, ProcessError};

/// How long a credential plugin may take by default before it is stopped
/// and the attempt counts as failed.
pub(crate) const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

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
        Stderr::Withheld => format!("; {}", multicluster_core::redact::STDERR_WITHHELD),
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

/// Why a credential plugin gave no credential, as [`Error::Credentials`](crate::Error::Credentials)
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

impl Credential {
    /// Adds its secret parts to the values a member's error answers are
    /// cleared of.
    pub(crate) fn withheld_in(&self, values: &crate::withhold::CredentialValues) {
        use secrecy::ExposeSecret;
        match self {
            Credential::Token { token, .. } => values.add(token.expose_secret()),
            Credential::Certificate { key, .. } => values.add(key.expose_secret()),
        }
    }
}

/// One kubeconfig user's exec plugin, ready to run.
#[derive(Clone)]
pub(crate) struct Plugin {
    exec: ExecConfig,
    command: String,
    interactive: bool,
    pub(super) timeout: Duration,
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
    /// [`ClientOptions::plugin_stderr`]: crate::ClientOptions::plugin_stderr
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
                multicluster_core::redact::last_line(&String::from_utf8_lossy(&output.stderr))
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
            // Checked here, not when it is sent: a token that is no header
            // value fails the build that asked for it, named.
            (Some(token), _, _)
                if http::HeaderValue::from_str(&format!("Bearer {token}")).is_err() =>
            {
                Err(unusable(
                    "its token cannot be sent in an HTTP header: it holds a control character (CR, LF, NUL, ...)",
                ))
            }
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

/// A plugin running `script` with `sh -c`, for the tests of this module
/// and its parent.
#[cfg(test)]
pub(crate) fn shell_plugin(script: &str) -> Plugin {
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

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    #[tokio::test]
    async fn tokens_and_expiry_are_read_from_json_or_yaml() {
        let json = shell_plugin(
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
        let broken = shell_plugin(
            r#"printf '{"apiVersion":"client.authentication.k8s.io/v1","status":{"token":"t1\\r\\nX-Injected: 1"}}'"#,
        );
        let err = broken.run().await.map(|_| ()).expect_err("no header value");
        assert!(
            err.to_string().contains("cannot be sent in an HTTP header"),
            "{err}"
        );
        assert!(!err.to_string().contains("X-Injected"), "{err}");
        let yaml = shell_plugin("printf 'kind: ExecCredential\\nstatus:\\n  token: t2\\n'");
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
            let err = shell_plugin(script)
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
        let withheld = shell_plugin(script)
            .run()
            .await
            .err()
            .expect("fails")
            .to_string();
        assert!(withheld.contains("exit status: 4"), "{withheld}");
        assert!(withheld.contains("stderr is withheld"), "{withheld}");
        for secret in ["secret-token", "secret-env", "no grant"] {
            assert!(!withheld.contains(secret), "{withheld}");
        }
        let shown = shell_plugin(script)
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
        let mut hanging = shell_plugin("exec sleep 1000");
        hanging.timeout = Duration::from_millis(300);
        let err = hanging.run().await.err().expect("times out");
        assert!(err.to_string().contains("did not finish within"), "{err}");
    }

    #[tokio::test]
    async fn exec_info_carries_the_version_interactivity_and_cluster_when_asked() {
        let mut with_cluster = shell_plugin("true");
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
            serde_json::from_str(&shell_plugin("true").exec_info()).expect("json");
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
            let mut exec = shell_plugin("true").exec;
            exec.interactive_mode = configured.clone();
            let plugin = Plugin::new(exec, terminal, Duration::from_secs(1)).expect("command");
            assert_eq!(
                plugin.interactive, expected,
                "{configured:?}, terminal: {terminal}"
            );
        }
    }
}
