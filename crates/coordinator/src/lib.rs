//! Which replica works on which cluster, for fleet controllers run as
//! several replicas: the [`Coordinator`](multicluster_runtime::coordinator::Coordinator)s
//! of [`multicluster-runtime`](multicluster_runtime) that need Leases.
//!
//! - [`leader_election::LeaderElection`]: one Lease holder works on
//!   everything, the other replicas stand by with warm caches;
//! - [`sharding::ShardedCoordinator`] (feature `sharding`, on by default):
//!   the replicas share the fleet, each cluster fenced by a Lease of its
//!   own.
//!
//! Give one to the manager (`Manager::builder(..).coordinator(..)`).

pub(crate) mod fence;
pub mod leader_election;
pub(crate) mod lease;
mod names;
#[cfg(feature = "sharding")]
pub mod sharding;
pub(crate) mod wire;

pub(crate) use names::dns1123;
#[cfg(feature = "sharding")]
pub(crate) use names::lease_name;

/// Locks `mutex`, carrying on if a holder panicked (the data is as it was
/// left; the panic is reported where it happened).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A client error as text safe to log (see `multicluster_runtime::redact`).
pub(crate) fn kube_error(err: &kube::Error) -> String {
    multicluster_runtime::redact::Redacted::kube(err).to_string()
}

/// A watch error as text safe to log.
pub(crate) fn watcher_error(err: &kube::runtime::watcher::Error) -> String {
    multicluster_runtime::redact::watcher(err).to_string()
}
