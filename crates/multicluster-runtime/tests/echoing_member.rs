//! A member whose server (or a gateway in front of it) echoes the
//! credential it was sent in its error answers, with tabs and terminal
//! escapes besides: neither the member's token (40 hex digits, no shape
//! to find) nor its basic-auth password reaches `/clusters` (text or
//! JSON), the metrics or the log (at debug, kube-runtime's own lines
//! included), and the text view cannot be given a column or a colour by
//! what the member said. The same for a member that lists fine and
//! echoes the credential in a watch's ERROR event (a 403 Status, which
//! kube-runtime's watcher logs at warn). With the default options,
//! the kubeconfig the operator's own (plain HTTP allowed, as for a
//! `kubectl proxy`), the real API server as the local cluster.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::gateway::{self, Answer};
use common::*;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Manager;
use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::{http_get, recording_controller, wait_for_fleet};

/// A token with no shape the shape scrub knows (no JWT, base64 run or
/// `key=value`).
const TOKEN: &str = "0123456789abcdef0123456789abcdef01234567";
const USER: &str = "fleet-admin";
const PASSWORD: &str = "s3cr3t-Passw0rd!";
/// The credentials of the members whose watches echo them.
const WATCH_TOKEN: &str = "fedcba9876543210fedcba9876543210fedcba98";
const WATCH_PASSWORD: &str = "w4tch-Passw0rd!";

/// Answers every request 500 with a Status whose message quotes the
/// credential it was sent (the token bare, basic auth decoded) and
/// forges a `/clusters` column and a terminal colour.
async fn echoing_server() -> SocketAddr {
    gateway::serve(|asked| {
        let status = serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "InternalError",
            "code": 500,
            "message": format!(
                "gateway refused {}\tINJECTED\tready\tsince 2026-01-01T00:00:00Z \u{1b}[31mred\u{1b}[0m",
                asked.credential
            ),
        });
        Answer::failing(http::StatusCode::INTERNAL_SERVER_ERROR, status)
    })
    .await
}

/// Lists (and anything else) answered 200 with nothing in them; every
/// watch answered with one ERROR event, a 403 Status quoting the
/// credential it was sent, and ended.
async fn watch_echoing_server() -> SocketAddr {
    gateway::serve(|asked| {
        if !asked.watch {
            return Answer::empty_list();
        }
        Answer::error_event(serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "Forbidden",
            "code": 403,
            "message": format!("watch gateway refused {}", asked.credential),
        }))
    })
    .await
}

/// A kubeconfig for `server` authenticating with `user` (YAML).
fn kubeconfig(server: SocketAddr, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: echo\nclusters:\n- name: echo\n  cluster:\n    server: http://{server}\ncontexts:\n- name: echo\n  context:\n    cluster: echo\n    user: u\nusers:\n- name: u\n  user:\n{user}"
    )
}

async fn member(name: &str, text: String) -> multicluster_runtime::Cluster {
    KubeconfigCluster {
        inventory: Default::default(),
        policy: KubeconfigPolicy::trusted(),
        name: name.into(),
        text,
        source: format!("the {name} kubeconfig"),
        stable_id: None,
        member: MemberOptions::default(),
    }
    .build()
    .await
    .expect("a cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_credential_and_forged_columns_reach_neither_clusters_nor_the_log() {
    let logs = Logs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let local = ControlPlane::start().await.expect("control plane");
    let server = echoing_server().await;
    let provider = TestProvider::default();
    provider
        .clusters
        .add(
            "token",
            member(
                "token",
                kubeconfig(server, &format!("    token: {TOKEN}\n")),
            )
            .await,
        )
        .expect("add");
    provider
        .clusters
        .add(
            "basic",
            member(
                "basic",
                kubeconfig(
                    server,
                    &format!("    username: {USER}\n    password: {PASSWORD}\n"),
                ),
            )
            .await,
        )
        .expect("add");
    let watch_server = watch_echoing_server().await;
    provider
        .clusters
        .add(
            "watch-token",
            member(
                "watch-token",
                kubeconfig(watch_server, &format!("    token: {WATCH_TOKEN}\n")),
            )
            .await,
        )
        .expect("add");
    provider
        .clusters
        .add(
            "watch-basic",
            member(
                "watch-basic",
                kubeconfig(
                    watch_server,
                    &format!("    username: {USER}\n    password: {WATCH_PASSWORD}\n"),
                ),
            )
            .await,
        )
        .expect("add");
    let manager = Manager::builder(cluster_for("local", &local).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = multicluster_runtime::testing::Recorder::default();
    manager
        .add_controller(
            recording_controller(
                "recorder",
                multicluster_runtime::controller::Watch::<k8s_openapi::api::core::v1::ConfigMap>::new(),
                &recorder,
            )
            .expect("controller"),
        )
        .expect("add");
    let (stop, task) = run_manager(&manager);
    let address = multicluster_runtime::testing::serve_health(&manager, stop.clone()).await;
    let failing = |name: &str| {
        matches!(
            manager.cluster_state(&name.into()),
            Some(ClusterState::Unreachable(reason) | ClusterState::Degraded(reason))
                if reason.contains("gateway refused")
        )
    };
    wait_for_fleet(&manager, "the members to show the gateway's answer", || {
        failing("token") && failing("basic") && failing("watch-token") && failing("watch-basic")
    })
    .await;

    let (_, text) = http_get(address, "/clusters").await.expect("/clusters");
    let (_, json) = http_get(address, "/clusters?format=json")
        .await
        .expect("/clusters?format=json");
    let (_, metrics) = http_get(address, "/metrics").await.expect("/metrics");
    stop.cancel();
    task.await.expect("task").expect("clean stop");
    let logs = logs.text();

    for (what, body) in [
        ("/clusters", &text),
        ("JSON", &json),
        ("/metrics", &metrics),
        ("the log", &logs),
    ] {
        for secret in [TOKEN, PASSWORD, WATCH_TOKEN, WATCH_PASSWORD] {
            assert!(!body.contains(secret), "{what} quotes {secret}:\n{body}");
        }
        assert!(!body.contains('\u{1b}'), "{what} holds an escape:\n{body}");
    }
    assert!(text.contains("gateway refused [withheld]"), "{text}");
    assert!(
        text.contains(&format!("gateway refused {USER} with [withheld]")),
        "{text}"
    );
    for line in text
        .lines()
        .filter(|line| line.contains("gateway refused") && !line.contains("watch gateway"))
    {
        // The member's words stay in the state's column.
        let columns: Vec<&str> = line.split('\t').collect();
        assert!(
            columns[1].contains("INJECTED") && columns[2].starts_with("since "),
            "a forged column: {line:?}"
        );
        assert!(
            line.contains("\\tINJECTED\\tready") && line.contains("\\u{1b}[31mred"),
            "{line}"
        );
    }
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    for cluster in report["clusters"].as_array().expect("clusters") {
        if let Some(reason) = cluster["reason"].as_str() {
            assert!(!reason.contains(['\t', '\u{1b}']), "{reason:?}");
        }
    }
    assert!(
        logs.contains("gateway refused"),
        "the failure is logged:\n{logs}"
    );
    assert!(
        text.contains("watch gateway refused [withheld]")
            && text.contains(&format!("watch gateway refused {USER} with [withheld]")),
        "{text}"
    );
    assert!(
        logs.contains("watch gateway refused [withheld]"),
        "kube-runtime's own line, withheld:\n{logs}"
    );
}
