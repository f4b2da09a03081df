//! What provider authors build on.
//!
//! The contract itself, [`Provider`](crate::multicluster::Provider),
//! [`RunnableProvider`](crate::multicluster::RunnableProvider) and
//! [`Aware`](crate::multicluster::Aware), is in [`crate::multicluster`]
//! (and at the crate root). The modules below are the parts the providers
//! of this workspace are made of, for out-of-tree providers to use as well:
//!
//! - [`clusters`]: the set a provider keeps its clusters in;
//! - [`discovery`]: a provider as a controller over its management
//!   cluster, building several clients at once;
//! - [`kubeconfig`]: a cluster to build from kubeconfig text, as a
//!   provider found it (the client itself comes from [`crate::client`]);
//! - [`member`]: the client and cache options a provider builds each
//!   member with, the same for all or chosen per inventory object;
//! - [`failures`]: per-object failure records and their metrics;
//! - [`watch_filter`]: the `cluster.x-k8s.io/watch-filter` label
//!   convention.

pub mod clusters;
pub mod discovery;
pub mod failures;
#[cfg(feature = "kubeconfig")]
pub mod kubeconfig;
#[cfg(feature = "kubeconfig")]
pub mod member;
pub mod watch_filter;

/// Locks a `std::sync::Mutex`, carrying on with the data as it was left if
/// a holder panicked: what every provider of this workspace uses for its
/// short critical sections.
pub use multicluster_core::lock;
