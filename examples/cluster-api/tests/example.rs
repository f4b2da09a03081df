//! The example binary against a real management cluster with Cluster API's
//! Cluster CRD and a workload control plane: it copies in one workload
//! cluster while another's credential plugin hangs, and SIGTERM stops it
//! within its grace period, plugin included.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_example_testing::{GRACE, terminate, wait_for_copy};
use multicluster_provider_cluster_api::CLUSTER_NAME_LABEL;
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-cluster-api");
const CRD: &str = include_str!("../../../providers/cluster-api/tests/crds/cluster.yaml");

/// A ready v1beta2 Cluster `name` in `fleet` whose kubeconfig Secret holds
/// `kubeconfig`.
async fn ready_cluster(client: &kube::Client, name: &str, kubeconfig: &kube::config::Kubeconfig) {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
    ));
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), "fleet", &resource);
    let mut object = DynamicObject::new(name, &resource).within("fleet");
    object.data = serde_json::json!({"spec": {}});
    clusters
        .create(&PostParams::default(), &object)
        .await
        .expect("Cluster");
    clusters
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"initialization": {"controlPlaneInitialized": true}}})),
        )
        .await
        .expect("status");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{name}-kubeconfig")),
            labels: Some([(CLUSTER_NAME_LABEL.to_string(), name.to_string())].into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "value".to_string(),
            ByteString(
                multicluster_envtest::to_yaml(kubeconfig)
                    .expect("yaml")
                    .into_bytes(),
            ),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), "fleet")
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_example_while_a_credential_plugin_hangs() {
    let (management, workload) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, workload) = (management.expect("management"), workload.expect("workload"));
    management.install_crds(CRD).await.expect("CRD");
    management
        .create_namespace("fleet")
        .await
        .expect("namespace");
    let client = management.client().await.expect("client");
    let state = tempfile::tempdir().expect("state");
    plugins::set_token(state.path(), "never-handed-out").expect("token");
    plugins::hold(state.path()).expect("hold");
    ready_cluster(
        &client,
        "stuck",
        &workload.exec_kubeconfig("stuck", plugins::TOKEN, state.path()),
    )
    .await;
    ready_cluster(&client, "workload", workload.kubeconfig()).await;

    let mut example = Command::new(BINARY)
        .args(["--namespace", "fleet", "--health-address", "127.0.0.1:0"])
        .env("KUBECONFIG", management.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example");
    wait_for_copy(workload.client().await.expect("client"), "settings").await;
    let plugin = plugins::first_call_running(state.path()).await;

    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
    plugins::wait_until_stopped(plugin, "the plugin the example ran").await;
}
