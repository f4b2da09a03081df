//! How a watch is limited to the cache's namespace restriction, by resource
//! scope. Public in a private module: a bound of
//! [`CachedResource`](super::CachedResource) that no user implements.

use kube::Api;
use kube::core::{ClusterResourceScope, DynamicResourceScope, NamespaceResourceScope, Resource};

/// How a watch is limited to the cache's namespace restriction, by resource
/// scope: namespaced resources are watched in that namespace only,
/// cluster-scoped ones everywhere.
#[allow(unreachable_pub)]
pub trait WatchScope: 'static {
    /// Applies the restriction to `api`.
    fn restrict<K: Resource<Scope = Self>>(api: Api<K>, namespace: &str) -> Api<K>;
}

impl WatchScope for NamespaceResourceScope {
    fn restrict<K: Resource<Scope = Self>>(api: Api<K>, namespace: &str) -> Api<K> {
        api.constrain(namespace)
    }
}

impl WatchScope for DynamicResourceScope {
    fn restrict<K: Resource<Scope = Self>>(api: Api<K>, namespace: &str) -> Api<K> {
        api.constrain(namespace)
    }
}

impl WatchScope for ClusterResourceScope {
    fn restrict<K: Resource<Scope = Self>>(api: Api<K>, _namespace: &str) -> Api<K> {
        api
    }
}
