//! What a propagation's controller watches (the hub objects, the
//! propagated types in members, what else decides a hub object's
//! members) and its reconciler.

use std::sync::Arc;

use kube::api::ApiResource;
use serde::Serialize;

use super::{Concerns, HubKey, Shared, StatusTarget, key_of};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::{CacheEvent, CachedResource};
use multicluster_runtime::controller::{
    Action, ClusterScope, ControllerBuilder, MapContext, ReconcileError, Request, Watch, filters,
    map,
};

/// The hub's sources: the hub objects themselves, and a change of one as a
/// request in every member it has or may have objects in (not a change of
/// only what this propagation writes on it, its status, or every status
/// write would apply again in every member); a member joining gets every
/// hub object's request, one leaving makes every status drop it, and
/// members chosen by their labels are decided again when those change.
pub(super) fn hub_sources<K>(
    builder: ControllerBuilder,
    shared: &Arc<Shared<K>>,
) -> ControllerBuilder
where
    K: CachedResource + Serialize,
{
    let concerned = || {
        let shared = shared.clone();
        move |hub: &K| shared.concerns(hub)
    };
    let changed_beyond_status = filters::custom({
        let status = shared.status.clone();
        move |event: &CacheEvent<K>| match event {
            CacheEvent::Applied {
                old: Some(old),
                new,
            } => beyond_status(old.as_ref(), &status) != beyond_status(new.as_ref(), &status),
            _ => true,
        }
    });
    let to_members = {
        let shared = shared.clone();
        move |context: &MapContext<'_>, hub: &K| {
            if !shared.concerns(hub) {
                return Vec::new();
            }
            shared.member_requests(context.engaged_clusters(), &key_of(hub))
        }
    };
    let builder = builder
        .for_resource(Watch::<K>::new().clusters(ClusterScope::Local))
        .watches(
            Watch::<K>::new()
                .clusters(ClusterScope::Local)
                .filter(changed_beyond_status),
            to_members,
        )
        .owed_on_engage(map::local_objects::<K>(concerned()))
        .owed_on_disengage(map::local_requests::<K>(concerned()));
    // A member's labels decide its selection (`members_labelled`) and
    // whether it is taken out for maintenance: a change is every hub
    // object's request in that member, and on the hub (its rollout and
    // status count the members again).
    let in_member = map::local_objects::<K>(concerned());
    let on_hub = map::local_requests::<K>(concerned());
    builder.owed_on_relabel(move |name, controller| {
        let mut owed = in_member(name, controller);
        owed.extend(on_hub(name, controller));
        owed
    })
}

/// The members' sources: each propagated type, watched in members
/// (metadata only), mapped back to the hub object it was made for.
pub(super) fn member_sources<K>(
    mut builder: ControllerBuilder,
    shared: &Arc<Shared<K>>,
) -> ControllerBuilder
where
    K: CachedResource + Serialize,
{
    for kind in shared.kinds.clone() {
        let shared = shared.clone();
        builder = kind.watched_by(
            builder,
            Arc::new(move |context, meta| {
                shared
                    .hub_of(meta)
                    .map(|(namespace, name)| vec![context.here(namespace.as_deref(), name)])
                    .unwrap_or_default()
            }),
        );
    }
    builder
}

/// What else decides the members of a hub object (`reselect_on`): a change
/// of it is a request for the hub objects it concerns, in the hub and in
/// every member they have or may have objects in.
pub(super) fn reselect_sources<K>(
    mut builder: ControllerBuilder,
    shared: &Arc<Shared<K>>,
    reselect: Vec<(ApiResource, Concerns)>,
) -> ControllerBuilder
where
    K: CachedResource + Serialize,
{
    for (resource, concerns) in reselect {
        let shared = shared.clone();
        builder = builder.watches_dynamic(
            resource,
            Watch::new().clusters(ClusterScope::Local),
            move |context, object| {
                let mut hubs: Vec<HubKey> = concerns(context, object)
                    .into_iter()
                    .map(|request| (request.namespace, request.name))
                    .collect();
                hubs.sort();
                hubs.dedup();
                hubs.into_iter()
                    .flat_map(|key| {
                        let hub =
                            Request::new(ClusterName::local(), key.0.as_deref(), key.1.as_str());
                        shared
                            .member_requests(context.engaged_clusters(), &key)
                            .into_iter()
                            .chain(std::iter::once(hub))
                    })
                    .collect()
            },
        );
    }
    builder
}

/// One reconcile of the propagation, under way.
type Reconciling =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Action, ReconcileError>> + Send>>;

/// The reconciler: a hub object's request reconciles it on the hub (its
/// finalizer and status), a member's applies what it wants there.
pub(super) fn reconciler<K>(
    shared: Arc<Shared<K>>,
) -> impl Fn(Request, Cluster) -> Reconciling + Send + Sync + 'static
where
    K: CachedResource + Serialize,
{
    move |request, cluster| {
        let shared = shared.clone();
        Box::pin(async move {
            if request.cluster.is_local() {
                shared.reconcile_hub(request, cluster).await
            } else {
                shared.reconcile_member(request, cluster).await
            }
        })
    }
}

/// What of a hub object its members' objects may depend on: all of it
/// but what the server keeps (`resourceVersion`, `managedFields`) and what
/// the propagation writes (`status`).
fn beyond_status<K: Serialize>(hub: &K, status: &StatusTarget) -> Option<serde_json::Value> {
    let mut value = serde_json::to_value(hub).ok()?;
    if let Some(metadata) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
        if let StatusTarget::Annotation(key) = status
            && let Some(annotations) = metadata
                .get_mut("annotations")
                .and_then(|a| a.as_object_mut())
        {
            annotations.remove(key);
            if let Some(rollout) = status.rollout_annotation() {
                annotations.remove(&rollout);
            }
        }
    }
    if let Some(object) = value.as_object_mut() {
        object.remove("status");
    }
    Some(value)
}
