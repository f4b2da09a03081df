//! Scoped views: a cache that shows one namespace of a host cache as the
//! `default` namespace of a virtual cluster (the namespace provider's view).
//!
//! A view's informer is fed from the host's informer of the same type, not
//! from the API server, so one host watch per type serves every virtual
//! cluster. The view keeps its own store of the rewritten objects (their
//! `metadata.namespace` reads `default`), so its lists and index queries
//! answer with virtual-cluster names.

use std::hash::Hash;
use std::sync::Arc;

use futures::{Stream, StreamExt, stream};
use kube::Resource;
use kube::runtime::watcher;

use super::{CacheEvent, Informer};

use super::Cache;

/// The namespace a scoped view shows its host namespace as.
pub(crate) const VIRTUAL_NAMESPACE: &str = Cache::VIRTUAL_NAMESPACE;

/// Watcher-style events for the objects of `namespace` in `host`, renamed
/// into [`VIRTUAL_NAMESPACE`]. Waits for the host's first list, then reports
/// it as the view's initial list.
pub(crate) fn events<K>(
    host: Arc<Informer<K>>,
    namespace: String,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    stream::once(async move {
        host.wait_ready().await;
        let (snapshot, subscription) = host.snapshot_and_subscribe();
        let initial: Vec<_> = std::iter::once(watcher::Event::Init)
            .chain(
                snapshot
                    .into_iter()
                    .filter_map(|obj| rename(&*obj, &namespace))
                    .map(watcher::Event::InitApply),
            )
            .chain(std::iter::once(watcher::Event::InitDone))
            .collect();
        let changes = subscription.filter_map(move |event| {
            let renamed = match &event {
                CacheEvent::Applied { new, .. } => {
                    rename(&**new, &namespace).map(watcher::Event::Apply)
                }
                CacheEvent::Deleted(obj) => rename(&**obj, &namespace).map(watcher::Event::Delete),
            };
            std::future::ready(renamed)
        });
        stream::iter(initial).chain(changes).map(Ok)
    })
    .flatten()
}

/// A copy of `obj` in the virtual namespace, if it lives in `namespace`.
fn rename<K: Resource + Clone>(obj: &K, namespace: &str) -> Option<K> {
    if obj.meta().namespace.as_deref() != Some(namespace) {
        return None;
    }
    let mut renamed = obj.clone();
    renamed.meta_mut().namespace = Some(VIRTUAL_NAMESPACE.to_string());
    Some(renamed)
}
