//! The manager's endpoints, the local cluster, and graceful shutdown.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::controller::{Action, Clusters, Controller, Watch};
use multicluster_runtime::{ClusterName, Error, Manager, ManagerOptions};
use tokio::sync::Notify;

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// A plain HTTP/1.1 GET; returns the status line and body.
async fn get(address: std::net::SocketAddr, path: &str) -> (String, String) {
    multicluster_runtime::testing::http_get(address, path)
        .await
        .expect("health endpoint")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_report_health_readiness_metrics_and_clusters() {
    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "seen", &[]).await;
    let provider = TestProvider::default();
    provider
        .clusters
        .add("member", cluster_for("member", &cp).await)
        .expect("add");
    let manager = Manager::with_provider(
        cluster_for("local", &cp).await,
        Arc::new(provider),
        ManagerOptions::default(),
    );
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("endpoints")
            .for_resource(Watch::<ConfigMap>::new().clusters(Clusters::Both))
            .build(move |request, _| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    Ok::<_, Never>(Action::await_change())
                }
            })
            .expect("controller")
    };
    manager.add_controller(controller).expect("add");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let shutdown = tokio_util::sync::CancellationToken::new();
    manager.serve_health(listener, shutdown.clone());
    assert!(
        get(address, "/readyz").await.0.contains("503"),
        "not ready before run"
    );

    let (stop, task) = run_manager(&manager);
    // Clusters::Both: the local cluster (empty name) is reconciled too.
    recorder.wait_for_more(&req("", "seen"), 0).await;
    recorder.wait_for_more(&req("member", "seen"), 0).await;

    assert!(get(address, "/healthz").await.0.contains("200"));
    assert!(get(address, "/readyz").await.0.contains("200"));
    let (status, metrics) = get(address, "/metrics").await;
    assert!(status.contains("200"));
    assert!(metrics.contains("mcr_engaged_clusters 2"), "{metrics}");
    assert!(
        metrics.contains(
            r#"controller_runtime_reconcile_total{controller="endpoints",result="success"}"#
        ),
        "{metrics}"
    );
    let (_, clusters) = get(address, "/clusters").await;
    assert!(clusters.contains("member\tready"), "{clusters}");
    assert!(get(address, "/nope").await.0.contains("404"));

    // The empty name is the local cluster; unknown names are not found.
    let local = manager
        .get_cluster(&ClusterName::local())
        .await
        .expect("local");
    assert!(local.same_instance(manager.local_cluster()));
    assert!(matches!(
        manager.get_cluster(&ClusterName::from("missing")).await,
        Err(Error::ClusterNotFound(name)) if name.as_str() == "missing"
    ));

    stop.cancel();
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_reconciles_finish_and_starts_no_new_ones() {
    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "slow", &[]).await;
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let finished = Arc::new(AtomicBool::new(false));
    let recorder = Recorder::default();
    let controller = {
        let (started, release, finished, recorder) = (
            started.clone(),
            release.clone(),
            finished.clone(),
            recorder.clone(),
        );
        Controller::builder("graceful")
            .for_resource(Watch::<ConfigMap>::new())
            .build(move |request, _| {
                let (started, release, finished, recorder) = (
                    started.clone(),
                    release.clone(),
                    finished.clone(),
                    recorder.clone(),
                );
                async move {
                    recorder.record(&request);
                    if request.name == "slow" {
                        started.notify_one();
                        release.notified().await;
                        finished.store(true, Ordering::SeqCst);
                    }
                    Ok::<_, Never>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let provider = TestProvider::default();
    provider
        .clusters
        .add("member", cluster_for("member", &cp).await)
        .expect("add");
    let options = ManagerOptions {
        shutdown_grace: Duration::from_secs(30),
        ..ManagerOptions::default()
    };
    let manager =
        Manager::with_provider(cluster_for("local", &cp).await, Arc::new(provider), options);
    manager.add_controller(controller.clone()).expect("add");
    let (stop, task) = run_manager(&manager);

    tokio::time::timeout(DEADLINE, started.notified())
        .await
        .expect("slow reconcile started");
    // Waiting behind the running reconcile (one slot) when shutdown comes.
    controller.enqueue(req("member", "queued"));
    stop.cancel();
    // The manager waits for the running reconcile instead of returning.
    tokio::task::yield_now().await;
    assert!(!task.is_finished(), "run() waits for the running reconcile");
    release.notify_one();
    task.await.expect("task").expect("clean stop");
    assert!(
        finished.load(Ordering::SeqCst),
        "the running reconcile finished"
    );
    assert_eq!(
        recorder.count(&req("member", "queued")),
        0,
        "nothing new started after shutdown"
    );
}
