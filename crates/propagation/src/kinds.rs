//! The member types a propagation makes, registered with
//! [`Propagation::propagates`](super::Propagation::propagates): each is
//! watched in the members, metadata only, so that a change made there is
//! seen and what the propagation made can be found again (after a restart
//! too) to be removed.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, PartialObjectMeta};
use kube::core::Resource;

use multicluster_runtime::Cluster;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{ControllerBuilder, MapContext, Request, Watch};

/// Maps a member object's metadata to the requests it causes.
pub(super) type MetaMapper =
    Arc<dyn Fn(&MapContext<'_>, &ObjectMeta) -> Vec<Request> + Send + Sync>;

/// The metadata of a member's objects of one type that pass a test;
/// `None` while the member's watch of the type has not listed yet.
type Find =
    Arc<dyn Fn(&Cluster, &dyn Fn(&ObjectMeta) -> bool) -> Option<Vec<ObjectMeta>> + Send + Sync>;

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
    pub(super) fn of<T>() -> Self
    where
        T: CachedResource,
        PartialObjectMeta<T>: CachedResource,
    {
        Self {
            resource: ApiResource::erase::<T>(&()),
            // Only the watch the member's source started: a look never
            // starts one.
            find: Arc::new(|cluster, keep| {
                let informer = cluster.cache().started_informer::<PartialObjectMeta<T>>()?;
                informer.is_ready().then(|| {
                    informer
                        .list(None)
                        .into_iter()
                        .map(|object| object.meta().clone())
                        .filter(|meta| keep(meta))
                        .collect()
                })
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

    /// The metadata of `cluster`'s objects of this type that `keep`
    /// accepts; `None` until the member's watch of the type has listed.
    pub(super) fn find(
        &self,
        cluster: &Cluster,
        keep: &dyn Fn(&ObjectMeta) -> bool,
    ) -> Option<Vec<ObjectMeta>> {
        (self.find)(cluster, keep)
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
