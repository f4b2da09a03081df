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
//! - [`clusters::Clusters`] is the set providers keep their clusters in.
//!
//! The empty [`ClusterName`] is the local cluster.
//!
//! Each part is usable alone: the cache without a controller, a controller
//! without a manager.
//!
#![doc = include_str!("../README.md")]

pub mod cache;
mod cluster;
pub mod clusters;
mod connection;
pub mod controller;
pub mod credentials;
pub mod discovery;
mod engagements;
mod error;
pub mod failures;
pub mod health;
pub mod kubeconfig;
pub mod leader_election;
pub mod manager;
pub mod metrics;
mod name;
pub mod process;
mod provider;
pub mod redact;
mod setters;
pub mod sharding;
mod sync;
pub mod testing;
pub mod watch_filter;

pub use cluster::Cluster;
pub use error::Error;
pub use manager::{Manager, ManagerBuilder, ManagerOptions};
pub use name::ClusterName;
pub use provider::{Aware, Provider, RunnableProvider};
