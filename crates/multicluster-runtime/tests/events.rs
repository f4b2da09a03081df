//! Events go to the cluster of the object they are about: a reconciler
//! records through its request's cluster (`Cluster::recorder`), the Event
//! lands in that member (not in the local cluster), and an Event repeated
//! is counted as a series, as kube-runtime counts it; with
//! `warning_events`, a failed reconcile leaves a Warning about its object.

mod common;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Resource;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Cluster;
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::testing::Polled;

/// The Events about ConfigMap `name` in `default` of `cp`.
async fn events_about(cp: &ControlPlane, name: &str) -> Vec<K8sEvent> {
    Api::<K8sEvent>::namespaced(cp.client().await.expect("client"), "default")
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|event| {
            event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && event.reporting_controller.as_deref() == Some("events-test")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_recorded_in_the_objects_own_cluster_and_counted() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    create_config_map(&member, "noticed", &[]).await;
    let manager = fleet_manager("local", &hub, &[("member", &member)]).await;
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("events")
            .for_resource(Watch::<ConfigMap>::new())
            // Reconciled twice, so the Event is published twice.
            .build(move |request: Request, cluster: Cluster| {
                let recorder = recorder.clone();
                async move {
                    let Some(cm) = cluster
                        .cache()
                        .get::<ConfigMap>(request.namespace.as_deref(), &request.name)
                        .await?
                    else {
                        return Ok(Action::await_change());
                    };
                    cluster
                        .recorder("events-test")
                        .publish(
                            &Event {
                                type_: EventType::Normal,
                                reason: "Noticed".into(),
                                note: Some(format!("seen in {}", request.cluster)),
                                action: "Notice".into(),
                                secondary: None,
                            },
                            &cm.object_ref(&()),
                        )
                        .await?;
                    recorder.record(&request);
                    let again = recorder.count(&request) < 2;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(if again {
                        Action::requeue(std::time::Duration::from_millis(10))
                    } else {
                        Action::await_change()
                    })
                }
            })
            .expect("controller")
    };
    manager.add_controller(controller).expect("add");
    let (stop, task) = run_manager(&manager);
    recorder.wait_for_more(&req("member", "noticed"), 1).await;

    let events = events_about(&member, "noticed").await;
    assert_eq!(events.len(), 1, "one Event, repeated: {events:?}");
    let event = &events[0];
    assert_eq!(event.reason.as_deref(), Some("Noticed"));
    assert_eq!(event.note.as_deref(), Some("seen in member"));
    assert_eq!(
        event.series.as_ref().map(|series| series.count),
        Some(2),
        "counted as a series: {event:?}"
    );
    assert!(
        events_about(&hub, "noticed").await.is_empty(),
        "nothing in the local cluster"
    );

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

#[derive(Debug, thiserror::Error)]
#[error("the widget service answered 503")]
struct WidgetDown;

/// With `warning_events`, a failed reconcile leaves a Warning Event about
/// its object in the object's cluster, saying why; a reconcile that
/// succeeds leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reconcile_leaves_a_warning_in_the_objects_cluster() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    create_config_map(&member, "failing", &[]).await;
    create_config_map(&member, "fine", &[]).await;
    let manager = fleet_manager("local", &hub, &[("member", &member)]).await;
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("warnings")
            .for_resource(Watch::<ConfigMap>::new())
            .warning_events("events-test")
            .build(move |request: Request, _cluster: Cluster| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    if request.name == "failing" {
                        return Err(WidgetDown);
                    }
                    Ok(Action::await_change())
                }
            })
            .expect("controller")
    };
    manager.add_controller(controller).expect("add");
    let (stop, task) = run_manager(&manager);
    recorder.wait_for_more(&req("member", "fine"), 0).await;

    eventually(
        Polled::ApiServer,
        "a warning about the failing object",
        || async {
            events_about(&member, "failing").await.iter().any(|event| {
                event.type_.as_deref() == Some("Warning")
                    && event.reason.as_deref() == Some("ReconcileFailed")
                    && event.note.as_deref() == Some("the widget service answered 503")
            })
        },
    )
    .await;
    assert!(
        events_about(&member, "fine").await.is_empty(),
        "a warning for a reconcile that succeeded"
    );
    assert!(
        events_about(&hub, "failing").await.is_empty(),
        "nothing in the local cluster"
    );

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The hub-primary pattern with `warning_events`: a reconcile in a member
/// whose primary type is watched only on the hub fails, and the member's
/// identity may read only ResourceQuotas. Looking for the object to warn
/// about must not start a watch of the primary type in the member: its
/// refusal (403) made the member `degraded` for good. The member stays
/// ready with its one watch, and no Event is published there (the object
/// is not in that cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warning_events_start_no_watch_in_a_cluster_the_primary_is_not_watched_in() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    use k8s_openapi::api::rbac::v1::PolicyRule;
    use multicluster_runtime::cache::{Cache, CacheOptions};
    use multicluster_runtime::controller::ClusterScope;
    use multicluster_runtime::manager::ClusterState;
    use multicluster_runtime::{ClusterName, Manager};
    use std::sync::Arc;

    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    member
        .grant_in_namespace(
            "default",
            "robot",
            vec![PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["resourcequotas".into()]),
                verbs: ["get", "list", "watch"].map(String::from).to_vec(),
                ..PolicyRule::default()
            }],
        )
        .await
        .expect("grant");
    let robot = multicluster_envtest::client_for(
        &member.user_kubeconfig("robot", None).expect("kubeconfig"),
    )
    .await
    .expect("client");
    let cache = Cache::with_options(
        "member",
        robot.clone(),
        CacheOptions::default().namespace(Some("default".to_string())),
    );
    let provider = TestProvider::default();
    provider
        .clusters
        .add(
            "member",
            Cluster::with_cache("member", robot, cache.clone()),
        )
        .expect("add");
    let manager = Manager::builder(cluster_for("local", &hub).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("hub-primary")
            .for_resource(Watch::<ConfigMap>::new().clusters(ClusterScope::Local))
            // A quota in a member is a request for the same key there.
            .watches(
                Watch::<ResourceQuota>::new(),
                |context, quota: &ResourceQuota| {
                    vec![context.here(
                        quota.metadata.namespace.as_deref(),
                        quota.metadata.name.clone().unwrap_or_default(),
                    )]
                },
            )
            .warning_events("events-test")
            .build(move |request: Request, _cluster: Cluster| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    if request.cluster.is_local() {
                        return Ok(Action::await_change());
                    }
                    Err(WidgetDown)
                }
            })
            .expect("controller")
    };
    manager.add_controller(controller).expect("add");
    let (stop, task) = run_manager(&manager);
    let quota = serde_json::json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "failing", "namespace": "default"},
        "spec": {"hard": {"pods": "1"}},
    });
    Api::<ResourceQuota>::namespaced(member.client().await.expect("client"), "default")
        .patch(
            "failing",
            &kube::api::PatchParams::apply("test"),
            &kube::api::Patch::Apply(&quota),
        )
        .await
        .expect("quota");
    recorder
        .wait_until("the member's reconcile to fail three times", |recorder| {
            recorder.count(&req("member", "failing")) >= 3
        })
        .await;
    // A health check a second: a refused watch would show within two.
    multicluster_runtime::testing::wait_until_ready(&manager, "member").await;
    assert_eq!(
        cache.informer_count(),
        1,
        "only the ResourceQuota watch runs in the member"
    );
    assert_eq!(
        manager.cluster_state(&ClusterName::from("member")),
        Some(ClusterState::Ready)
    );
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
