//! The controller's guarantees, observed through reconciles of real objects:
//! concurrency limit, one reconcile per request at a time, re-run after a
//! mid-reconcile event, requeue-after, per-request error backoff, panics,
//! dropping a disengaged cluster's queue, and event filters.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::controller::{Action, Backoff, Controller, Request, Watch};
use multicluster_runtime::testing::wait_on;
use multicluster_runtime::{ClusterName, Manager};
use tokio::sync::Notify;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TestError(&'static str);

/// A manager over `names`, each a cluster on `cp`, running `controller`.
async fn fleet_of(
    cp: &ControlPlane,
    names: &[&str],
    controller: Controller,
) -> (Manager, TestProvider) {
    let provider = TestProvider::default();
    for name in names {
        provider
            .clusters
            .add(*name, cluster_for(name, cp).await)
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("local", cp).await)
        .provider(Arc::new(provider.clone()))
        .build();
    manager.add_controller(controller).expect("add controller");
    (manager, provider)
}

/// Per cluster at most `max_concurrent_reconciles`, in all at most
/// `max_concurrent_reconciles_total`, and never one request twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_limited_and_a_request_never_runs_twice_at_once() {
    let cp = ControlPlane::start().await.expect("control plane");
    for i in 0..10 {
        create_config_map(&cp, &format!("cm-{i}"), &[]).await;
    }
    let in_flight = Arc::new(Mutex::new(HashSet::<Request>::new()));
    // The most reconciles seen at once in all, and in one cluster.
    let most = Arc::new(AtomicUsize::new(0));
    let most_in_one = Arc::new(AtomicUsize::new(0));
    let overlapped = Arc::new(AtomicBool::new(false));
    let recorder = Recorder::default();
    let api = Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default");
    let touched = Arc::new(AtomicBool::new(false));
    let controller = {
        let (in_flight, most, most_in_one, overlapped, recorder, api, touched) = (
            in_flight.clone(),
            most.clone(),
            most_in_one.clone(),
            overlapped.clone(),
            recorder.clone(),
            api.clone(),
            touched.clone(),
        );
        Controller::builder("limited")
            .for_resource(Watch::<ConfigMap>::new())
            .max_concurrent_reconciles(2)
            .max_concurrent_reconciles_total(3)
            .build(move |request, _cluster| {
                let (in_flight, most, most_in_one, overlapped, recorder, api, touched) = (
                    in_flight.clone(),
                    most.clone(),
                    most_in_one.clone(),
                    overlapped.clone(),
                    recorder.clone(),
                    api.clone(),
                    touched.clone(),
                );
                async move {
                    {
                        let mut running = in_flight.lock().expect("lock");
                        if !running.insert(request.clone()) {
                            overlapped.store(true, Ordering::SeqCst);
                        }
                        most.fetch_max(running.len(), Ordering::SeqCst);
                        let in_cluster = running
                            .iter()
                            .filter(|other| other.cluster == request.cluster)
                            .count();
                        most_in_one.fetch_max(in_cluster, Ordering::SeqCst);
                    }
                    // While cm-0 in cluster a is being reconciled, change it:
                    // the event arrives mid-reconcile and must cause one more run.
                    if request == req("a", "cm-0") && !touched.swap(true, Ordering::SeqCst) {
                        api.patch(
                            "cm-0",
                            &PatchParams::default(),
                            &Patch::Merge(serde_json::json!({"data": {"touched": "yes"}})),
                        )
                        .await
                        .expect("patch");
                    }
                    // Work that takes a while, so reconciles overlap.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    in_flight.lock().expect("lock").remove(&request);
                    recorder.record(&request);
                    Ok::<_, TestError>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let (manager, _provider) = fleet_of(&cp, &["a", "b"], controller).await;
    let (shutdown, task) = run_manager(&manager);

    recorder
        .wait_until("every object reconciled in both clusters", |recorder| {
            (0..10).all(|i| {
                recorder.count(&req("a", &format!("cm-{i}"))) > 0
                    && recorder.count(&req("b", &format!("cm-{i}"))) > 0
            })
        })
        .await;
    recorder.wait_for_more(&req("a", "cm-0"), 1).await;

    assert!(
        !overlapped.load(Ordering::SeqCst),
        "a request ran twice at once"
    );
    let (most, most_in_one) = (
        most.load(Ordering::SeqCst),
        most_in_one.load(Ordering::SeqCst),
    );
    assert!(most <= 3, "at most 3 at once in all, saw {most}");
    assert!(
        most_in_one <= 2,
        "at most 2 at once in one cluster, saw {most_in_one}"
    );
    assert!(most >= 3, "both clusters ran at once (saw at most {most})");

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_after_and_error_backoff_are_per_request() {
    let cp = ControlPlane::start().await.expect("control plane");
    for name in ["again", "flaky", "steady"] {
        create_config_map(&cp, name, &[]).await;
    }
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("timing")
            .for_resource(Watch::<ConfigMap>::new())
            .max_concurrent_reconciles(2)
            .backoff(Backoff {
                base: Duration::from_millis(100),
                max: Duration::from_secs(10),
            })
            .build(move |request, _cluster| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    let runs = recorder.count(&request);
                    match request.name.as_str() {
                        "again" if runs < 4 => Ok(Action::requeue(Duration::from_millis(200))),
                        "flaky" if runs < 4 => Err(TestError("not yet")),
                        "flaky" if runs == 4 => panic!("a panicking reconciler is an error too"),
                        _ => Ok(Action::await_change()),
                    }
                }
            })
            .expect("controller")
    };
    let (manager, _provider) = fleet_of(&cp, &["a"], controller).await;
    let (shutdown, task) = run_manager(&manager);

    recorder.wait_for_more(&req("a", "again"), 3).await;
    recorder.wait_for_more(&req("a", "flaky"), 4).await;
    recorder.wait_for_more(&req("a", "steady"), 0).await;

    let gaps = |name: &str| -> Vec<Duration> {
        let times = recorder.times(&req("a", name));
        times.windows(2).map(|w| w[1] - w[0]).collect()
    };
    for gap in gaps("again") {
        assert!(
            gap >= Duration::from_millis(200),
            "requeue-after honoured: {gap:?}"
        );
    }
    // 100 ms, 200 ms, 400 ms, 800 ms after the 1st..4th failure.
    let flaky = gaps("flaky");
    for (gap, least) in flaky.iter().zip([100u64, 200, 400, 800]) {
        assert!(
            *gap >= Duration::from_millis(least),
            "backoff grows: {flaky:?}"
        );
    }
    assert_eq!(
        recorder.count(&req("a", "steady")),
        1,
        "other requests are not held back or repeated"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disengaged_cluster_has_its_queue_dropped() {
    let cp = ControlPlane::start().await.expect("control plane");
    for i in 0..5 {
        create_config_map(&cp, &format!("cm-{i}"), &[]).await;
    }
    let release = Arc::new(Notify::new());
    // Whether the first reconcile has started.
    let blocked = Arc::new(tokio::sync::watch::Sender::new(false));
    let recorder = Recorder::default();
    let controller = {
        let (release, blocked, recorder) = (release.clone(), blocked.clone(), recorder.clone());
        Controller::builder("one-at-a-time")
            .for_resource(Watch::<ConfigMap>::new())
            .build(move |request, _cluster| {
                let (release, blocked, recorder) =
                    (release.clone(), blocked.clone(), recorder.clone());
                async move {
                    // The first reconcile holds the only slot until released,
                    // so everything else stays queued.
                    if !blocked.send_replace(true) {
                        release.notified().await;
                    }
                    recorder.record(&request);
                    Ok::<_, TestError>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let (manager, provider) = fleet_of(&cp, &["doomed"], controller).await;
    let (shutdown, task) = run_manager(&manager);

    wait_on(
        "the first reconcile to start",
        &mut blocked.subscribe(),
        |started| *started,
    )
    .await;
    assert!(provider.clusters.remove(&ClusterName::from("doomed")));
    wait_until_left(&manager, "doomed").await;
    provider
        .clusters
        .add("survivor", cluster_for("survivor", &cp).await)
        .expect("add");
    release.notify_one();

    recorder
        .wait_until("the survivor's objects", |recorder| {
            (0..5).all(|i| recorder.count(&req("survivor", &format!("cm-{i}"))) > 0)
        })
        .await;
    assert!(
        recorder.for_cluster("doomed") <= 1,
        "only the reconcile already running finished; queued ones were dropped"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_filters_decide_which_changes_reconcile() {
    use k8s_openapi::api::apps::v1::Deployment;
    use multicluster_runtime::controller::filters;

    let cp = ControlPlane::start().await.expect("control plane");
    let deployments = Api::<Deployment>::namespaced(cp.client().await.expect("client"), "default");
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "labels": {"team": "blue"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.invalid/web:1"}]}
            }
        }
    }))
    .expect("deployment");
    deployments
        .create(&Default::default(), &deployment)
        .await
        .expect("create");
    create_config_map(&cp, "labelled", &[]).await;
    create_config_map(&cp, "unlabelled", &[]).await;
    let config_maps = Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default");
    config_maps
        .patch(
            "labelled",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"sync": "yes"}}})),
        )
        .await
        .expect("label");

    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("filtered")
            .for_resource(Watch::<Deployment>::new().filter(filters::generation_changed()))
            .watches(
                Watch::<ConfigMap>::new()
                    .filter(filters::labels(
                        [("sync".to_string(), "yes".to_string())].into(),
                    ))
                    .filter(filters::custom(
                        |event: &multicluster_runtime::cache::CacheEvent<ConfigMap>| {
                            !event
                                .object()
                                .metadata
                                .name
                                .as_deref()
                                .unwrap_or("")
                                .starts_with("skip")
                        },
                    )),
                |context, cm: &ConfigMap| {
                    vec![context.here(
                        cm.metadata.namespace.as_deref(),
                        format!("cm-{}", cm.metadata.name.clone().unwrap_or_default()),
                    )]
                },
            )
            .build(move |request, _cluster| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    Ok::<_, TestError>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let (manager, _provider) = fleet_of(&cp, &["a"], controller).await;
    let (shutdown, task) = run_manager(&manager);

    recorder.wait_for_more(&req("a", "web"), 0).await;
    recorder.wait_for_more(&req("a", "cm-labelled"), 0).await;
    // A label change leaves the generation alone: filtered out. The spec
    // change after it bumps the generation and is the next reconcile.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"team": "red"}}})),
        )
        .await
        .expect("label change");
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("spec change");
    recorder.wait_for_more(&req("a", "web"), 1).await;
    assert_eq!(
        recorder.count(&req("a", "web")),
        2,
        "create and spec change only"
    );

    // Label filter: unlabelled ConfigMaps never map; custom filter drops
    // labelled ones whose name starts with "skip".
    let labelled_skip = {
        let mut cm = config_map("skip-me", &[]);
        cm.metadata.labels = Some([("sync".to_string(), "yes".to_string())].into());
        cm
    };
    config_maps
        .create(&Default::default(), &labelled_skip)
        .await
        .expect("create");
    let mut later = config_map("later", &[]);
    later.metadata.labels = Some([("sync".to_string(), "yes".to_string())].into());
    config_maps
        .create(&Default::default(), &later)
        .await
        .expect("create");
    recorder.wait_for_more(&req("a", "cm-later"), 0).await;
    assert_eq!(recorder.count(&req("a", "cm-unlabelled")), 0);
    assert_eq!(recorder.count(&req("a", "cm-skip-me")), 0);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A cluster whose lifetime has ended is settled only once the reconciles
/// already running on it have finished: the sharded coordinator waits for
/// this before another replica may start on the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_settles_once_its_running_reconciles_end() {
    use multicluster_runtime::Aware;
    use tokio_util::sync::CancellationToken;

    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "held", &[]).await;
    let started = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let controller = {
        let (started, release) = (started.clone(), release.clone());
        Controller::builder("held")
            .for_resource(Watch::<ConfigMap>::new())
            .build(move |request, _cluster| {
                let (started, release) = (started.clone(), release.clone());
                async move {
                    if request.name == "held" {
                        started.notify_one();
                        release.notified().await;
                    }
                    Ok::<_, TestError>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (controller, shutdown) = (controller.clone(), shutdown.clone());
        async move { controller.run(shutdown, Duration::from_secs(5)).await }
    });
    let lifetime = CancellationToken::new();
    let name = ClusterName::from("member");
    controller
        .engage(
            lifetime.clone(),
            name.clone(),
            cluster_for("member", &cp).await,
        )
        .expect("engage");
    started.notified().await;

    lifetime.cancel();
    let settled = controller.settled(&name);
    tokio::pin!(settled);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), settled.as_mut())
            .await
            .is_err(),
        "settled while a reconcile was still running"
    );
    release.notify_one();
    tokio::time::timeout(multicluster_runtime::testing::DEFAULT_DEADLINE, settled)
        .await
        .expect("settled once the reconcile ended");

    shutdown.cancel();
    run.await.expect("run");
}

