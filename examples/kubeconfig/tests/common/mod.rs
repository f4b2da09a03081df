//! What the example binary's tests share: a management control plane
//! with namespace `fleet` and a member, kubeconfig Secrets in it, and the
//! example started against it as a Deployment starts it.
#![allow(dead_code, unreachable_pub)]

use multicluster_runtime::testing::Polled;
use std::process::Stdio;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::kubeconfig_secret;
use tokio::process::Command;

pub const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-kubeconfig");

/// A management control plane with namespace `fleet`, and a member.
pub async fn management_and_member() -> (ControlPlane, ControlPlane) {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    management
        .create_namespace("fleet")
        .await
        .expect("namespace");
    (management, member)
}

/// A labelled kubeconfig Secret in `fleet` per `(name, kubeconfig)`.
pub async fn put_secrets(management: &ControlPlane, secrets: &[(&str, &Kubeconfig)]) {
    let api = Api::<Secret>::namespaced(management.client().await.expect("client"), "fleet");
    for (name, kubeconfig) in secrets {
        api.create(&PostParams::default(), &kubeconfig_secret(name, kubeconfig))
            .await
            .expect("secret");
    }
}

/// A loopback address nothing listens on now.
pub fn free_address() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    listener.local_addr().expect("address")
}

/// The example for `management`'s namespace `fleet`, as its Deployment
/// runs it (no `RUST_LOG`), with its stdout dropped and killed when
/// dropped; add arguments, environment and stderr before spawning.
pub fn example(management: &ControlPlane) -> Command {
    let mut command = Command::new(BINARY);
    command
        .args(["--namespace", "fleet"])
        .env("KUBECONFIG", management.kubeconfig_path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Waits until `/clusters` at `address` has a line starting with
/// `prefix`, and returns it.
pub async fn clusters_line(address: std::net::SocketAddr, prefix: &str) -> String {
    let line = || async {
        multicluster_runtime::testing::http_get(address, "/clusters")
            .await
            .ok()
            .and_then(|(_, body)| {
                body.lines()
                    .find(|line| line.starts_with(prefix))
                    .map(str::to_string)
            })
    };
    multicluster_runtime::testing::eventually(
        Polled::OtherProcess,
        &format!("/clusters to show {prefix:?}"),
        || async { line().await.is_some() },
    )
    .await;
    line().await.expect("shown")
}
