//! Errors of the core crate.

use crate::ClusterName;

/// What can go wrong in providers, clusters and the manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No cluster of that name is engaged (Go: `ErrClusterNotFound`).
    #[error("cluster {0} not found")]
    ClusterNotFound(ClusterName),
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
        reason: crate::redact::Redacted,
    },
    /// A provider or component was started twice.
    #[error("{0} already started")]
    AlreadyStarted(&'static str),
    /// A call to a cluster's API server failed. The message goes through
    /// [`crate::redact::kube_error`], so a failed credential plugin's
    /// settings never show.
    #[error("cluster {cluster}: {}", crate::redact::kube_error(source))]
    Kube {
        /// The cluster the call went to.
        cluster: ClusterName,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A kubeconfig that cannot be used. The message names where it came
    /// from and what is wrong, and never quotes it.
    #[error("kubeconfig from {origin}: {reason}")]
    InvalidKubeconfig {
        /// Where the kubeconfig came from (Secret, file, command).
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A kubeconfig whose credentials could not be obtained: its exec
    /// credential plugin failed or gave nothing usable. Worth another try
    /// later. The message never quotes the plugin's settings or output.
    #[error("kubeconfig from {origin}: {reason}")]
    Credentials {
        /// Where the kubeconfig came from (Secret, file, command).
        origin: String,
        /// What failed.
        reason: String,
    },
    /// Anything else, with a message that names what failed.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// Whether trying the same thing again later may work: credentials that
    /// could not be obtained, an API server that failed or was not ready.
    /// A kubeconfig that is simply wrong is not: it needs a change.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Credentials { .. } | Self::Kube { .. } | Self::NotReady { .. }
        )
    }
}
