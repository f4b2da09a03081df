//! What a reconcile is about and what it asks for next.

use std::fmt;
use std::time::Duration;

use crate::name::ClusterName;

/// What to reconcile: an object in a cluster.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    /// The cluster ([`ClusterName::local`] for the local cluster).
    pub cluster: ClusterName,
    /// The object's namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl Request {
    /// A request for `namespace/name` in `cluster`.
    pub fn new(
        cluster: impl Into<ClusterName>,
        namespace: Option<&str>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}/{}", self.cluster, ns, self.name),
            None => write!(f, "{}/{}", self.cluster, self.name),
        }
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What to do after a successful reconcile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile again after `after`, even without a change.
    pub fn requeue(after: Duration) -> Self {
        Self {
            requeue_after: Some(after),
        }
    }

    /// Reconcile again only when something changes.
    pub fn await_change() -> Self {
        Self::default()
    }

    /// The requeue delay, if any.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}