/// Reconciles asked for from outside the watches: every primary object of
/// one cluster or of every engaged cluster (`reconcile_all_on`), and single
/// requests (`reconcile_on`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_reconcile_one_cluster_every_cluster_or_one_request() {
    let cp = ControlPlane::start().await.expect("control plane");
    for name in ["x", "y"] {
        create_config_map(&cp, name, &[]).await;
    }
    let (all_tx, all) = futures::channel::mpsc::unbounded::<Option<ClusterName>>();
    let (one_tx, one) = futures::channel::mpsc::unbounded::<Request>();
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("triggered")
            .for_resource(Watch::<ConfigMap>::new())
            .reconcile_all_on(all)
            .reconcile_on(one)
            .build(move |request, _cluster| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    Ok::<_, TestError>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let (manager, _provider) = fleet_of(&cp, &["a", "b"], controller).await;
    let (shutdown, task) = run_manager(&manager);
    for cluster in ["a", "b"] {
        for name in ["x", "y"] {
            recorder.wait_for_more(&req(cluster, name), 0).await;
        }
    }
    let count = |cluster: &str, name: &str| recorder.count(&req(cluster, name));

    all_tx.unbounded_send(Some("a".into())).expect("send");
    recorder.wait_for_more(&req("a", "x"), 1).await;
    recorder.wait_for_more(&req("a", "y"), 1).await;
    assert_eq!((count("b", "x"), count("b", "y")), (1, 1), "only a");

    all_tx.unbounded_send(None).expect("send");
    for name in ["x", "y"] {
        recorder.wait_for_more(&req("a", name), 2).await;
        recorder.wait_for_more(&req("b", name), 1).await;
    }

    one_tx.unbounded_send(req("b", "x")).expect("send");
    recorder.wait_for_more(&req("b", "x"), 2).await;
    assert_eq!(count("b", "y"), 2, "only the request asked for");

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The manager's controller defaults reach a controller that sets nothing,
/// and a controller's own setting wins: with a manager-wide debounce of
/// 1 s, a burst of changes to one object is reconciled once by a
/// controller that sets nothing, and more than once by one that sets
/// `debounce(ZERO)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_defaults_apply_unless_a_controller_sets_its_own() {
    use multicluster_runtime::ManagerOptions;
    use multicluster_runtime::controller::ControllerSettings;

    let cp = ControlPlane::start().await.expect("control plane");
    for name in ["burst", "marker"] {
        create_config_map(&cp, name, &[]).await;
    }
    let recording = |name: &str, recorder: &Recorder| {
        let recorder = recorder.clone();
        Controller::builder(name)
            .for_resource(Watch::<ConfigMap>::new())
            .build(move |request, _cluster| {
                recorder.record(&request);
                async { Ok::<_, TestError>(Action::await_change()) }
            })
            .expect("controller")
    };
    let (debounced, eager) = (Recorder::default(), Recorder::default());
    let provider = TestProvider::default();
    provider
        .clusters
        .add("a", cluster_for("a", &cp).await)
        .expect("add");
    let defaults = ControllerSettings::default().debounce(Duration::from_secs(1));
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .options(ManagerOptions::default().controller_defaults(defaults))
        .build();
    manager
        .add_controller(recording("debounced", &debounced))
        .expect("add");
    let eager_controller = {
        let recorder = eager.clone();
        Controller::builder("eager")
            .for_resource(Watch::<ConfigMap>::new())
            .debounce(Duration::ZERO)
            .build(move |request, _cluster| {
                recorder.record(&request);
                async { Ok::<_, TestError>(Action::await_change()) }
            })
            .expect("controller")
    };
    manager.add_controller(eager_controller).expect("add");
    let (shutdown, task) = run_manager(&manager);
    for recorder in [&debounced, &eager] {
        for name in ["burst", "marker"] {
            recorder.wait_for_more(&req("a", name), 0).await;
        }
    }

    let config_maps = Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default");
    for i in 0..5 {
        let patch = serde_json::json!({"data": {"v": i.to_string()}});
        config_maps
            .patch("burst", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("patch");
    }
    // The marker changes last: once it is reconciled, so is the burst.
    let patch = serde_json::json!({"data": {"v": "after"}});
    config_maps
        .patch("marker", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("patch");
    debounced.wait_for_more(&req("a", "marker"), 1).await;
    eager.wait_for_more(&req("a", "marker"), 1).await;
    assert_eq!(
        debounced.count(&req("a", "burst")),
        2,
        "the burst was reconciled once after the first pass"
    );
    assert!(
        eager.count(&req("a", "burst")) >= 3,
        "the controller's own debounce(ZERO) gave way to the manager's: {} reconciles",
        eager.count(&req("a", "burst"))
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
