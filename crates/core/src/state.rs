//! Where a cluster stands, as the manager reports it (`multicluster_runtime::manager`
//! re-exports it), and how it got there.

use std::time::SystemTime;

use crate::redact::Redacted;

/// A cluster's state with its recent history, as
/// `Manager::cluster_states` and
/// `/clusters` report it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterStatus {
    /// Where it stands.
    pub state: ClusterState,
    /// When it entered that state. A new reason for the same state (another
    /// error while it stays unreachable) keeps the time.
    pub since: SystemTime,
    /// How many attempts in a row have failed: checks of its API server
    /// while it is brought up; then the errors in a row of the watch or
    /// request whose failure decides its state; for unusable inventory, the
    /// provider's attempts to make a cluster of it. 0 when it is syncing or
    /// ready.
    pub failed_attempts: u32,
    /// When it is tried next, if that is scheduled: the next check while it
    /// is brought up; after, the earlier of its failing watch's next
    /// attempt and the manager's next probe of its API server. `None` when
    /// nothing waits for a retry (ready, syncing, unusable: the provider
    /// tries again when the inventory object changes or its retry comes).
    pub next_attempt: Option<SystemTime>,
    /// While it is syncing, what it waits for, when that is known: its
    /// client being built (a credential plugin that has not answered yet).
    pub waiting_for: Option<Redacted>,
}

/// Where a cluster stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterState {
    /// Engaged by the provider; waiting for its API server to answer, then
    /// (handed to the components) for the watches they started in it to
    /// list.
    Syncing,
    /// Its API server answers, every watch that this replica's components
    /// started in it when it was handed to them has listed, and nothing
    /// fails. On a replica whose coordinator gives the cluster's work to
    /// another replica (sharding), nothing watches it yet: ready then says
    /// only that it answers, and the watches started when this replica
    /// takes it over report through degraded or unreachable if they fail.
    Ready,
    /// Handed to the components, but some of its watches or requests keep
    /// failing with an answer from the server (a `403` after lost RBAC, a
    /// `404` for a CRD that is not installed); the reason says which. A
    /// cluster whose watches are refused from the start is degraded without
    /// being ready first. Ready once they work.
    Degraded(Redacted),
    /// The API server cannot be reached, does not answer in time, or the
    /// watches did not list within `sync_timeout`; the reason is the last
    /// error. Before the cluster is handed to the components, the check is
    /// retried with backoff; after, it is probed with backoff and is ready
    /// again once it answers and its watches have listed.
    Unreachable(Redacted),
    /// Not a cluster yet: the provider found it in its inventory but cannot
    /// make a cluster of it (a Secret without its key, a kubeconfig naming a
    /// user it lacks, a credential plugin that fails); the reason says why.
    /// A cluster already engaged under the name keeps its own state.
    Unusable(Redacted),
    /// Not a cluster of its own: the provider found an inventory object
    /// describing a cluster it holds under the name given (two
    /// ClusterProfiles with one `multicluster.x-k8s.io/inventory-member-id`,
    /// say). Nothing is built for it; it takes over when the object the
    /// cluster comes from goes, if it can.
    Duplicate(crate::name::ClusterName),
}

impl ClusterStatus {
    /// A status of `state` since `since`, after `failed_attempts`, tried
    /// next at `next_attempt`: for the runtime's reports.
    #[doc(hidden)]
    pub fn from_parts(
        state: ClusterState,
        since: SystemTime,
        failed_attempts: u32,
        next_attempt: Option<SystemTime>,
    ) -> Self {
        Self {
            state,
            since,
            failed_attempts,
            next_attempt,
            waiting_for: None,
        }
    }

    /// The same status, waiting for `what`: for the runtime's reports.
    #[doc(hidden)]
    pub fn waiting_for(self, what: Redacted) -> Self {
        Self {
            waiting_for: Some(what),
            ..self
        }
    }
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
            ClusterState::Duplicate(_) => "duplicate",
        }
    }

    /// The state's place in the engaged clusters' counts (the order of
    /// the runtime's metrics' `cluster_states`); an engaged cluster is never
    /// unusable or a duplicate.
    #[doc(hidden)]
    pub fn index(&self) -> usize {
        match self {
            ClusterState::Syncing => 0,
            ClusterState::Ready => 1,
            ClusterState::Degraded(_) => 2,
            ClusterState::Unreachable(_)
            | ClusterState::Unusable(_)
            | ClusterState::Duplicate(_) => 3,
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
