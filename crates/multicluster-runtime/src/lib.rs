//! Kubernetes controllers that reconcile across a dynamic fleet of clusters.
//!
//! The model, as in Go's `sigs.k8s.io/multicluster-runtime`:
//!
//! - a [`Provider`] discovers clusters and *engages* each one, with a
//!   lifetime that ends when the cluster leaves the fleet;
//! - every [`Aware`] component (the [`Manager`], each
//!   [`controller::Controller`]) receives the engagement and works on that
//!   cluster until its lifetime ends;
//! - a [`Cluster`] is a `kube::Client` and a shared [`cache::Cache`] with one
//!   watch per resource type;
//! - [`provider::clusters::Clusters`] is the set providers keep their
//!   clusters in; [`provider`] holds what provider authors build on, and
//!   [`coordinator`] decides which replica works on which cluster.
//!
//! The empty [`ClusterName`] is the local cluster.
//!
//! Each part is usable alone: the cache without a controller, a controller
//! without a manager.
//!
#![doc = include_str!("../README.md")]

pub mod cache;
mod cluster;
pub mod controller;
pub mod coordinator;
pub mod engagements;
mod error;
pub mod fleet;
pub mod health;
pub mod manager;
pub mod metrics;
pub mod multicluster;
mod open_files;
pub mod provider;
pub mod redact;
mod sync;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;

/// A log filter (`tracing_subscriber::EnvFilter` directives) under which
/// the runtime's rule for failures that go on holds: `info` for this
/// library, `warn` for kube-rs, and `error` for kube-runtime's watcher,
/// which warns at every retry of a refused watch (a 403 every few seconds,
/// the whole error in `Debug` form) where the runtime tells it once, then
/// as a reminder every five minutes. Use it as the default when
/// `RUST_LOG` is unset:
///
/// ```ignore
/// tracing_subscriber::EnvFilter::try_from_default_env()
///     .unwrap_or_else(|_| multicluster_runtime::LOG_FILTER.into())
/// ```
pub const LOG_FILTER: &str = "info,kube=warn,kube_runtime::watcher=error";

pub use cluster::{Cluster, Inventory};
pub use error::Error;
pub use manager::{Manager, ManagerBuilder, ManagerOptions};
pub use multicluster::{Aware, InventoryEngaged, Provider, ProviderContext, RunnableProvider};
#[cfg(feature = "kubeconfig")]
pub use multicluster_client as client;
#[cfg(feature = "kubeconfig")]
pub use multicluster_client::process;
pub use multicluster_core::{ClusterName, option_setters};
