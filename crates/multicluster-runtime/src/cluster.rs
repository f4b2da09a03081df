//! One cluster of the fleet: its name, a client and a cache.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::watch;

use crate::cache::Cache;
use kube::runtime::events::{Recorder, Reporter};
use multicluster_core::ClusterName;

use multicluster_core::health::{Failure, Health, Requests};

/// A cluster as providers hand it out and reconcilers receive it.
///
/// Cheap to clone; clones share the client and the cache. A provider can back
/// a cluster with *scoped views*: the client may be any `kube::Client` (for
/// example one whose service rewrites paths into a host namespace) and the
/// cache may be a view of another cluster's cache ([`Cache::scoped`]), so one
/// host watch can serve many virtual clusters.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    name: ClusterName,
    client: kube::Client,
    cache: Cache,
    stable_id: Option<String>,
    /// How the client's requests end, when its client records that.
    requests: Option<Requests>,
    /// Events recorders by reporter, so that repeated Events are counted
    /// as series (kube-runtime keeps that count per recorder).
    recorders: std::sync::Mutex<std::collections::HashMap<Reporter, Recorder>>,
    /// Shared by the handles derived from one another (`with_stable_id`),
    /// so the provider's updates reach every one.
    inventory: Arc<watch::Sender<Arc<Inventory>>>,
}

/// What the inventory says of a cluster besides how to reach it: the
/// labels and annotations of the object it came from (a kubeconfig Secret, a Cluster API
/// `Cluster`, a `ClusterProfile`, a `Namespace`) and properties the
/// provider documents (a ClusterProfile's `status.properties`, a Cluster
/// API cluster's topology class). Sources select clusters by these labels
/// ([`Watch::cluster_labels`](crate::controller::Watch::cluster_labels)).
///
/// A change of labels or properties alone updates them in place
/// ([`Cluster::set_inventory`]): the cluster keeps its client, cache and
/// engagement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The inventory object's labels.
    pub labels: BTreeMap<String, String>,
    /// The inventory object's annotations, but for
    /// `kubectl.kubernetes.io/last-applied-configuration` (for a Secret it
    /// holds the Secret's data, the credentials, and inventories are
    /// logged): settings too long or too free for a label (a
    /// propagation's maintenance windows).
    pub annotations: BTreeMap<String, String>,
    /// Further facts the provider knows, by name.
    pub properties: BTreeMap<String, String>,
}

/// The annotation `kubectl apply` keeps its last input in.
const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl Inventory {
    /// An inventory with these labels and no annotations or properties.
    pub fn labelled(labels: BTreeMap<String, String>) -> Self {
        Self {
            labels,
            ..Self::default()
        }
    }

    /// The labels and annotations of an inventory object (no properties).
    pub fn of_object(metadata: &ObjectMeta) -> Self {
        let mut annotations = metadata.annotations.clone().unwrap_or_default();
        annotations.remove(LAST_APPLIED_ANNOTATION);
        Self {
            labels: metadata.labels.clone().unwrap_or_default(),
            annotations,
            properties: BTreeMap::new(),
        }
    }
}

impl Cluster {
    /// A cluster whose cache watches through `client`.
    pub fn new(name: impl Into<ClusterName>, client: kube::Client) -> Self {
        let name = name.into();
        let cache = Cache::new(name.clone(), client.clone());
        Self::with_cache(name, client, cache)
    }

    /// The local cluster (the one the manager runs against), under the
    /// local name ([`ClusterName::local`]): logs, spans and `/clusters`
    /// call it `<local>` throughout, and requests for it carry that name.
    pub fn local(client: kube::Client) -> Self {
        Self::new(ClusterName::local(), client)
    }

