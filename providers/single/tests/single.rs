//! The single provider engages its one cluster once and knows no other.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_provider_single::SingleProvider;
use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::controller::Request;
use multicluster_runtime::testing::{recording_manager, run_manager};
use multicluster_runtime::{
    Cluster, ClusterName, Error, ManagerOptions, Provider, ProviderContext, RunnableProvider,
};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_cluster_is_engaged_indexed_and_found_by_name() {
    let cp = ControlPlane::start().await.expect("control plane");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("there".into());
    cm.data = Some([("owner".to_string(), "alice".to_string())].into());
    Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default")
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");

    let cluster = Cluster::new("only", cp.client().await.expect("client"));
    let provider = Arc::new(SingleProvider::new("only", cluster.clone()));
    assert!(
        provider
            .get(&ClusterName::from("only"))
            .await
            .expect("found")
            .same_instance(&cluster)
    );
    assert!(matches!(
        provider.get(&ClusterName::from("other")).await,
        Err(Error::ClusterNotFound(_))
    ));
    provider
        .index_field(FieldIndex::new::<ConfigMap>(
            "data.owner",
            |cm: &ConfigMap| {
                cm.data
                    .as_ref()
                    .and_then(|d| d.get("owner").cloned())
                    .into_iter()
                    .collect()
            },
        ))
        .await
        .expect("index");

    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);

    recorder
        .wait_for_more(&Request::new("only", Some("default"), "there"), 0)
        .await;
    assert_eq!(recorder.clusters(), [ClusterName::from("only")]);
    let owned = cluster
        .cache()
        .by_index::<ConfigMap>("data.owner", "alice", None)
        .await
        .expect("query");
    assert_eq!(owned.len(), 1);

    // A second start is refused.
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
