//! The kind provider against the real `kind` CLI (v0.33.0, built from its
//! Go module by `hack/kind/build.sh`) and podman: node containers made as
//! `kind create cluster` leaves them (`multicluster_envtest::kind_nodes`),
//! each with a real API server inside. A cluster created is engaged, one
//! whose name lacks the prefix is not, one whose kubeconfig cannot be used
//! is skipped alone, a rotated `admin.conf` makes a new member, a cluster
//! removed is disengaged; kind failing (podman missing) is a clear error.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::kind_nodes::KindNode;
use multicluster_provider_kind::{KindOptions, KindProvider};
use multicluster_runtime::controller::Request;
use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::provider::member::Members;
use multicluster_runtime::testing::{
    Polled, eventually, recording_manager, run_manager, wait_until_left,
};
use multicluster_runtime::{Cluster, ClusterName, ManagerOptions};
use std::time::Duration;

/// The real kind CLI, built on first use.
fn kind() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../hack/kind/build.sh");
    multicluster_envtest::tools::built_by(std::path::Path::new(script))
        .unwrap_or_else(|said| panic!("building kind: {said}"))
}

/// Options for the clusters named `prefix…`, as kind made them with podman
/// (every test uses a prefix of its own: kind lists every cluster on the
/// machine).
fn options(prefix: &str) -> KindOptions {
    KindOptions::default()
        .prefix(prefix.to_string())
        .poll_interval(Duration::from_millis(200))
        .kind_command(kind())
        .kind_env(vec![(
            "KIND_EXPERIMENTAL_PROVIDER".to_string(),
            "podman".to_string(),
        )])
}

async fn create(node: &KindNode, name: &str) {
    Api::<ConfigMap>::namespaced(node.client().await.expect("client"), "default")
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("create");
}

fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_clusters_are_engaged_filtered_rotated_and_removed() {
    let local = ControlPlane::start().await.expect("control plane");
    let (a, broken, other) = tokio::join!(
        KindNode::start("rk-a"),
        KindNode::broken("rk-broken", "not: [a kubeconfig"),
        KindNode::broken("other-rk", "not: [a kubeconfig"),
    );
    let (a, _broken, _other) = (
        a.expect("node rk-a"),
        broken.expect("node rk-broken"),
        other.expect("node other-rk"),
    );
    create(&a, "hello").await;

    // Member options chosen by kind cluster name: rk-a's cache is held to
    // the namespace its ConfigMaps are in, the others watch all of them.
    let members = Members::default().per_member(|name: &ClusterName, options| {
        if name.as_str() == "rk-a" {
            let cache = options.cache.clone().namespace("default".to_string());
            options.cache(cache)
        } else {
            options
        }
    });
    let provider = Arc::new(KindProvider::new(options("rk-").members(members)));
    let held_to = |name: &str| {
        let cluster = provider.cluster_set().get(&name.into()).expect("engaged");
        cluster.cache().options().and_then(|o| o.namespace.clone())
    };
    let (manager, recorder) = recording_manager(
        Cluster::new("local", local.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    recorder.wait_for_more(&req("rk-a", "hello"), 0).await;
    // The prefix filters (and is kept); a broken kubeconfig skips only its
    // cluster.
    assert_eq!(provider.names(), [ClusterName::from("rk-a")]);
    assert_eq!(held_to("rk-a"), Some("default".to_string()));

    let b = KindNode::start("rk-b").await.expect("node rk-b");
    create(&b, "hello").await;
    recorder.wait_for_more(&req("rk-b", "hello"), 0).await;
    assert_eq!(held_to("rk-b"), None);

    // A cluster made again under its name (a new admin.conf) is a new
    // member.
    let before = provider.cluster_set().get(&"rk-a".into()).expect("engaged");
    a.rotate_admin().expect("rotate");
    eventually(Polled::OtherProcess, "rk-a engaged again", || async {
        provider
            .cluster_set()
            .get(&"rk-a".into())
            .is_ok_and(|now| !now.same_instance(&before))
    })
    .await;

    drop(b);
    wait_until_left(&manager, "rk-b").await;
    assert_eq!(provider.names(), [ClusterName::from("rk-a")]);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test]
async fn kind_failing_is_a_clear_error_naming_why() {
    // kind finds no podman to ask.
    let mut options = options("rk-none-");
    options
        .kind_env
        .push(("PATH".to_string(), "/nonexistent".to_string()));
    let provider = KindProvider::new(options);
    let err = common::start_error(provider).await;
    let text = err.to_string();
    assert!(text.contains("get clusters"), "{text}");
    assert!(text.contains("podman"), "{text}");
}
