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
    /// Run an allowlisted command with this variable set, which changes
    /// what code it runs.
    ExecEnvironment(String),
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
        match self {
            Refused::Exec => f.write_str(
                "runs a command, which kubeconfigs from this source may not (KubeconfigPolicy::exec allows it)",
            ),
            Refused::ExecNotAllowed => f.write_str(
                "is not on the exec plugin allowlist (KubeconfigPolicy::exec)",
            ),
            Refused::ExecUnresolved => f.write_str(
                "is neither an absolute path nor a name found on PATH, so it cannot be checked against the exec plugin allowlist (KubeconfigPolicy::exec)",
            ),
            Refused::ExecEnvironment(variable) => write!(
                f,
                "sets {variable:?}, which changes what code an allowlisted plugin runs (only ExecPolicy::AllowAll allows it)"
            ),
            Refused::LocalFile => f.write_str(
                "names a local file, which kubeconfigs from this source may not read (KubeconfigPolicy::local_files allows it)",
            ),
            Refused::AuthProvider => f.write_str(
                "uses an auth provider, which kubeconfigs from this source may not (KubeconfigPolicy::auth_providers allows it)",
            ),
            Refused::InsecureSkipTlsVerify => f.write_str(
                "turns off verifying the server's certificate, which kubeconfigs from this source may not (KubeconfigPolicy::insecure_skip_tls_verify allows it)",
            ),
            Refused::ProxyUrl => f.write_str(
                "picks a proxy, which kubeconfigs from this source may not (KubeconfigPolicy::proxy_url allows it)",
            ),
        }
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
