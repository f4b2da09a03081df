//! Finalizers on real control planes: added before any work, removed only
//! after a clean-up that succeeded, other finalizers kept, let go of when
//! the object is no longer wanted; and the fleet case, a hub object held
//! until its copies in every member are gone.

mod common;

use multicluster_runtime::testing::Changes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::controller::finalizer::{self, Event, delete_from_members};
use multicluster_runtime::controller::{
    Action, ClusterScope, Controller, Request, Watch, filters, map,
};
use multicluster_runtime::{Cluster, ClusterName};
use serde_json::json;

const LABEL: &str = "example.com/finalized";
const FINALIZER: &str = "example.com/clean-up";
const OTHERS: &str = "example.com/someone-else";

#[derive(Debug, thiserror::Error)]
#[error("clean-up not possible yet")]
struct NotYet;

fn labelled(object: &ConfigMap) -> bool {
    object
        .labels()
        .get(LABEL)
        .is_some_and(|value| value == "true")
}

fn labels() -> BTreeMap<String, String> {
    [(LABEL.to_string(), "true".to_string())].into()
}

fn object(name: &str, finalizers: &[&str]) -> ConfigMap {
    let mut object = config_map(name, &[("v", "1")]);
    object.metadata.labels = Some(labels());
    object.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
    object
}

async fn finalizers_of(api: &Api<ConfigMap>, name: &str) -> Option<Vec<String>> {
    let object = api.get_opt(name).await.ok().flatten()?;
    Some(object.metadata.finalizers.unwrap_or_default())
}

/// Waits, watching it, until the object `name` has `finalizers` (`None`:
/// until it is gone).
async fn until_finalizers(
    api: &Api<ConfigMap>,
    name: &str,
    finalizers: Option<&[&str]>,
    what: &str,
) {
    let wanted: Option<Vec<String>> =
        finalizers.map(|names| names.iter().map(|name| name.to_string()).collect());
    multicluster_runtime::testing::wait_for_object(api, name, what, |object| {
        object.map(|object| object.metadata.finalizers.clone().unwrap_or_default()) == wanted
    })
    .await;
}

