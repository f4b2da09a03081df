//! The nop provider has no clusters; the manager still serves the local one.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_provider_nop::NopProvider;
use multicluster_runtime::controller::{ClusterScope, Request, Watch};
use multicluster_runtime::testing::{Recorder, recording_controller, run_manager};
use multicluster_runtime::{Cluster, ClusterName, Error, Manager, Provider};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_local_cluster_is_reconciled_and_lookups_find_nothing() {
    let cp = ControlPlane::start().await.expect("control plane");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("local-object".into());
    Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default")
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");

    let provider = Arc::new(NopProvider);
    assert!(matches!(
        provider.get(&ClusterName::from("anything")).await,
        Err(Error::ClusterNotFound(name)) if name.as_str() == "anything"
    ));
    let local = Cluster::new("local", cp.client().await.expect("client"));
    let manager = Manager::builder(local).provider(provider).build();
    let recorder = Recorder::default();
    manager
        .add_controller(
            recording_controller(
                "nop",
                Watch::<ConfigMap>::new().clusters(ClusterScope::Both),
                &recorder,
            )
            .expect("controller"),
        )
        .expect("add");
    let (shutdown, task) = run_manager(&manager);

    recorder
        .wait_for_more(&Request::new("", Some("default"), "local-object"), 0)
        .await;
    assert_eq!(
        recorder.clusters(),
        [ClusterName::local()],
        "no fleet clusters"
    );
    assert_eq!(manager.cluster_states().len(), 1);

    // start() blocks until shutdown, then the manager returns cleanly.
    assert!(!task.is_finished());
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
