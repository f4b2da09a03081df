//! What a policy refused, said so that the operator knows which field and
//! which policy field would allow it, and never what the field held.

/// One field a kubeconfig uses that its policy does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusal {
    /// Where in the kubeconfig, as its YAML spells it
    /// (`users["admin"].user.tokenFile`).
    pub field: String,
    /// What it would have done.
    pub refused: Refused,
}

impl Refusal {
    pub(super) fn new(field: String, refused: Refused) -> Self {
        Self { field, refused }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.field, self.refused)
    }
}

/// What a refused field would have done, and what would allow it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// Run a command, with exec plugins denied.
    Exec,
    /// Run a command that is not on the allowlist.
    ExecNotAllowed,
    /// Run a command that cannot be checked against the allowlist: a
    /// relative path, or a name `PATH` does not find.
    ExecUnresolved,
    /// Run an allowlisted command with this variable set, which the
    /// operator did not name for it.
    ExecEnvironment(String),
    /// Send an allowlisted plugin's credentials to a server outside the
    /// servers it is bound to.
    ServerNotBound,
    /// Speak to the server in plain HTTP, credentials in the clear.
    PlainHttp,
    /// Present a credential that cannot be sent in an HTTP header (it
    /// holds a control character: CR, LF, NUL, ...). Nothing allows it.
    InvalidCredential,
    /// Name a server no request can be made on (no scheme, no host, user
    /// info, port 0, ...): a client built on it would panic or fail on
    /// its first request. Nothing allows it.
    InvalidServer(super::BadServer),
    /// Read a local file.
    LocalFile,
    /// Use an auth provider.
    AuthProvider,
    /// Skip verifying the server's certificate.
    InsecureSkipTlsVerify,
    /// Pick the proxy.
    ProxyUrl,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (does, option) = match self {
            Refused::ExecNotAllowed => {
                return f.write_str("is not on the exec plugin allowlist (KubeconfigPolicy::exec)");
            }
            Refused::ExecUnresolved => {
                return f.write_str(
                    "is neither an absolute path nor a name found on PATH, so it cannot be checked against the exec plugin allowlist (KubeconfigPolicy::exec)",
                );
            }
            Refused::ExecEnvironment(variable) => {
                return write!(
                    f,
                    "sets {variable:?}, a variable not named for this plugin (AllowedPlugin::env names them; variables that change what code it runs never can be)"
                );
            }
            Refused::ServerNotBound => {
                return f.write_str(
                    "is not among the servers its exec plugin's credentials may be sent to (AllowedPlugin::servers)",
                );
            }
            Refused::InvalidCredential => {
                return f.write_str(
                    "cannot be sent in an HTTP header: it holds a control character (CR, LF, NUL, ...)",
                );
            }
            Refused::InvalidServer(bad) => {
                return write!(f, "{bad}, so no request can be made on it");
            }
            Refused::Exec => ("runs a command", "exec"),
            Refused::LocalFile => ("names a local file", "local_files"),
            Refused::AuthProvider => ("uses an auth provider", "auth_providers"),
            Refused::InsecureSkipTlsVerify => (
                "turns off verifying the server's certificate",
                "insecure_skip_tls_verify",
            ),
            Refused::ProxyUrl => ("picks a proxy", "proxy_url"),
            Refused::PlainHttp => (
                "is plain http://, which sends the credentials in the clear",
                "plain_http",
            ),
        };
        write!(
            f,
            "{does}, which kubeconfigs from this source may not (KubeconfigPolicy::{option} allows it)"
        )
    }
}

/// Several refusals as one line.
pub(crate) fn describe(refused: &[Refusal]) -> String {
    refused
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
