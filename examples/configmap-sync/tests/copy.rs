//! The shared copy controller against a real control plane: a labelled
//! ConfigMap is copied and followed, and its copy goes when the source loses
//! its label (the update that removes it reaches the reconciler) or is
//! deleted.

use multicluster_runtime::testing::Polled;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_example_configmap_sync::{SYNC_LABEL, controller, copy_name};
use multicluster_provider_single::SingleProvider;
use multicluster_runtime::testing::{eventually, run_manager};
use multicluster_runtime::{Cluster, Manager};

async fn copy(configmaps: &Api<ConfigMap>, source: &str) -> Option<ConfigMap> {
    configmaps.get_opt(&copy_name(source)).await.ok().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_loses_its_label_loses_its_copy() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    let provider = Arc::new(SingleProvider::new(
        "member",
        Cluster::new("member", client.clone()),
    ));
    let manager = Manager::builder(Cluster::new("local", client.clone()))
        .provider(provider)
        .build();
    manager
        .add_controller(controller("copy").expect("controller"))
        .expect("add");
    let (stop, task) = run_manager(&manager);

    let configmaps = Api::<ConfigMap>::namespaced(client, "default");
    for name in ["unlabelled", "deleted"] {
        let mut source = ConfigMap::default();
        source.metadata.name = Some(name.into());
        source.metadata.labels = Some([(SYNC_LABEL.to_string(), "true".to_string())].into());
        configmaps
            .create(&PostParams::default(), &source)
            .await
            .expect("source");
        eventually(
            Polled::ApiServer,
            &format!("{name} to be copied"),
            || async { copy(&configmaps, name).await.is_some() },
        )
        .await;
    }

    let unlabel = serde_json::json!({"metadata": {"labels": {SYNC_LABEL: null}}});
    configmaps
        .patch(
            "unlabelled",
            &PatchParams::default(),
            &Patch::Merge(&unlabel),
        )
        .await
        .expect("unlabel");
    configmaps
        .delete("deleted", &DeleteParams::default())
        .await
        .expect("delete");
    for name in ["unlabelled", "deleted"] {
        eventually(
            Polled::ApiServer,
            &format!("the copy of {name} to go"),
            || async { copy(&configmaps, name).await.is_none() },
        )
        .await;
    }

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
