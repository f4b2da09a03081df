//! Members whose CRDs differ: a member that lacks the CRD a controller
//! watches is degraded with a reason naming the resource, the others are
//! unaffected; installing the CRD later makes it recover without being
//! engaged again, and removing it makes it degraded again. Default options.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Manager;
use multicluster_runtime::controller::{Action, Controller, Watch};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::testing::wait_for_fleet_within;

/// A CRD of the tests' own (not an upstream type).
const WIDGETS: &str = multicluster_envtest::WIDGETS_CRD;

fn widgets() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"))
}

async fn create_widget(cp: &ControlPlane, name: &str) {
    let mut widget = DynamicObject::new(name, &widgets()).within("default");
    widget.data = serde_json::json!({"spec": {"size": 1}});
    Api::<DynamicObject>::namespaced_with(
        cp.client().await.expect("client"),
        "default",
        &widgets(),
    )
    .create(&PostParams::default(), &widget)
    .await
    .expect("widget");
}

fn state_of(manager: &Manager, name: &str) -> Option<ClusterState> {
    manager.cluster_state(&name.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_the_watched_crd_is_degraded_until_it_has_it() {
    let (with, without) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (with, without) = (with.expect("with"), without.expect("without"));
    with.install_crds(WIDGETS).await.expect("CRD");
    create_widget(&with, "here").await;
    let manager = fleet_manager("local", &with, &[("with", &with), ("without", &without)]).await;
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("widgets")
            .watches_dynamic(widgets(), Watch::new(), |context, widget| {
                vec![context.here(
                    widget.metadata.namespace.as_deref(),
                    widget.metadata.name.clone().unwrap_or_default(),
                )]
            })
            .build(move |request, _cluster| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    Ok::<_, kube::Error>(Action::await_change())
                }
            })
            .expect("controller")
    };
    manager.add_controller(controller).expect("add");
    let (stop, task) = run_manager(&manager);

    recorder.wait_for_more(&req("with", "here"), 0).await;
    wait_for_fleet_within(&manager, Duration::from_secs(15), "the member without the CRD to be degraded", || {
        matches!(
            state_of(&manager, "without"),
            Some(ClusterState::Degraded(reason)) if reason.contains("widgets") && reason.contains("404")
        )
    })
    .await;
    assert_eq!(state_of(&manager, "with"), Some(ClusterState::Ready));
    // Ready so far: the local cluster and `with`; the member without the
    // CRD was never ready on the way to degraded.
    assert_eq!(times_entered(&manager, "ready"), 2);

    // The CRD arrives: the next list (within the longest refused delay,
    // 30 s and its random part) works, with nothing engaged again.
    without.install_crds(WIDGETS).await.expect("CRD");
    create_widget(&without, "late").await;
    wait_for_fleet_within(
        &manager,
        Duration::from_secs(90),
        "the member to be ready",
        || state_of(&manager, "without") == Some(ClusterState::Ready),
    )
    .await;
    recorder.wait_for_more(&req("without", "late"), 0).await;
    let disengaged = manager
        .metrics()
        .encode()
        .lines()
        .find(|line| line.starts_with("mcr_cluster_disengagements_total"))
        .map(str::to_string);
    assert_eq!(
        disengaged.as_deref(),
        Some("mcr_cluster_disengagements_total 0")
    );

    // The CRD removed: degraded again.
    Api::<CustomResourceDefinition>::all(without.client().await.expect("admin"))
        .delete("widgets.example.com", &DeleteParams::default())
        .await
        .expect("remove the CRD");
    wait_for_fleet_within(
        &manager,
        Duration::from_secs(60),
        "the member to be degraded again",
        || {
            matches!(
                state_of(&manager, "without"),
                Some(ClusterState::Degraded(reason)) if reason.contains("widgets")
            )
        },
    )
    .await;
    assert_eq!(state_of(&manager, "with"), Some(ClusterState::Ready));

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
