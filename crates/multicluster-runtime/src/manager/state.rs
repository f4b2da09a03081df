//! Where a cluster stands, as the manager reports it.

use crate::redact::Redacted;

/// Where a cluster stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterState {
    /// Engaged by the provider; waiting for the API server and cache.
    Syncing,
    /// Handed to the components, and working.
    Ready,
    /// Handed to the components, but some of its watches keep failing with
    /// an answer from the server (a `403` after lost RBAC, say); the reason
    /// says which. Ready again once they work.
    Degraded(Redacted),
    /// The API server cannot be reached, does not answer in time, or the
    /// cache did not sync; the reason is the last error. Before the cluster
    /// is handed to the components, the check is retried with backoff; after,
    /// it is probed with backoff and is ready again once it answers.
    Unreachable(Redacted),
    /// Not a cluster yet: the provider found it in its inventory but cannot
    /// make a cluster of it (a Secret without its key, a kubeconfig naming a
    /// user it lacks, a credential plugin that fails); the reason says why.
    /// A cluster already engaged under the name keeps its own state.
    Unusable(Redacted),
}

impl ClusterState {
    /// The state's name as `/clusters` and `mcr_clusters{state}` show it.
    pub fn label(&self) -> &'static str {
        match self {
            ClusterState::Syncing => "syncing",
            ClusterState::Ready => "ready",
            ClusterState::Degraded(_) => "degraded",
            ClusterState::Unreachable(_) => "unreachable",
            ClusterState::Unusable(_) => "unusable",
        }
    }

    /// The state's place in the engaged clusters' counts (the order of
    /// [`crate::metrics`]'s `cluster_states`); an engaged cluster is never
    /// unusable.
    pub(super) fn index(&self) -> usize {
        match self {
            ClusterState::Syncing => 0,
            ClusterState::Ready => 1,
            ClusterState::Degraded(_) => 2,
            ClusterState::Unreachable(_) | ClusterState::Unusable(_) => 3,
        }
    }
}

impl From<crate::health::Health> for ClusterState {
    fn from(health: crate::health::Health) -> Self {
        match health {
            crate::health::Health::Healthy => ClusterState::Ready,
            crate::health::Health::Degraded(reason) => ClusterState::Degraded(reason),
            crate::health::Health::Unreachable(reason) => ClusterState::Unreachable(reason),
        }
    }
}