    /// A cluster with an explicit cache, e.g. a scoped view.
    pub fn with_cache(name: impl Into<ClusterName>, client: kube::Client, cache: Cache) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.into(),
                client,
                cache,
                stable_id: None,
                requests: None,
                recorders: std::sync::Mutex::default(),
                inventory: Arc::new(watch::Sender::new(Arc::default())),
            }),
        }
    }

    /// Attaches a stable cluster ID (e.g. the `cluster.clusterset.k8s.io`
    /// ClusterProperty), for logs, metrics and sharding keys.
    #[must_use]
    pub fn with_stable_id(self, id: impl Into<String>) -> Self {
        let inner = &self.inner;
        Self {
            inner: Arc::new(Inner {
                name: inner.name.clone(),
                client: inner.client.clone(),
                cache: inner.cache.clone(),
                stable_id: Some(id.into()),
                requests: inner.requests.clone(),
                recorders: std::sync::Mutex::default(),
                inventory: inner.inventory.clone(),
            }),
        }
    }

    /// This cluster, judged also by how `requests` (its client's) end.
    #[cfg(feature = "kubeconfig")]
    pub(crate) fn watching_requests(self, requests: Requests) -> Self {
        let inner = &self.inner;
        Self {
            inner: Arc::new(Inner {
                name: inner.name.clone(),
                client: inner.client.clone(),
                cache: inner.cache.clone(),
                stable_id: inner.stable_id.clone(),
                requests: Some(requests),
                recorders: std::sync::Mutex::default(),
                inventory: inner.inventory.clone(),
            }),
        }
    }

    /// How the cluster is doing, as its client's requests (for clients
    /// built from kubeconfigs) and its cache's watches see it: see
    /// [`crate::health`].
    pub fn health(&self) -> Health {
        self.failure()
            .map_or(Health::Healthy, |failure| failure.health())
    }

    /// What is failing on the cluster, if anything: a server that cannot
    /// be reached first, then a watch's failure (its reason quotes the
    /// server's answer), then a request's.
    pub(crate) fn failure(&self) -> Option<Failure> {
        let requests = self.inner.requests.as_ref().and_then(Requests::failure);
        if requests.as_ref().is_some_and(|failure| failure.unreachable) {
            return requests;
        }
        self.inner.cache.failure().or(requests)
    }

    /// Whether nothing checks the connections of its client: its requests
    /// are recorded (a client built from a kubeconfig) and its latest
    /// answer came over HTTP/1.1, whose connections have no pings.
    pub(crate) fn lacks_pings(&self) -> bool {
        self.inner
            .requests
            .as_ref()
            .is_some_and(|requests| !requests.over_http2())
    }

    /// The name the provider created the cluster with; used in logs.
    pub fn name(&self) -> &ClusterName {
        &self.inner.name
    }

    /// A client for the cluster.
    pub fn client(&self) -> kube::Client {
        self.inner.client.clone()
    }

    /// Records Events (`events.k8s.io/v1`) in this cluster, through its
    /// client, as `reporter` (a controller name, e.g.
    /// `Cluster::recorder("copy-controller")`, with this host as the
    /// instance, or a [`Reporter`] with both). One recorder per reporter
    /// and cluster, kept with the cluster, so an Event repeated within
    /// kube-runtime's window is counted as a series instead of written
    /// again. A namespace provider's virtual cluster writes its Events into
    /// its host namespace, as every other object.
    ///
    /// ```no_run
    /// # async fn demo(cluster: multicluster_runtime::Cluster, cm: k8s_openapi::api::core::v1::ConfigMap) -> kube::Result<()> {
    /// use kube::Resource;
    /// use kube::runtime::events::{Event, EventType};
    /// cluster
    ///     .recorder("copy-controller")
    ///     .publish(
    ///         &Event {
    ///             type_: EventType::Normal,
    ///             reason: "Copied".into(),
    ///             note: Some("copied into cm-copy".into()),
    ///             action: "Copy".into(),
    ///             secondary: None,
    ///         },
    ///         &cm.object_ref(&()),
    ///     )
    ///     .await
    /// # }
    /// ```
    pub fn recorder(&self, reporter: impl Into<Reporter>) -> Recorder {
        let reporter = reporter.into();
        multicluster_core::lock(&self.inner.recorders)
            .entry(reporter.clone())
            .or_insert_with(|| Recorder::new(self.inner.client.clone(), reporter))
            .clone()
    }

    /// The cluster's shared cache.
    pub fn cache(&self) -> &Cache {
        &self.inner.cache
    }

    /// The labels and properties the inventory gives the cluster now
    /// (empty for providers without an inventory object).
    pub fn inventory(&self) -> Arc<Inventory> {
        self.inner.inventory.borrow().clone()
    }

    /// The cluster's labels now: [`Inventory::labels`].
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.inner.inventory.borrow().labels.clone()
    }

    /// Replaces the cluster's labels and properties (what providers call
    /// when their inventory object changed in nothing else); returns
    /// whether they changed. Sources selecting by label follow at once.
    pub fn set_inventory(&self, inventory: Inventory) -> bool {
        self.inner.inventory.send_if_modified(|now| {
            if **now == inventory {
                return false;
            }
            *now = Arc::new(inventory);
            true
        })
    }

    /// Follows the cluster's labels and properties: the receiver holds
    /// the current ones and wakes at each change.
    pub fn inventory_changes(&self) -> watch::Receiver<Arc<Inventory>> {
        self.inner.inventory.subscribe()
    }

    /// The stable cluster ID, when the provider knows one.
    pub fn stable_id(&self) -> Option<&str> {
        self.inner.stable_id.as_deref()
    }

    /// Whether two handles are the same cluster instance (not merely the
    /// same name): engaging the same instance twice is a no-op, a different
    /// instance under one name replaces the old one.
    pub fn same_instance(&self, other: &Cluster) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.inner.name)
            .field("stable_id", &self.inner.stable_id)
            .field("labels", &self.inner.inventory.borrow().labels)
            .finish_non_exhaustive()
    }
}
