//! The example binary against a real management cluster with Cluster API's
//! Cluster CRD and a workload control plane: it copies in one workload
//! cluster while another's credential plugin hangs, and SIGTERM stops it
//! within its grace period, plugin included.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{install_crd, ready_cluster};
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_example_testing::{GRACE, terminate, wait_for_copy};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-cluster-api");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_example_while_a_credential_plugin_hangs() {
    let (management, workload) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, workload) = (management.expect("management"), workload.expect("workload"));
    install_crd(&management).await;
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
        "fleet",
        "stuck",
        &workload.exec_kubeconfig("stuck", plugins::TOKEN, state.path()),
        &[],
    )
    .await;
    ready_cluster(&client, "fleet", "workload", workload.kubeconfig(), &[]).await;

    let mut example = Command::new(BINARY)
        .args(["--namespace", "fleet", "--health-address", "127.0.0.1:0"])
        .args([
            "--allow-exec-plugin",
            plugins::TOKEN,
            "--allow-exec-env",
            "STATE_DIR",
        ])
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
