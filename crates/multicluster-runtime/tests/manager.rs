//! The manager's endpoints, the local cluster, and graceful shutdown.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::controller::{Action, ClusterScope, Controller, Watch};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::testing::wait_for_fleet;
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

/// Serves `manager`'s endpoints on a free loopback port until the token
/// returned is cancelled.
async fn serve_health(
    manager: &Manager,
) -> (std::net::SocketAddr, tokio_util::sync::CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let shutdown = tokio_util::sync::CancellationToken::new();
    manager.serve_health(listener, shutdown.clone());
    (address, shutdown)
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
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("endpoints")
            .for_resource(Watch::<ConfigMap>::new().clusters(ClusterScope::Both))
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

    let (address, shutdown) = serve_health(&manager).await;
    assert!(
        get(address, "/readyz").await.0.contains("503"),
        "not ready before run"
    );

    let (stop, task) = run_manager(&manager);
    // ClusterScope::Both: the local cluster (empty name) is reconciled too.
    recorder.wait_for_more(&req("", "seen"), 0).await;
    recorder.wait_for_more(&req("member", "seen"), 0).await;

    assert!(get(address, "/healthz").await.0.contains("200"));
    // Ready once the clusters' caches have synced (a reconcile in one may
    // come a moment before its state says so: /clusters read right after
    // the member's first reconcile said "syncing" once under load).
    wait_for_fleet(&manager, "the local cluster and the member synced", || {
        manager.cluster_state(&ClusterName::local()) == Some(ClusterState::Ready)
            && manager.cluster_state(&ClusterName::from("member")) == Some(ClusterState::Ready)
    })
    .await;
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
    let options = ManagerOptions::default().shutdown_grace(Duration::from_secs(30));
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .options(options)
        .build();
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

/// A provider that never returns from `start`, whatever happens: a
/// discovery loop stuck in a call that has no deadline.
#[derive(Default)]
struct StuckProvider {
    clusters: multicluster_runtime::provider::clusters::Clusters,
}

impl multicluster_runtime::provider::clusters::ClusterSetProvider for StuckProvider {
    fn cluster_set(&self) -> &multicluster_runtime::provider::clusters::Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl multicluster_runtime::RunnableProvider for StuckProvider {
    async fn start(
        &self,
        _context: multicluster_runtime::ProviderContext,
    ) -> Result<multicluster_runtime::InventoryEngaged, Error> {
        std::future::pending().await
    }
}

/// Sets a flag when dropped: tells whether a hung reconcile was let go.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Shutdown has a bound nothing extends: a reconcile that never ends is
/// dropped after the grace period, and a provider that never returns is
/// dropped shortly after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_whatever_reconciles_and_the_provider_do() {
    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "hangs", &[]).await;
    let started = Arc::new(Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let controller = {
        let (started, dropped) = (started.clone(), dropped.clone());
        Controller::builder("hung")
            .for_resource(Watch::<ConfigMap>::new().clusters(ClusterScope::Local))
            .build(move |request, _| {
                let (started, flag) = (started.clone(), DropFlag(dropped.clone()));
                async move {
                    if request.name == "hangs" {
                        let _flag = flag;
                        started.notify_one();
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, Never>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let grace = Duration::from_secs(2);
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(StuckProvider::default()))
        .options(ManagerOptions::default().shutdown_grace(grace))
        .build();
    manager.add_controller(controller).expect("add");
    let (stop, task) = run_manager(&manager);
    tokio::time::timeout(DEADLINE, started.notified())
        .await
        .expect("the hanging reconcile started");
    stop.cancel();
    // The promise under test is a bound: the grace period plus 3 s (and
    // some slack for a busy machine).
    tokio::time::timeout(grace + Duration::from_secs(3 + 5), task)
        .await
        .expect("run() returned within its bound")
        .expect("task")
        .expect("a clean stop");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the hung reconcile was dropped"
    );
}

/// A controller added while the manager runs is engaged with the clusters
/// there are and runs: its queue is drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_added_while_the_manager_runs_reconciles() {
    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "seen", &[]).await;
    let provider = TestProvider::default();
    provider
        .clusters
        .add("member", cluster_for("member", &cp).await)
        .expect("add");
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    let (stop, task) = run_manager(&manager);
    wait_for_fleet(&manager, "the member to be ready", || {
        manager.cluster_state(&ClusterName::from("member"))
            == Some(multicluster_runtime::manager::ClusterState::Ready)
    })
    .await;

    let recorder = Recorder::default();
    let late = {
        let recorder = recorder.clone();
        Controller::builder("late")
            .for_resource(Watch::<ConfigMap>::new())
            .build(move |request, _| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    Ok::<_, Never>(Action::await_change())
                }
            })
            .expect("controller")
    };
    manager.add_controller(late).expect("add");
    recorder.wait_for_more(&req("member", "seen"), 0).await;

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A controller handed to `Manager::add`, as any cluster-aware component
/// is, runs and reconciles: it is not merely told about clusters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_given_to_add_runs_too() {
    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "seen", &[]).await;
    let provider = TestProvider::default();
    provider
        .clusters
        .add("member", cluster_for("member", &cp).await)
        .expect("add");
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    let controller = multicluster_runtime::testing::recording_controller(
        "added",
        Watch::<ConfigMap>::new(),
        &recorder,
    )
    .expect("controller");
    manager.add(Arc::new(controller)).expect("add");
    let (stop, task) = run_manager(&manager);
    recorder.wait_for_more(&req("member", "seen"), 0).await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Notes, when a cluster's lifetime ends, whether the manager is stopping.
