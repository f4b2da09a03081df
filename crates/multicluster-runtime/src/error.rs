//! Errors of the core crate.

use multicluster_core::ClusterName;

/// What can go wrong in providers, clusters and the manager. New variants
/// may come: match with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No cluster of that name is engaged (Go: `ErrClusterNotFound`).
    #[error("cluster {0} not found")]
    ClusterNotFound(ClusterName),
    /// The cluster exists, but this replica does not work on it now (another
    /// replica holds it, or this one stands by): see
    /// [`crate::Manager::get_cluster`].
    #[error("cluster {0} is not worked on by this replica")]
    NotOwned(ClusterName),
    /// A cluster of that name is already present.
    #[error("cluster {0} already exists")]
    ClusterExists(ClusterName),
    /// A cluster did not become reachable and synced in time.
    #[error("cluster {name} not ready within {timeout:?}: {reason}")]
    NotReady {
        /// The cluster.
        name: ClusterName,
        /// How long was waited.
        timeout: std::time::Duration,
        /// The last failure seen.
        reason: multicluster_core::redact::Redacted,
    },
    /// A provider or component was started twice.
    #[error("{0} already started")]
    AlreadyStarted(&'static str),
    /// A call to a cluster's API server failed. The message goes through
    /// [`multicluster_core::redact::Redacted::kube`], so a failed credential plugin's
    /// settings never show.
    #[error("cluster {cluster}: {}", multicluster_core::redact::kube_error(source))]
    Kube {
        /// The cluster the call went to.
        cluster: ClusterName,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A member client could not be built from a kubeconfig: it is
    /// invalid, its policy refused it, or its credentials could not be
    /// obtained ([`multicluster_client::Error`]; the message is its own).
    #[cfg(feature = "kubeconfig")]
    #[error(transparent)]
    Client(#[from] multicluster_client::Error),
    /// Settings that cannot work: the message names the component, the
    /// field and what is wrong with it.
    #[error("{component}: {reason}")]
    InvalidOptions {
        /// What was being set up (`sharding options`, `controller x`, ...).
        component: String,
        /// What is wrong.
        reason: String,
    },
    /// A provider of that name is already present (multi provider).
    #[error("provider {0:?} already added")]
    ProviderExists(String),
    #[cfg(feature = "kubeconfig")]
    /// An external command (a CLI such as `kind`) could not be run, failed
    /// or printed something unusable.
    #[error("`{command}` {reason}")]
    Command {
        /// The command line, as run.
        command: String,
        /// What went wrong.
        reason: String,
        /// The error it came from, if any (starting or waiting for the
        /// command).
        #[source]
        source: Option<multicluster_client::process::ProcessError>,
    },
    /// A watch a component depends on could not start or ended.
    #[error("watching {what}: {source}")]
    Watch {
        /// What was watched (files, a cache's namespaces, ...).
        what: String,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An admission webhook's files or registration could not be used
    /// (`multicluster-webhook`); `what` names the file or the member.
    #[error("webhook {what}: {reason}")]
    Webhook {
        /// The file, or the member and configuration.
        what: String,
        /// What went wrong (redacted).
        reason: String,
        /// The error it came from, if any (reading a file, a call to the
        /// member's API server, parsing a certificate).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A listening socket could not be bound.
    #[error("binding {address}: {source}")]
    Bind {
        /// The address.
        address: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A task the library runs in the background stopped abnormally (it
    /// panicked or was cancelled).
    #[error("{task} failed: {source}")]
    TaskFailed {
        /// Which task.
        task: &'static str,
        /// How it ended.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl Error {
    /// Whether trying the same thing again later may work: credentials that
    /// could not be obtained, an API server that failed or was not ready.
    /// A kubeconfig that is simply wrong is not: it needs a change.
    pub fn is_retryable(&self) -> bool {
        match self {
            #[cfg(feature = "kubeconfig")]
            #[cfg(feature = "kubeconfig")]
            Self::Client(err) => err.is_retryable(),
            Self::Kube { .. } | Self::NotReady { .. } => true,
            _ => false,
        }
    }
}
