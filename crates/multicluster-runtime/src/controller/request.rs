//! What a reconcile is about and what it asks for next.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use multicluster_core::ClusterName;

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

    /// Annotation on an object made for another object in another cluster:
    /// the owner's `namespace/name` (or `name` when cluster-scoped). Owner
    /// references cannot cross clusters; this convention of the library's
    /// mappers ([`crate::controller::map::to_owner`]) can.
    pub const OWNER_ANNOTATION: &'static str = "mcr.sigs.k8s.io/owner";

    /// Annotation naming the cluster of the owner in
    /// [`Request::OWNER_ANNOTATION`]; absent (or empty) for the local
    /// cluster, the usual hub.
    pub const OWNER_CLUSTER_ANNOTATION: &'static str = "mcr.sigs.k8s.io/owner-cluster";

    /// The annotations that make an object point at this request's object
    /// as its owner, for [`crate::controller::map::to_owner`].
    pub fn owner_annotations(&self) -> BTreeMap<String, String> {
        let key = match &self.namespace {
            Some(namespace) => format!("{namespace}/{}", self.name),
            None => self.name.clone(),
        };
        let mut annotations = BTreeMap::from([(Self::OWNER_ANNOTATION.to_string(), key)]);
        if !self.cluster.is_local() {
            annotations.insert(
                Self::OWNER_CLUSTER_ANNOTATION.to_string(),
                self.cluster.as_str().to_string(),
            );
        }
        annotations
    }

    /// The owner an object names with [`Request::owner_annotations`], if
    /// any.
    pub fn owner_of<K: Resource>(object: &K) -> Option<Request> {
        Self::owner_in(object.meta())
    }

    /// The owner that `meta`'s annotations name, if any.
    pub fn owner_in(meta: &ObjectMeta) -> Option<Request> {
        let annotations = meta.annotations.as_ref()?;
        let key = annotations.get(Self::OWNER_ANNOTATION)?;
        let cluster = annotations
            .get(Self::OWNER_CLUSTER_ANNOTATION)
            .map_or_else(ClusterName::local, |name| ClusterName::from(name.as_str()));
        let (namespace, name) = match key.split_once('/') {
            Some((namespace, name)) => (Some(namespace), name),
            None => (None, key.as_str()),
        };
        (!name.is_empty()).then(|| Request::new(cluster, namespace, name))
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