#[derive(Default)]
struct Departures {
    manager: std::sync::OnceLock<Manager>,
    ended: Arc<std::sync::Mutex<Vec<(ClusterName, bool)>>>,
    told: multicluster_runtime::testing::Changes,
}

impl multicluster_runtime::Aware for Departures {
    fn engage(
        &self,
        lifetime: tokio_util::sync::CancellationToken,
        name: ClusterName,
        _cluster: multicluster_runtime::Cluster,
    ) -> Result<(), Error> {
        let manager = self.manager.get().expect("set").clone();
        let (ended, told) = (self.ended.clone(), self.told.clone());
        tokio::spawn(async move {
            lifetime.cancelled().await;
            ended
                .lock()
                .expect("lock")
                .push((name, manager.is_stopping()));
            told.tell();
        });
        Ok(())
    }
}

/// A cluster that leaves the fleet and clusters released because the
/// manager stops are told apart: by `Manager::is_stopping` for components,
/// in the disengagement count and in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_the_fleet_and_stopping_are_told_apart() {
    let cp = ControlPlane::start().await.expect("control plane");
    let provider = Arc::new(TestProvider::default());
    for name in ["stays", "leaves"] {
        provider
            .clusters
            .add(name, cluster_for(name, &cp).await)
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(provider.clone())
        .build();
    let departures = Arc::new(Departures::default());
    let _ = departures.manager.set(manager.clone());
    manager.add(departures.clone()).expect("add");
    let (stop, task) = run_manager(&manager);
    // The local cluster too: one stopped before its hand-over was never
    // engaged with the component, and has no end to tell.
    wait_for_fleet(
        &manager,
        "the local cluster and both members to be ready",
        || {
            ["", "stays", "leaves"].iter().all(|name| {
                manager.cluster_state(&ClusterName::from(*name))
                    == Some(multicluster_runtime::manager::ClusterState::Ready)
            })
        },
    )
    .await;
    provider.clusters.remove(&ClusterName::from("leaves"));
    departures
        .told
        .wait_until("the departure to be seen", || {
            !departures.ended.lock().expect("lock").is_empty()
        })
        .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
    // Each engagement's end is told by a task of its own, which may run
    // after the manager has returned.
    departures
        .told
        .wait_until("every engagement's end to be seen", || {
            departures.ended.lock().expect("lock").len() == 3
        })
        .await;
    let mut ended = departures.ended.lock().expect("lock").clone();
    ended.sort();
    assert_eq!(
        ended,
        [
            (ClusterName::local(), true),
            (ClusterName::from("leaves"), false),
            (ClusterName::from("stays"), true),
        ]
    );
    let disengaged = manager
        .metrics()
        .encode()
        .lines()
        .find(|line| line.starts_with("mcr_cluster_disengagements_total"))
        .map(str::to_string);
    assert_eq!(
        disengaged.as_deref(),
        Some("mcr_cluster_disengagements_total 1"),
        "stopping is no departure"
    );
}

