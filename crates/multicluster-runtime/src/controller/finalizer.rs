//! Finalizers on any cluster, with kube-runtime's `finalizer()` semantics,
//! and the fleet case: a hub object held until what was made for it in
//! every member is gone.
//!
//! Written here rather than wrapping `kube::runtime::finalizer` because a
//! reconcile here returns this crate's [`Action`] and boxed errors, and a
//! controller must be able to let go of an object it no longer wants
//! ([`release`]) without waiting for it to be deleted: kube-runtime's
//! finalizer is removed only after a deletion.
//!
//! Finalizer lists are written with a merge patch carrying the object's
//! `resourceVersion`, so a list changed by someone else in between makes
//! the write fail with a conflict (retried with the request's backoff)
//! instead of dropping their finalizer.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::join_all;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Action, Controller, ReconcileError};
use crate::cache::{CachedResource, WatchScope};
use crate::cluster::Cluster;
use multicluster_core::ClusterName;
use multicluster_core::redact::Redacted;

/// What [`finalizer`] asks the reconciler to do.
#[derive(Debug)]
pub enum Event<K> {
    /// The object is live and carries the finalizer: make the world match it.
    Apply(Arc<K>),
    /// The object is being deleted and still carries the finalizer: undo
    /// what was made for it. The finalizer is removed once this succeeds.
    Cleanup(Arc<K>),
}

/// A failure of [`finalizer`] or [`release`]. The reconciler's own error is
/// the [`source`](std::error::Error::source) of `Apply` and `Cleanup`, so a
/// [`Terminal`](super::Terminal) one stays terminal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FinalizerError {
    /// The reconciler failed on [`Event::Apply`].
    #[error("reconcile failed")]
    Apply(#[source] ReconcileError),
    /// The reconciler failed on [`Event::Cleanup`]; the finalizer stays.
    #[error("clean-up failed; finalizer {finalizer} kept")]
    Cleanup {
        /// The finalizer kept.
        finalizer: String,
        /// The reconciler's error.
        #[source]
        source: ReconcileError,
    },
    /// The finalizer could not be added (a conflict when the object changed
    /// in between).
    #[error("cannot add finalizer {finalizer}")]
    Add {
        /// The finalizer.
        finalizer: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The finalizer could not be removed.
    #[error("cannot remove finalizer {finalizer}")]
    Remove {
        /// The finalizer.
        finalizer: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The object has no name, so it cannot be written.
    #[error("the object has no name")]
    Unnamed,
}

/// Runs `reconcile` for `object` in `cluster` under the finalizer named
/// `finalizer`, as kube-runtime's `finalizer()` does:
///
/// - live without the finalizer: the finalizer is added and nothing else
///   happens (the change is an event, so the object comes back with it);
///   no work is done for an object that could be deleted without clean-up;
/// - live with it: [`Event::Apply`];
/// - being deleted with it: [`Event::Cleanup`], then the finalizer is
///   removed, only if the clean-up succeeded;
/// - being deleted without it: nothing.
///
/// Writes go through `cluster`'s client, so this works in any cluster of
/// the fleet; pass the request's cluster.
pub async fn finalizer<K, F, Fut, E>(
    cluster: &Cluster,
    finalizer: &str,
    object: Arc<K>,
    reconcile: F,
) -> Result<Action, FinalizerError>
where
    K: CachedResource,
    F: FnOnce(Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: Into<ReconcileError>,
{
    let held = object.finalizers().iter().any(|f| f == finalizer);
    let deleting = object.meta().deletion_timestamp.is_some();
    match (held, deleting) {
        (true, false) => reconcile(Event::Apply(object))
            .await
            .map_err(|err| FinalizerError::Apply(err.into())),
        (true, true) => {
            let action = reconcile(Event::Cleanup(object.clone()))
                .await
                .map_err(|err| FinalizerError::Cleanup {
                    finalizer: finalizer.to_string(),
                    source: err.into(),
                })?;
            release(cluster, finalizer, object.as_ref()).await?;
            Ok(action)
        }
        (false, false) => {
            let mut finalizers = object.finalizers().to_vec();
            finalizers.push(finalizer.to_string());
            write_finalizers(cluster, object.as_ref(), &finalizers)
                .await
                .map_err(|err| match err {
                    Written::Unnamed => FinalizerError::Unnamed,
                    Written::Failed(source) => FinalizerError::Add {
                        finalizer: finalizer.to_string(),
                        source,
                    },
                })?;
            Ok(Action::await_change())
        }
        (false, true) => Ok(Action::await_change()),
    }
}

/// Removes `finalizer` from `object` in `cluster`, if it is there: for an
/// object the controller no longer wants (a label removed) once its
/// clean-up is done, so that it is not held until it is deleted.
pub async fn release<K: CachedResource>(
    cluster: &Cluster,
    finalizer: &str,
    object: &K,
) -> Result<(), FinalizerError> {
    if !object.finalizers().iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let rest: Vec<String> = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    write_finalizers(cluster, object, &rest)
        .await
        .map_err(|err| match err {
            Written::Unnamed => FinalizerError::Unnamed,
            Written::Failed(source) => FinalizerError::Remove {
                finalizer: finalizer.to_string(),
                source,
            },
        })
}

enum Written {
    Unnamed,
    Failed(kube::Error),
}

async fn write_finalizers<K: CachedResource>(
    cluster: &Cluster,
    object: &K,
    finalizers: &[String],
) -> Result<(), Written> {
    let name = object.meta().name.as_deref().ok_or(Written::Unnamed)?;
    let api = api_in::<K>(cluster, object.meta().namespace.as_deref());
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": object.meta().resource_version,
        }
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
        .map_err(Written::Failed)
}

/// `K` in `cluster`, in `namespace` for a namespaced type.
fn api_in<K: CachedResource>(cluster: &Cluster, namespace: Option<&str>) -> Api<K> {
    let api = Api::all(cluster.client());
    match namespace {
        Some(namespace) => K::Scope::restrict(api, namespace),
        None => api,
    }
}

/// Objects that were not gone from every member: which members, and why.
#[derive(Debug)]
pub struct StillInMembers {
    object: String,
    members: Vec<(ClusterName, Redacted)>,
}

impl StillInMembers {
    /// The members still holding the object, each with why.
    pub fn members(&self) -> &[(ClusterName, Redacted)] {
        &self.members
    }
}

impl fmt::Display for StillInMembers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is still present in {} member(s): ",
            self.object,
            self.members.len()
        )?;
        for (i, (member, why)) in self.members.iter().enumerate() {
            let separator = if i == 0 { "" } else { "; " };
            write!(f, "{separator}{member} ({why})")?;
        }
        Ok(())
    }
}

