//! PlacementDecisions (`multicluster.x-k8s.io/v1alpha2`, or `v1alpha1` on
//! a hub serving only that: see [`crate::version`]): a scheduler's choice
//! of ClusterProfiles, which consumers such as this library read to act on
//! the chosen clusters only.
//!
//! A decision of more than 100 clusters is spread over several slices
//! (PlacementDecision objects) carrying one `decision-key` label and
//! ordered by their `decision-index` label; slices made for one workload
//! carry its `placement-key` label. A hub object follows one decision,
//! named by a [`DecisionKey`] the controller works out from the object.
//! [`Placements`] reads the slices from a hub cache, merges them and
//! resolves each `clusterProfileRef` to the name the ClusterProfile
//! provider engages it under (`<namespace>/<name>`, the namespace
//! defaulting to the slice's, or the profile's inventory member id when it
//! carries one); another provider's clusters are reached through a name
//! mapping of the user's ([`Placements::naming`]).
//!
//! Three mappers make a propagating controller follow the decisions:
//!
//! - [`Placements::to_placed_clusters`] (a hub object's events → a request
//!   in each chosen cluster),
//! - [`Placements::on_decision`] (a slice's events → a request in each
//!   cluster it lists or listed, for every hub object following it, so a
//!   cluster removed from a decision gets the request that cleans it up),
//! - [`Placements::owed`] (a cluster that joins later → the requests of
//!   the hub objects whose decisions chose it).
//!
//! The reconciler asks [`Placements::chosen`] whether the request's
//! cluster is chosen now, and makes or removes its copy accordingly.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use kube::api::{ApiResource, DynamicObject};
use kube::core::Resource;
use multicluster_runtime::cache::{Cache, CachedResource};
use multicluster_runtime::controller::{Controller, MapContext, Request};
use multicluster_runtime::{Cluster, ClusterName, Error};

use crate::ApiVersion;

/// The label all slices of one decision carry (`DecisionKeyLabel`).
pub const DECISION_KEY_LABEL: &str = "multicluster.x-k8s.io/decision-key";
/// The label ordering the slices of one decision, from 0
/// (`DecisionIndexLabel`).
pub const DECISION_INDEX_LABEL: &str = "multicluster.x-k8s.io/decision-index";
/// The label tying slices to the workload they were made for
/// (`PlacementKeyLabel`).
pub const PLACEMENT_KEY_LABEL: &str = "multicluster.x-k8s.io/placement-key";

/// Which slices a hub object follows: those in its namespace (every
/// namespace, for a cluster-scoped object) labelled with this key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DecisionKey {
    /// Slices labelled `multicluster.x-k8s.io/placement-key=<value>`.
    Placement(String),
    /// Slices labelled `multicluster.x-k8s.io/decision-key=<value>`.
    Decision(String),
}

impl DecisionKey {
    fn label(&self) -> (&'static str, &str) {
        match self {
            DecisionKey::Placement(value) => (PLACEMENT_KEY_LABEL, value),
            DecisionKey::Decision(value) => (DECISION_KEY_LABEL, value),
        }
    }

    fn labels_slice(&self, slice: &DynamicObject) -> bool {
        let (key, value) = self.label();
        slice
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(key))
            .is_some_and(|have| have == value)
    }
}

/// Resolves a `clusterProfileRef` (namespace, name) to a cluster name.
type Naming = Arc<dyn Fn(&str, &str) -> Option<ClusterName> + Send + Sync>;

/// The PlacementDecisions a hub cache holds, merged per decision and
/// resolved to cluster names. Cheap to clone.
#[derive(Clone)]
pub struct Placements {
    hub: Cache,
    resource: ApiResource,
    naming: Naming,
}

impl std::fmt::Debug for Placements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placements")
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

/// How long [`Placements::new`] waits for the hub's ClusterProfiles to be
/// listed before it resolves references without them.
const PROFILES_LISTED_WITHIN: Duration = Duration::from_secs(30);