/// `Manager::index_field` indexes the local cluster and every cluster of
/// the provider, those engaged already and those added later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_field_reaches_the_local_cluster_and_every_provider_cluster() {
    use multicluster_runtime::cache::FieldIndex;

    let (local_cp, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (local_cp, member) = (local_cp.expect("local"), member.expect("member"));
    create_config_map(&local_cp, "on-local", &[("color", "blue")]).await;
    create_config_map(&member, "on-member", &[("color", "blue")]).await;
    let provider = TestProvider::default();
    provider
        .clusters
        .add("early", cluster_for("early", &member).await)
        .expect("add");
    let manager = Manager::builder(cluster_for("local", &local_cp).await)
        .provider(Arc::new(provider.clone()))
        .build();
    manager
        .index_field(FieldIndex::new::<ConfigMap>(
            "data.color",
            |cm: &ConfigMap| {
                cm.data
                    .as_ref()
                    .and_then(|data| data.get("color").cloned())
                    .into_iter()
                    .collect()
            },
        ))
        .await
        .expect("index");
    // Added after the index was registered.
    provider
        .clusters
        .add("late", cluster_for("late", &member).await)
        .expect("add");

    let blue = |cluster: multicluster_runtime::Cluster| async move {
        let found = cluster
            .cache()
            .by_index::<ConfigMap>("data.color", "blue", None)
            .await
            .expect("lookup");
        let mut names: Vec<String> = found
            .iter()
            .filter_map(|cm| cm.metadata.name.clone())
            .collect();
        names.sort();
        names
    };
    assert_eq!(blue(manager.local_cluster().clone()).await, ["on-local"]);
    for name in ["early", "late"] {
        let cluster = manager
            .get_cluster(&ClusterName::from(name))
            .await
            .expect("cluster");
        assert_eq!(blue(cluster).await, ["on-member"], "{name}");
    }
    assert!(manager.provider().is_some());
}

/// A provider as an out-of-tree author writes it, on the toolkit alone: a
/// `Fleet`, started with the context the manager hands over, recording
/// what it cannot use. It wires no metrics of its own.
struct ToolkitProvider {
    fleet: multicluster_runtime::provider::discovery::Discovered,
}

impl multicluster_runtime::provider::clusters::ClusterSetProvider for ToolkitProvider {
    fn cluster_set(&self) -> &multicluster_runtime::provider::clusters::Clusters {
        self.fleet.clusters()
    }
}

#[async_trait::async_trait]
impl multicluster_runtime::RunnableProvider for ToolkitProvider {
    async fn start(
        &self,
        context: multicluster_runtime::ProviderContext,
    ) -> Result<multicluster_runtime::InventoryEngaged, Error> {
        self.fleet.start(&context)?;
        self.fleet.failures().record(
            &ClusterName::from("inventory/broken"),
            "Secret inventory/broken has no key \"kubeconfig\"",
            "invalid-kubeconfig",
        );
        let engaged = context.inventory_engaged();
        context.shutdown.cancelled().await;
        Ok(engaged)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_on_the_toolkit_alone_lists_its_unusable_inventory_on_clusters() {
    let cp = ControlPlane::start().await.expect("control plane");
    let provider = ToolkitProvider {
        fleet: multicluster_runtime::provider::discovery::Discovered::new("toolkit", None),
    };
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    let (shutdown, task) = multicluster_runtime::testing::run_manager(&manager);
    let address =
        multicluster_runtime::testing::serve_health(&manager, shutdown.child_token()).await;
    let reasons = multicluster_runtime::testing::wait_until_unusable(
        &manager,
        address,
        &[ClusterName::from("inventory/broken")],
    )
    .await;
    assert_eq!(
        reasons[&ClusterName::from("inventory/broken")],
        "Secret inventory/broken has no key \"kubeconfig\""
    );
    let (_, metrics) = get(address, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|line| line == "mcr_inventory_failures{provider=\"toolkit\"} 1"),
        "{metrics}"
    );
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// `/readyz` says ready only once the local cluster's watches have listed:
/// with the local API server paused from the start, the manager runs but
/// is not ready; once the server answers and the caches sync, it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_until_the_local_cluster_has_synced() {
    let cp = ControlPlane::start().await.expect("control plane");
    let manager = Manager::builder(cluster_for("local", &cp).await).build();
    let controller = Controller::builder("readiness")
        .for_resource(Watch::<ConfigMap>::new().clusters(ClusterScope::Local))
        .build(|_, _| async { Ok::<_, Never>(Action::await_change()) })
        .expect("controller");
    manager.add_controller(controller).expect("add");
    let (address, shutdown) = serve_health(&manager).await;
    let local_state = || manager.cluster_state(&ClusterName::local());

    cp.pause_api_server().expect("pause");
    let (stop, task) = run_manager(&manager);
    manager.started().await;
    // Paused: the local cluster cannot have synced.
    assert_ne!(local_state(), Some(ClusterState::Ready));
    let (status, body) = get(address, "/readyz").await;
    assert!(
        status.contains("503"),
        "ready while the local cluster is {:?}: {status} {body}",
        local_state()
    );

    cp.resume_api_server().expect("resume");
    wait_for_fleet(&manager, "the local cluster synced", || {
        local_state() == Some(ClusterState::Ready)
    })
    .await;
    let (status, body) = get(address, "/readyz").await;
    assert!(status.contains("200"), "{status} {body}");

    stop.cancel();
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