impl std::error::Error for StillInMembers {}

/// The fleet case of a clean-up: deletes `K` named `name` (in `namespace`
/// for a namespaced type) from every member `controller` is engaged with,
/// the local cluster excepted, where `ours` accepts it (say, it names its
/// owner with [`Request::owner_annotations`](super::Request::owner_annotations));
/// others' objects of that name are left alone. Members are asked at once,
/// each within its client's request deadline.
///
/// Fails with [`StillInMembers`] while any member still holds one:
/// deletion in progress (its own finalizers), or the member could not be
/// asked. Return that error from [`Event::Cleanup`] to keep the hub object
/// held; the request is retried with backoff, and sooner when a member's
/// copy changes if the controller maps those changes to their owner.
/// Members this replica does not work on (another replica's, one that left
/// the fleet) are not asked: their copies are theirs to remove, when they
/// find the hub object gone.
pub async fn delete_from_members<K: CachedResource>(
    controller: &Controller,
    namespace: Option<&str>,
    name: &str,
    ours: impl Fn(&K) -> bool,
) -> Result<(), StillInMembers> {
    let members: Vec<(ClusterName, Cluster)> = controller
        .engaged_clusters()
        .into_iter()
        .filter(|member| !member.is_local())
        .filter_map(|member| controller.cluster(&member).map(|cluster| (member, cluster)))
        .collect();
    let outcomes = join_all(members.iter().map(|(member, cluster)| async {
        let outcome = delete_in::<K>(cluster, namespace, name, &ours).await;
        outcome.err().map(|why| (member.clone(), why))
    }))
    .await;
    let members: Vec<(ClusterName, Redacted)> = outcomes.into_iter().flatten().collect();
    if members.is_empty() {
        return Ok(());
    }
    let object = match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    };
    Err(StillInMembers { object, members })
}

/// Deletes the object from one member; `Err` with why while it is there.
async fn delete_in<K: CachedResource>(
    cluster: &Cluster,
    namespace: Option<&str>,
    name: &str,
    ours: &impl Fn(&K) -> bool,
) -> Result<(), Redacted> {
    let api = api_in::<K>(cluster, namespace);
    let object = match api.get_opt(name).await {
        Ok(Some(object)) => object,
        Ok(None) => return Ok(()),
        Err(err) => return Err(Redacted::kube(&err)),
    };
    if !ours(&object) {
        return Ok(());
    }
    if object.meta().deletion_timestamp.is_some() {
        return Err(deletion_in_progress(&object));
    }
    // Only the object just read: one made again under the same name since
    // is judged on the next attempt.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: object.meta().uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        // The API server answers with the object when its deletion has only
        // started (finalizers, a grace period), and with the last state or a
        // status when it is gone.
        Ok(either) => match either.left() {
            Some(left) if left.meta().deletion_timestamp.is_some() => {
                Err(deletion_in_progress(&left))
            }
            _ => Ok(()),
        },
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(Redacted::kube(&err)),
    }
}

fn deletion_in_progress<K: Resource>(object: &K) -> Redacted {
    let finalizers = object.meta().finalizers.as_deref().unwrap_or_default();
    Redacted::new(format!(
        "deletion in progress, waiting for finalizers [{}]",
        finalizers.join(", ")
    ))
}
