//! The example binary over a kubeconfig file: it copies in one context's
//! cluster while another context's credential plugin hangs, and SIGTERM
//! stops it within its grace period, plugin included.

use std::process::Stdio;
use std::time::Duration;

use multicluster_envtest::{ControlPlane, plugins};
use multicluster_example_testing::{GRACE, terminate, wait_for_copy};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-file");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_example_while_a_credential_plugin_hangs() {
    let member = ControlPlane::start().await.expect("member");
    let state = tempfile::tempdir().expect("state");
    plugins::set_token(state.path(), "never-handed-out").expect("token");
    plugins::hold(state.path()).expect("hold");
    let mut fleet = member.exec_kubeconfig("stuck", plugins::TOKEN, state.path());
    let good = member.kubeconfig().clone();
    fleet.clusters.extend(good.clusters);
    fleet.contexts.extend(good.contexts);
    fleet.auth_infos.extend(good.auth_infos);
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("fleet.kubeconfig");
    std::fs::write(&file, multicluster_envtest::to_yaml(&fleet).expect("yaml")).expect("write");

    let mut example = Command::new(BINARY)
        .arg("--file")
        .arg(&file)
        .args(["--health-address", "127.0.0.1:0"])
        // The local cluster.
        .env("KUBECONFIG", member.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example");
    wait_for_copy(member.client().await.expect("client"), "settings").await;
    let plugin = plugins::first_call_running(state.path()).await;

    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
    plugins::wait_until_stopped(plugin, "the plugin the example ran").await;
}
