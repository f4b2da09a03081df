//! The types every crate of multicluster-runtime shares, with no I/O of
//! their own: a cluster's name ([`ClusterName`]), where a cluster stands
//! ([`ClusterState`], [`ClusterStatus`]) and how its requests and watches
//! are doing ([`health`]), error text safe to log and serve
//! ([`redact::Redacted`]), and the setters of options structs
//! ([`option_setters!`]).
//!
//! Users reach all of it through `multicluster-runtime`, which re-exports
//! it; a crate that only needs these types (a provider's types, a test
//! harness) can depend on this one alone. What holds them:
//!
//! | module | why here |
//! |---|---|
//! | [`name`](ClusterName) | every crate names clusters |
//! | [`state`](ClusterState) | the manager reports it, providers report their unusable inventory in it |
//! | [`health`] | the member-client stack records how requests end; the runtime reads it into a cluster's state |
//! | [`redact`] | every text that leaves the process is built here, whichever crate builds it |
//!
//! The provider contract itself (`Aware`, `Provider`, `RunnableProvider`,
//! `ProviderContext`) stays in `multicluster-runtime` beside `Cluster`: a
//! cluster carries its cache, and a contract here could only name it
//! type-erased, which would turn `cluster.cache()` into an extension
//! trait every reconciler imports.

pub mod health;
mod name;
pub mod redact;
mod setters;
mod state;

pub use name::ClusterName;
pub use state::{ClusterState, ClusterStatus};

/// Locks `mutex`, carrying on if a holder panicked: a panic inside one of
/// the workspace's short critical sections is reported where it happened,
/// and the fleet keeps working with the data as it was left.
#[doc(hidden)]
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
