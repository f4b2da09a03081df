//! What a controller knows of its primary type once `for_resource` named
//! it, without the type: the objects of a cluster (for
//! `reconcile_all_on`), and a reference to the object a request is about
//! (for the warning Event of a failed reconcile).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Reporter};

use super::{ReconcileError, Request};
use crate::cache::CachedResource;
use crate::cluster::Cluster;
use multicluster_core::ClusterName;
use multicluster_core::redact::Redacted;

/// A cluster's cached primary objects, as (namespace, name).
type ListFn = dyn Fn(&Cluster) -> Vec<(Option<String>, String)> + Send + Sync;
/// A reference to the cached object of a request.
type ReferenceFn = dyn Fn(&Cluster, &Request) -> Option<ObjectReference> + Send + Sync;

/// The primary type's operations, built by `for_resource::<K>()`.
#[derive(Clone)]
pub(super) struct Primary {
    list: Arc<ListFn>,
    reference: Arc<ReferenceFn>,
    /// The clusters that refused a warning Event already (told once at
    /// warn level each; the identity usually lacks the right to write
    /// Events there).
    refused: Arc<Mutex<HashSet<ClusterName>>>,
}

impl Primary {
    pub(super) fn of<K: CachedResource>() -> Self {
        Self {
            // Only where the primary type is watched already: a look must
            // not start a watch in a cluster it is not meant for (one that
            // refuses it would turn degraded).
            list: Arc::new(|cluster| {
                let Some(informer) = cluster.cache().started_informer::<K>() else {
                    return Vec::new();
                };
                informer
                    .list(None)
                    .iter()
                    .filter_map(|object| {
                        let meta = object.meta();
                        Some((meta.namespace.clone(), meta.name.clone()?))
                    })
                    .collect()
            }),
            reference: Arc::new(|cluster, request| {
                let object = cluster
                    .cache()
                    .started_informer::<K>()?
                    .get(request.namespace.as_deref(), &request.name)?;
                Some(object.object_ref(&()))
            }),
            refused: Arc::default(),
        }
    }

    /// The cached primary objects of `cluster`, as (namespace, name).
    pub(super) fn list(&self, cluster: &Cluster) -> Vec<(Option<String>, String)> {
        (self.list)(cluster)
    }

    /// Publishes a warning Event about the object of a failed reconcile, in
    /// its cluster, if the object is cached (a deleted object gets none).
    /// A failure to publish is only logged: the reconcile's own error is
    /// what counts.
    pub(super) async fn warn(
        &self,
        reporter: &Reporter,
        request: &Request,
        cluster: &Cluster,
        error: &ReconcileError,
    ) {
        let Some(regarding) = (self.reference)(cluster, request) else {
            return;
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "ReconcileFailed".into(),
            note: Some(Redacted::error(error.as_ref()).as_str().to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = cluster
            .recorder(reporter.clone())
            .publish(&event, &regarding)
            .await
        {
            let first = multicluster_core::lock(&self.refused).insert(request.cluster.clone());
            let error = Redacted::kube(&err);
            if first {
                tracing::warn!(
                    cluster = %request.cluster,
                    object = %request,
                    error = %error.as_str(),
                    "cannot publish the warning Event of a failed reconcile; later failures in this cluster are logged at debug level"
                );
            } else {
                tracing::debug!(
                    cluster = %request.cluster,
                    object = %request,
                    error = %error.as_str(),
                    "cannot publish the warning Event of a failed reconcile"
                );
            }
        }
    }
}
