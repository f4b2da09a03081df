//! Clusters added and removed by hand, before and after start.

use multicluster_runtime::provider::clusters::ClusterSetProvider;
use std::sync::Arc;

use multicluster_envtest::ControlPlane;
use multicluster_provider_clusters::ClustersProvider;
use multicluster_runtime::controller::Request;
use multicluster_runtime::testing::{recording_manager, run_manager, wait_until_left};
use multicluster_runtime::{
    Cluster, ClusterName, Error, ManagerOptions, Provider, ProviderContext, RunnableProvider,
};
use tokio_util::sync::CancellationToken;

async fn create(cp: &ControlPlane, name: &str) {
    cp.create_config_map(name, &[]).await.expect("create");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_come_and_go_before_and_after_start() {
    let (one, two) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (one, two) = (one.expect("one"), two.expect("two"));
    create(&one, "in-one").await;
    create(&two, "in-two").await;

    let provider = Arc::new(ClustersProvider::new());
    let early = Cluster::new("early", one.client().await.expect("client"));
    provider
        .add("early", early.clone())
        .expect("add before start");
    assert!(matches!(
        provider.add("early", early.clone()),
        Err(Error::ClusterExists(_))
    ));
    assert!(
        provider
            .get(&ClusterName::from("early"))
            .await
            .expect("get")
            .same_instance(&early)
    );

    let (manager, recorder) = recording_manager(
        Cluster::new("local", one.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&Request::new("early", Some("default"), "in-one"), 0)
        .await;

    provider
        .add(
            "late",
            Cluster::new("late", two.client().await.expect("client")),
        )
        .expect("add after start");
    recorder
        .wait_for_more(&Request::new("late", Some("default"), "in-two"), 0)
        .await;
    assert_eq!(
        provider.names(),
        [ClusterName::from("early"), ClusterName::from("late")]
    );

    assert!(provider.remove(&ClusterName::from("early")));
    assert!(!provider.remove(&ClusterName::from("early")));
    assert!(matches!(
        provider.get(&ClusterName::from("early")).await,
        Err(Error::ClusterNotFound(_))
    ));
    wait_until_left(&manager, "early").await;
    // After removal, changes in its API server reach nobody; the late
    // cluster still works (its reconcile is the synchronisation point).
    create(&one, "after-removal").await;
    create(&two, "still-here").await;
    recorder
        .wait_for_more(&Request::new("late", Some("default"), "still-here"), 0)
        .await;
    assert_eq!(
        recorder.count(&Request::new("early", Some("default"), "after-removal")),
        0
    );

    let again = provider
        .start(ProviderContext::new(
            CancellationToken::new(),
            Arc::new(manager.clone()),
            manager.metrics().clone(),
        ))
        .await;
    assert!(matches!(again, Err(Error::AlreadyStarted(_))), "{again:?}");

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