/// Takes every finalizer off, as their owners would.
async fn drop_finalizers(api: &Api<ConfigMap>, name: &str) {
    let merge = json!({"metadata": {"finalizers": null}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(merge))
        .await
        .expect("drop the finalizers");
}

/// What the reconciler saw: the finalizers an applied object carried, and
/// how many clean-ups were tried and succeeded.
#[derive(Default)]
struct Seen {
    applied_with: Mutex<Vec<Vec<String>>>,
    cleanups_tried: AtomicUsize,
    cleanups_done: AtomicUsize,
    /// Clean-ups that fail before one succeeds.
    fail_first: AtomicUsize,
    /// Told of each apply and clean-up seen.
    changes: Changes,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_is_added_before_work_and_removed_only_after_clean_up() {
    let (hub_cp, member_cp) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub_cp, member_cp) = (hub_cp.expect("hub"), member_cp.expect("member"));
    let seen = Arc::new(Seen::default());
    seen.fail_first.store(2, Ordering::SeqCst);
    let controller = {
        let seen = seen.clone();
        Controller::builder("finalizing")
            .for_resource(Watch::<ConfigMap>::new().filter(filters::labels(labels())))
            .build(move |request: Request, cluster: Cluster| {
                let seen = seen.clone();
                async move {
                    let Some(object) = cluster
                        .cache()
                        .get::<ConfigMap>(request.namespace.as_deref(), &request.name)
                        .await?
                    else {
                        return Ok(Action::await_change());
                    };
                    if !labelled(&object) {
                        finalizer::release(&cluster, FINALIZER, object.as_ref()).await?;
                        return Ok(Action::await_change());
                    }
                    let action =
                        finalizer::finalizer(&cluster, FINALIZER, object, |event| async move {
                            match event {
                                Event::Apply(object) => {
                                    lock(&seen.applied_with).push(object.finalizers().to_vec());
                                    seen.changes.tell();
                                    Ok(Action::await_change())
                                }
                                Event::Cleanup(_) => {
                                    seen.cleanups_tried.fetch_add(1, Ordering::SeqCst);
                                    let failing = seen.fail_first.load(Ordering::SeqCst);
                                    if failing > 0 {
                                        seen.fail_first.store(failing - 1, Ordering::SeqCst);
                                        return Err(NotYet);
                                    }
                                    seen.cleanups_done.fetch_add(1, Ordering::SeqCst);
                                    seen.changes.tell();
                                    Ok(Action::await_change())
                                }
                            }
                        })
                        .await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(action)
                }
            })
            .expect("controller")
    };
    let manager = fleet_manager("hub", &hub_cp, &[("member", &member_cp)]).await;
    manager.add_controller(controller).expect("add controller");
    let (stop, task) = run_manager(&manager);
    let in_member =
        Api::<ConfigMap>::namespaced(member_cp.client().await.expect("client"), "default");

    // Someone else's finalizer is there first; ours is added after it.
    in_member
        .create(&PostParams::default(), &object("held", &[OTHERS]))
        .await
        .expect("create");
    until_finalizers(
        &in_member,
        "held",
        Some(&[OTHERS, FINALIZER]),
        "the finalizer to be added in the member",
    )
    .await;
    seen.changes
        .wait_until("the object to be applied", || {
            !lock(&seen.applied_with).is_empty()
        })
        .await;
    assert!(
        lock(&seen.applied_with)
            .iter()
            .all(|finalizers| finalizers.iter().any(|f| f == FINALIZER)),
        "work was done on an object without the finalizer: {:?}",
        lock(&seen.applied_with)
    );
    let hub = Api::<ConfigMap>::namespaced(hub_cp.client().await.expect("client"), "default");
    assert_eq!(
        finalizers_of(&hub, "held").await,
        None,
        "written to the hub"
    );

    // Deleted: the clean-up fails twice, and the finalizer stays until it
    // succeeds; the other finalizer is left in place.
    in_member
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    seen.changes
        .wait_until("the clean-up to succeed", || {
            seen.cleanups_done.load(Ordering::SeqCst) == 1
        })
        .await;
    assert!(
        seen.cleanups_tried.load(Ordering::SeqCst) >= 3,
        "the failed clean-ups were not retried"
    );
    until_finalizers(
        &in_member,
        "held",
        Some(&[OTHERS]),
        "our finalizer to be removed, the other kept",
    )
    .await;
    drop_finalizers(&in_member, "held").await;
    until_finalizers(&in_member, "held", None, "the object to be gone").await;
    assert_eq!(seen.cleanups_done.load(Ordering::SeqCst), 1);

    // No longer wanted (label removed): released while it lives.
    in_member
        .create(&PostParams::default(), &object("unwanted", &[]))
        .await
        .expect("create");
    until_finalizers(
        &in_member,
        "unwanted",
        Some(&[FINALIZER]),
        "the finalizer to be added",
    )
    .await;
    let unlabel = json!({"metadata": {"labels": {LABEL: null}}});
    in_member
        .patch("unwanted", &PatchParams::default(), &Patch::Merge(unlabel))
        .await
        .expect("unlabel");
    until_finalizers(
        &in_member,
        "unwanted",
        Some(&[]),
        "the finalizer to be released",
    )
    .await;

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_object_is_held_until_its_copies_in_every_member_are_gone() {
    let (hub_cp, m1, m2) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub_cp, m1, m2) = (hub_cp.expect("hub"), m1.expect("m1"), m2.expect("m2"));
    let refusals: Arc<Mutex<Vec<String>>> = Arc::default();
    let refused = Changes::default();
    let this: Arc<OnceLock<Controller>> = Arc::new(OnceLock::new());
    let controller = {
        let (refusals, refused, this) = (refusals.clone(), refused.clone(), this.clone());
        Controller::builder("fleet-finalizer")
            .for_resource(
                Watch::<ConfigMap>::new()
                    .clusters(ClusterScope::Local)
                    .filter(filters::labels(labels())),
            )
            // A copy that changes or goes: its hub object is looked at again.
            .watches(Watch::<ConfigMap>::new(), map::to_owner())
            .build(move |request: Request, cluster: Cluster| {
                let (refusals, refused, controller) =
                    (refusals.clone(), refused.clone(), this.get().cloned());
                async move {
                    let (Some(object), Some(controller)) = (
                        cluster
                            .cache()
                            .get::<ConfigMap>(request.namespace.as_deref(), &request.name)
                            .await?,
                        controller,
                    ) else {
                        return Ok(Action::await_change());
                    };
                    let owner = request.clone();
                    let action =
                        finalizer::finalizer(&cluster, FINALIZER, object, |event| async move {
                            match event {
                                Event::Apply(_) => Ok(Action::await_change()),
                                Event::Cleanup(_) => {
                                    let removed = delete_from_members::<ConfigMap>(
                                        &controller,
                                        owner.namespace.as_deref(),
                                        &owner.name,
                                        |copy| Request::owner_of(copy).as_ref() == Some(&owner),
                                    )
                                    .await;
                                    if let Err(still) = &removed {
                                        lock(&refusals).push(still.to_string());
                                        refused.tell();
                                    }
                                    removed.map(|()| Action::await_change())
                                }
                            }
                        })
                        .await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(action)
                }
            })
            .expect("controller")
    };
    let _ = this.set(controller.clone());
    let manager = fleet_manager("hub", &hub_cp, &[("m1", &m1), ("m2", &m2)]).await;
    manager.add_controller(controller).expect("add controller");
    let (stop, task) = run_manager(&manager);

    let hub = Api::<ConfigMap>::namespaced(hub_cp.client().await.expect("client"), "default");
    let in_m1 = Api::<ConfigMap>::namespaced(m1.client().await.expect("client"), "default");
    let in_m2 = Api::<ConfigMap>::namespaced(m2.client().await.expect("client"), "default");
    let owner = Request::new(ClusterName::local(), Some("default"), "shared");
    // m1 has an object of that name that is not a copy; m2 a copy whose
    // deletion waits for a finalizer of its own.
    in_m1
        .create(
            &PostParams::default(),
            &config_map("shared", &[("v", "mine")]),
        )
        .await
        .expect("m1's own");
    let mut copy = config_map("shared", &[("v", "1")]);
    copy.metadata.annotations = Some(owner.owner_annotations());
    copy.metadata.finalizers = Some(vec![OTHERS.to_string()]);
    in_m2
        .create(&PostParams::default(), &copy)
        .await
        .expect("m2's copy");
    hub.create(&PostParams::default(), &object("shared", &[]))
        .await
        .expect("hub object");
    until_finalizers(
        &hub,
        "shared",
        Some(&[FINALIZER]),
        "the hub object to be held",
    )
    .await;

    hub.delete("shared", &DeleteParams::default())
        .await
        .expect("delete");
    multicluster_runtime::testing::wait_for_object(
        &in_m2,
        "shared",
        "m2's copy to be deleted",
        |copy| copy.is_some_and(|copy| copy.metadata.deletion_timestamp.is_some()),
    )
    .await;
    refused
        .wait_until("the clean-up to be refused while m2's copy remains", || {
            lock(&refusals).len() >= 2
        })
        .await;
    let refusal = lock(&refusals).last().cloned().unwrap_or_default();
    assert!(
        refusal
            .contains("default/shared is still present in 1 member(s): m2 (deletion in progress")
            && refusal.contains(OTHERS),
        "{refusal}"
    );
    assert_eq!(
        finalizers_of(&hub, "shared").await,
        Some(vec![FINALIZER.to_string()]),
        "the hub object was let go while a copy remained"
    );

    // m2's copy goes: the hub object follows.
    drop_finalizers(&in_m2, "shared").await;
    until_finalizers(&hub, "shared", None, "the hub object to be gone").await;
    let mine = in_m1.get("shared").await.expect("m1's own object remains");
    assert!(
        mine.metadata.deletion_timestamp.is_none(),
        "m1's own object was deleted"
    );

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
