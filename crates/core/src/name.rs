//! Cluster names.

use std::fmt;
use std::sync::Arc;

/// The name of a cluster in the fleet: cheap to clone and compare.
///
/// The empty name means the local cluster, the one the manager itself runs
/// against, as in the Go library.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterName(Arc<str>);

impl ClusterName {
    /// The local cluster's name (empty).
    pub fn local() -> Self {
        Self::default()
    }

    /// Whether this names the local cluster.
    pub fn is_local(&self) -> bool {
        self.0.is_empty()
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_local() {
            f.write_str("<local>")
        } else {
            f.write_str(&self.0)
        }
    }
}

impl fmt::Debug for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for ClusterName {
    fn from(name: &str) -> Self {
        Self(name.into())
    }
}

impl From<String> for ClusterName {
    fn from(name: String) -> Self {
        Self(name.into())
    }
}

impl From<&String> for ClusterName {
    fn from(name: &String) -> Self {
        Self(name.as_str().into())
    }
}

impl AsRef<str> for ClusterName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for ClusterName {
    fn borrow(&self) -> &str {
        &self.0
    }
}