impl Placements {
    /// The PlacementDecisions of `hub` (the cluster holding them: usually
    /// the manager's local cluster, whose watch of them a controller's
    /// `watches_dynamic(placements.resource(), ..)` shares), naming
    /// clusters as the ClusterProfile provider does.
    ///
    /// Asks the hub's discovery which versions it serves (the newest is
    /// read, see [`crate::version`]) and waits (up to 30 s) until the hub's
    /// ClusterProfiles are listed in its cache, so that a reference to a
    /// profile carrying an inventory member id resolves to the member's
    /// name from the first decision on.
    pub async fn new(hub: &Cluster) -> Result<Self, Error> {
        let client = hub.client();
        let served = |plural: &'static str| {
            let client = client.clone();
            async move {
                ApiVersion::served(&client, plural)
                    .await
                    .map_err(|source| Error::Kube {
                        cluster: hub.name().clone(),
                        source,
                    })
                    .map(|version| version.unwrap_or(ApiVersion::V1Alpha1))
            }
        };
        let decisions = served("placementdecisions").await?;
        let profiles = served("clusterprofiles").await?.resource("ClusterProfile");
        let cache = hub.cache().clone();
        let informer = cache.dynamic(&profiles);
        if tokio::time::timeout(PROFILES_LISTED_WITHIN, informer.wait_ready())
            .await
            .is_err()
        {
            tracing::warn!(
                "the hub's ClusterProfiles are not listed after {PROFILES_LISTED_WITHIN:?}; references resolve to <namespace>/<name> until they are"
            );
        }
        let naming_cache = cache.clone();
        Ok(Self {
            hub: cache,
            resource: decisions.resource("PlacementDecision"),
            naming: Arc::new(move |namespace, name| {
                let member = naming_cache
                    .dynamic(&profiles)
                    .get(Some(namespace), name)
                    .and_then(|profile| crate::inventory_member::id(&profile).map(str::to_string));
                Some(ClusterName::from(
                    member.unwrap_or_else(|| format!("{namespace}/{name}")),
                ))
            }),
        })
    }

    /// The PlacementDecision resource in the version read.
    pub fn resource(&self) -> ApiResource {
        self.resource.clone()
    }

    /// The version of the API the decisions are read through.
    pub fn api_version(&self) -> Option<ApiVersion> {
        ApiVersion::of(&DynamicObject::new("", &self.resource))
    }

    /// Resolves a `clusterProfileRef` (namespace, name) with `naming`
    /// instead, for fleets of another provider (the profile's cluster
    /// engaged under another name); `None` skips the reference.
    #[must_use]
    pub fn naming(
        mut self,
        naming: impl Fn(&str, &str) -> Option<ClusterName> + Send + Sync + 'static,
    ) -> Self {
        self.naming = Arc::new(naming);
        self
    }

    /// The clusters the decision `key` names for an object in `namespace`
    /// (`None`: cluster-scoped, slices of every namespace), in the
    /// decision's order: slices by `decision-index` (those without one
    /// last, then by name), each slice's list as written, duplicates
    /// dropped.
    pub fn clusters(&self, namespace: Option<&str>, key: &DecisionKey) -> Vec<ClusterName> {
        let mut slices: Vec<Arc<DynamicObject>> = self
            .hub
            .dynamic(&self.resource)
            .list(namespace)
            .into_iter()
            .filter(|slice| key.labels_slice(slice))
            .collect();
        slices.sort_by_key(|slice| {
            let index = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(DECISION_INDEX_LABEL))
                .and_then(|index| index.parse::<u64>().ok());
            (index.is_none(), index, slice.metadata.name.clone())
        });
        let mut seen = BTreeSet::new();
        slices
            .iter()
            .flat_map(|slice| self.listed(slice))
            .filter(|cluster| seen.insert(cluster.clone()))
            .collect()
    }

    /// Whether the decision `key` chooses `cluster` for an object in
    /// `namespace`.
    pub fn chosen(
        &self,
        namespace: Option<&str>,
        key: &DecisionKey,
        cluster: &ClusterName,
    ) -> bool {
        self.clusters(namespace, key).contains(cluster)
    }

    /// The clusters one slice lists, in its order.
    fn listed(&self, slice: &DynamicObject) -> Vec<ClusterName> {
        let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
        slice.data["decisions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|decision| {
                let reference = &decision["clusterProfileRef"];
                let name = reference["name"].as_str().filter(|name| !name.is_empty())?;
                let namespace = reference["namespace"]
                    .as_str()
                    .filter(|namespace| !namespace.is_empty())
                    .unwrap_or(namespace);
                (self.naming)(namespace, name)
            })
            .collect()
    }

    /// For a hub `K`'s events ([`ControllerBuilder::watches`](multicluster_runtime::controller::ControllerBuilder::watches)
    /// on the local cluster): a request for the same namespace and name in
    /// each cluster its decision chooses. `key_of` tells which decision an
    /// object follows (`None`: none, no request).
    pub fn to_placed_clusters<K: Resource>(
        &self,
        key_of: impl Fn(&K) -> Option<DecisionKey> + Send + Sync + 'static,
    ) -> impl Fn(&MapContext<'_>, &K) -> Vec<Request> + Send + Sync + 'static {
        let placements = self.clone();
        move |_, object| {
            let meta = object.meta();
            let (Some(name), Some(key)) = (meta.name.as_deref(), key_of(object)) else {
                return Vec::new();
            };
            placements
                .clusters(meta.namespace.as_deref(), &key)
                .into_iter()
                .map(|cluster| Request::new(cluster, meta.namespace.as_deref(), name))
                .collect()
        }
    }

    /// For the slices' events (`watches_dynamic(placements.resource(),
    /// ..)` on the local cluster): for every hub `K` following the slice's
    /// decision, a request in each cluster the slice lists now or listed
    /// when last seen. A cluster added is so owed its copy, and one
    /// removed (or whose slice was deleted) the request that removes it.
    pub fn on_decision<K: CachedResource>(
        &self,
        key_of: impl Fn(&K) -> Option<DecisionKey> + Send + Sync + 'static,
    ) -> impl Fn(&MapContext<'_>, &DynamicObject) -> Vec<Request> + Send + Sync + 'static {
        let placements = self.clone();
        // The clusters each slice (namespace, name) listed when last seen,
        // so that those it drops are told.
        let seen: Mutex<HashMap<(String, String), BTreeSet<ClusterName>>> = Mutex::default();
        move |_, slice| {
            let namespace = slice.metadata.namespace.clone().unwrap_or_default();
            let name = slice.metadata.name.clone().unwrap_or_default();
            let now: BTreeSet<ClusterName> = placements.listed(slice).into_iter().collect();
            let exists = placements
                .hub
                .dynamic(&placements.resource)
                .get(Some(&namespace), &name)
                .is_some();
            let before = {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let key = (namespace.clone(), name);
                let before = if exists {
                    seen.insert(key, now.clone())
                } else {
                    seen.remove(&key)
                };
                before.unwrap_or_default()
            };
            let clusters: BTreeSet<&ClusterName> = now.iter().chain(&before).collect();
            placements
                .hub
                .informer::<K>()
                .list(None)
                .into_iter()
                .filter(|object| {
                    let meta = object.meta();
                    meta.namespace.as_deref().is_none_or(|ns| ns == namespace)
                        && key_of(object).is_some_and(|key| key.labels_slice(slice))
                })
                .flat_map(|object| {
                    let meta = object.meta();
                    let name = meta.name.clone().unwrap_or_default();
                    let namespace = meta.namespace.clone();
                    clusters.iter().map(move |cluster| {
                        Request::new((*cluster).clone(), namespace.as_deref(), name.clone())
                    })
                })
                .collect()
        }
    }

    /// For [`owed_on_engage`](multicluster_runtime::controller::ControllerBuilder::owed_on_engage):
    /// when a cluster is engaged, a request in it for every hub `K` whose
    /// decision chooses it.
    pub fn owed<K: CachedResource>(
        &self,
        key_of: impl Fn(&K) -> Option<DecisionKey> + Send + Sync + 'static,
    ) -> impl Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync + 'static {
        let placements = self.clone();
        move |cluster, _| {
            placements
                .hub
                .informer::<K>()
                .list(None)
                .into_iter()
                .filter_map(|object| {
                    let meta = object.meta();
                    let key = key_of(&object)?;
                    placements
                        .chosen(meta.namespace.as_deref(), &key, cluster)
                        .then(|| {
                            Request::new(
                                cluster.clone(),
                                meta.namespace.as_deref(),
                                meta.name.clone().unwrap_or_default(),
                            )
                        })
                })
                .collect()
        }
    }
}
