//! The member types a propagation makes, registered with
//! [`Propagation::propagates`](super::Propagation::propagates): each is
//! watched in the members, metadata only, so that a change made there is
//! seen and what the propagation made can be found again (after a restart
//! too) to be removed.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, PartialObjectMeta};
use kube::core::Resource;

use super::{HubKey, PROPAGATION_LABEL};
use multicluster_runtime::Cluster;
use multicluster_runtime::cache::{CachedResource, FieldIndex};
use multicluster_runtime::controller::{ControllerBuilder, MapContext, Request, Watch};

/// Maps a member object's metadata to the requests it causes.
pub(super) type MetaMapper =
    Arc<dyn Fn(&MapContext<'_>, &ObjectMeta) -> Vec<Request> + Send + Sync>;

/// What is looked for among a member's objects of one type.
pub(super) enum Query<'a> {
    /// Those this propagation made for the hub object (an index).
    MadeFor(&'a HubKey),
    /// The one of this name, if it is there.
    Named(Option<&'a str>, &'a str),
}

/// The metadata of a member's objects of one type that a query finds;
/// `None` while the member's watch of the type has not listed yet.
type Find = Arc<dyn Fn(&Cluster, &Query<'_>) -> Option<Vec<ObjectMeta>> + Send + Sync>;

/// Adds the member watch of one type to a controller.
type AddWatch = Arc<dyn Fn(ControllerBuilder, MetaMapper) -> ControllerBuilder + Send + Sync>;

/// One member type a propagation makes.
#[derive(Clone)]
pub(super) struct Kind {
    pub(super) resource: ApiResource,
    find: Find,
    add_watch: AddWatch,
}

impl Kind {
    /// The type `T`, as the propagation `propagation` makes it.
    pub(super) fn of<T>(propagation: &str) -> Self
    where
        T: CachedResource,
        PartialObjectMeta<T>: CachedResource,
    {
        // The member objects each hub object's reconcile looks at are
        // found by an index of the member's cache, not a scan of it: a
        // member holds the objects of many hub objects.
        let name = propagation.to_string();
        let index = FieldIndex::new::<PartialObjectMeta<T>>(
            format!("{PROPAGATION_LABEL}/hub-of/{propagation}"),
            move |object| {
                hub_of(&name, object.meta())
                    .map(|key| indexed(&key))
                    .into_iter()
                    .collect()
            },
        );
        Self {
            resource: ApiResource::erase::<T>(&()),
            // Only the watch the member's source started: a look never
            // starts one.
            find: Arc::new(move |cluster, query| {
                let informer = cluster.cache().started_informer::<PartialObjectMeta<T>>()?;
                if !informer.is_ready() {
                    return None;
                }
                let found = match query {
                    Query::MadeFor(key) => {
                        cluster.cache().index_field(&index);
                        informer.by_index(index.field(), &indexed(key), None)
                    }
                    Query::Named(namespace, name) => {
                        informer.get(*namespace, name).into_iter().collect()
                    }
                };
                Some(found.iter().map(|object| object.meta().clone()).collect())
            }),
            add_watch: Arc::new(|builder, mapper| {
                builder.watches(
                    Watch::<PartialObjectMeta<T>>::new(),
                    move |context, object: &PartialObjectMeta<T>| mapper(context, object.meta()),
                )
            }),
        }
    }

    /// Whether this is the type of `resource` (same group, version and
    /// kind).
    pub(super) fn is(&self, resource: &ApiResource) -> bool {
        self.resource.group == resource.group
            && self.resource.version == resource.version
            && self.resource.kind == resource.kind
    }

    /// The metadata of `cluster`'s objects of this type that `query`
    /// finds; `None` until the member's watch of the type has listed.
    pub(super) fn find(&self, cluster: &Cluster, query: &Query<'_>) -> Option<Vec<ObjectMeta>> {
        (self.find)(cluster, query)
    }

    /// `builder` with the member watch of this type, mapped by `mapper`.
    pub(super) fn watched_by(
        &self,
        builder: ControllerBuilder,
        mapper: MetaMapper,
    ) -> ControllerBuilder {
        (self.add_watch)(builder, mapper)
    }
}

/// The hub object a member object was made for by the propagation
/// `propagation`: labelled as its, pointing at a hub object.
pub(super) fn hub_of(propagation: &str, meta: &ObjectMeta) -> Option<HubKey> {
    let ours = meta
        .labels
        .as_ref()
        .and_then(|labels| labels.get(PROPAGATION_LABEL))
        .is_some_and(|value| value == propagation);
    if !ours {
        return None;
    }
    Request::owner_in(meta)
        .filter(|owner| owner.cluster.is_local())
        .map(|owner| (owner.namespace, owner.name))
}

/// A hub object's key as the index holds it (a hub object's name has no
/// `/`, so the two parts never run together).
fn indexed((namespace, name): &HubKey) -> String {
    format!("{}/{name}", namespace.as_deref().unwrap_or_default())
}
