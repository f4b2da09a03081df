//! Ready mappers for controllers that work across clusters, for
//! [`ControllerBuilder::watches`](super::ControllerBuilder::watches)
//! and [`ControllerBuilder::owed_on_engage`](super::ControllerBuilder::owed_on_engage).
//!
//! The two patterns fleet controllers share:
//!
//! - **Propagation**: an object on the hub (the local cluster) is made in
//!   every member. [`to_every_member`] turns a hub event into a request for
//!   the same key in each engaged member, and [`local_objects`] gives a
//!   member that joins later the requests for the hub's objects.
//! - **Aggregation**: what happens to the members' objects is reported back
//!   to the hub object they were made for. A member object names its owner
//!   with the annotations of [`Request::owner_annotations`]
//!   ([`Request::OWNER_ANNOTATION`], and
//!   [`Request::OWNER_CLUSTER_ANNOTATION`] when the owner is not in the
//!   local cluster), and [`to_owner`] maps its events to that owner.
//!
//! Owner references cannot cross clusters, hence the annotations: a
//! convention of this library, which nothing else in Kubernetes reads.

use kube::Resource;
use kube::core::{Selector, SelectorExt};

use super::{Controller, MapContext, Request};
use crate::cache::CachedResource;
use multicluster_core::ClusterName;

/// Maps an object to the same namespace and name in every engaged cluster
/// but the one it was seen in and the local cluster: a hub object to its
/// copies in the members.
pub fn to_every_member<K: Resource>() -> impl Fn(&MapContext<'_>, &K) -> Vec<Request> + Send + Sync
{
    |context, object| {
        let meta = object.meta();
        let Some(name) = meta.name.as_deref() else {
            return Vec::new();
        };
        context
            .engaged_clusters()
            .into_iter()
            .filter(|cluster| !cluster.is_local() && cluster != context.cluster())
            .map(|cluster| Request::new(cluster, meta.namespace.as_deref(), name))
            .collect()
    }
}

/// [`to_every_member`] for the members whose labels
/// ([`Cluster::inventory`](crate::Cluster::inventory)) `selector` matches
/// now: a hub object propagated to some of the fleet.
///
/// To follow members relabelled in and out, give the member-side watch the
/// same selector ([`Watch::cluster_labels`](super::Watch::cluster_labels))
/// and use [`local_objects`] for both
/// [`owed_on_engage`](super::ControllerBuilder::owed_on_engage) and
/// [`owed_on_disengage`](super::ControllerBuilder::owed_on_disengage): a
/// member entering the selection gets a request per hub object, and so
/// does one leaving it, whose reconcile finds the member no longer
/// selected (`selector.matches(&cluster.inventory().labels)`) and removes
/// the copies.
pub fn to_members_matching<K: Resource>(
    selector: Selector,
) -> impl Fn(&MapContext<'_>, &K) -> Vec<Request> + Send + Sync {
    move |context, object| {
        let meta = object.meta();
        let Some(name) = meta.name.as_deref() else {
            return Vec::new();
        };
        context
            .engaged_clusters()
            .into_iter()
            .filter(|cluster| !cluster.is_local() && cluster != context.cluster())
            .filter(|cluster| {
                context
                    .engaged(cluster)
                    .is_some_and(|cluster| selector.matches(&cluster.inventory().labels))
            })
            .map(|cluster| Request::new(cluster, meta.namespace.as_deref(), name))
            .collect()
    }
}

/// Maps an object to the owner it names with [`Request::owner_annotations`]: a
/// member's copy to the hub object it was made for.
pub fn to_owner<K: Resource>() -> impl Fn(&MapContext<'_>, &K) -> Vec<Request> + Send + Sync {
    |_, object| Request::owner_of(object).into_iter().collect()
}

/// For [`owed_on_engage`](super::ControllerBuilder::owed_on_engage): when
/// a member is engaged, a request for it for every `K` in the local
/// cluster's cache that `keep` accepts (same namespace and name). Nothing
/// for the local cluster itself, nor while it is not engaged; objects the
/// local cache has not listed yet reach the member through their own
/// events, mapped by [`to_every_member`].
pub fn local_objects<K: CachedResource>(
    keep: impl Fn(&K) -> bool + Send + Sync + 'static,
) -> impl Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync {
    move |member, controller| {
        if member.is_local() {
            return Vec::new();
        }
        requests_for_local(controller, member, &keep)
    }
}

/// For [`owed_on_disengage`](super::ControllerBuilder::owed_on_disengage):
/// a request in the local cluster for every `K` of its cache that `keep`
/// accepts, whichever cluster left (a hub object counting its members is
/// counted again when one leaves). Nothing while the local cluster is not
/// engaged.
pub fn local_requests<K: CachedResource>(
    keep: impl Fn(&K) -> bool + Send + Sync + 'static,
) -> impl Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync {
    move |_, controller| requests_for_local(controller, &ClusterName::local(), &keep)
}

/// A request in `target` for every `K` of the local cluster's cache that
/// `keep` accepts; none while the local cluster is not engaged.
fn requests_for_local<K: CachedResource>(
    controller: &Controller,
    target: &ClusterName,
    keep: &impl Fn(&K) -> bool,
) -> Vec<Request> {
    let Some(local) = controller.cluster(&ClusterName::local()) else {
        return Vec::new();
    };
    local
        .cache()
        .informer::<K>()
        .list(None)
        .into_iter()
        .filter(|object| keep(object))
        .filter_map(|object| {
            let meta = object.meta();
            let name = meta.name.as_deref()?;
            Some(Request::new(
                target.clone(),
                meta.namespace.as_deref(),
                name,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    fn annotated(annotations: BTreeMap<String, String>) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.annotations = Some(annotations);
        object
    }

    #[test]
    fn owner_annotations_round_trip() {
        for owner in [
            Request::new(ClusterName::local(), Some("team"), "settings"),
            Request::new("hub-2", Some("team"), "settings"),
            Request::new(ClusterName::local(), None, "cluster-wide"),
        ] {
            let object = annotated(owner.owner_annotations());
            assert_eq!(Request::owner_of(&object), Some(owner));
        }
    }

    #[test]
    fn objects_without_an_owner_map_to_nothing() {
        assert_eq!(Request::owner_of(&ConfigMap::default()), None);
        let empty = annotated(BTreeMap::from([(
            Request::OWNER_ANNOTATION.to_string(),
            "team/".to_string(),
        )]));
        assert_eq!(Request::owner_of(&empty), None);
    }
}
