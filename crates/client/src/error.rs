//! Why a member client could not be built.

/// Why a member client could not be built from a kubeconfig. Messages name
/// where the kubeconfig came from and what is wrong, and never quote it.
/// New variants may come: match with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A kubeconfig that cannot be used until it is changed. The message
    /// names where it came from and what is wrong, and never quotes it (nor
    /// passes on a YAML parser's message, which can quote a token).
    #[error("invalid kubeconfig from {origin}: {reason}")]
    InvalidKubeconfig {
        /// Where the kubeconfig came from (Secret, file, command).
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A kubeconfig that uses what its source may not: a command, a local
    /// file, an auth provider, a proxy or no TLS verification, refused by
    /// the [`KubeconfigPolicy`](super::KubeconfigPolicy) of the
    /// provider that read it before anything in it was run, read or
    /// dialled. The message names each refused field and the policy field
    /// that would allow it, never the field's value. It needs a change of
    /// the kubeconfig (or of the policy), not a retry.
    #[error(
        "kubeconfig from {origin} refused (context {context:?}): {}",
        super::policy::describe(refused)
    )]
    KubeconfigRefused {
        /// Where the kubeconfig came from (Secret, file, command).
        origin: String,
        /// The context it would have been used through.
        context: String,
        /// Each field the policy refused.
        refused: Vec<super::Refusal>,
    },
    /// A kubeconfig whose credentials could not be obtained this time: its
    /// exec credential plugin failed, timed out or gave nothing usable.
    /// Worth another try later (providers retry with backoff). The message
    /// never quotes the plugin's settings, output or (unless asked) stderr.
    #[error(
        "credentials for the kubeconfig from {origin} ({user}) could not be obtained; it will be tried again: {source}"
    )]
    Credentials {
        /// Where the kubeconfig came from (Secret, file, command).
        origin: String,
        /// The context and user whose plugin failed.
        user: String,
        /// What failed.
        #[source]
        source: super::credentials::CredentialError,
    },
    /// Settings that cannot work (a policy, client options): the message
    /// names the component, the field and what is wrong with it.
    #[error("{component}: {reason}")]
    InvalidOptions {
        /// What was being set up (`kubeconfig policy`, `client options`).
        component: String,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// Whether trying again later may work: credentials that could not be
    /// obtained this time. A kubeconfig that is wrong or refused needs a
    /// change instead.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Credentials { .. })
    }
}
