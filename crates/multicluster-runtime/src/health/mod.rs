//! How a cluster is doing, as the requests of its client and the watches of
//! its cache see it ([`multicluster_core::health`], re-exported here).

pub use multicluster_core::health::*;
