//! `config/namespace`: the manifests render, apply to a real API server,
//! and their ServiceAccount's RBAC — namespaces and ConfigMaps read
//! cluster-wide, ConfigMaps written only where the writer role is bound,
//! nothing in a system namespace, nothing else — is enough for the example
//! run with the Deployment's own flags; the two-instance overlay's
//! instances engage disjoint sets of namespaces. The system namespaces
//! are no clusters.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::manifests::{
    apply, bind_in, can_i, container, containers, engaged, render, run_as_deployed,
    wait_until_engaged,
};
use multicluster_example_testing::{GRACE, terminate, wait_for_copy_in};
use multicluster_provider_namespace::WATCH_FILTER_LABEL;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-namespace");
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/namespace");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_deploy_with_the_least_privilege_and_instances_stay_apart() {
    let cp = ControlPlane::start().await.expect("control plane");
    let dir = tempfile::tempdir().expect("dir");
    let admin = cp.client().await.expect("client");
    for (name, filter) in [
        ("team-x", None),
        ("team-a", Some("instance-a")),
        ("team-b", Some("instance-b")),
    ] {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: filter
                    .map(|value| [(WATCH_FILTER_LABEL.to_string(), value.to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
    }

    // The base: every namespace, with RBAC for exactly its work.
    let (yaml, documents) = render(&format!("{CONFIG}/base")).await;
    apply(&cp, &yaml).await;
    let base = container(&documents);
    bind_in(&cp, "team-x", "multicluster-namespace-writer", &base).await;
    let (mut example, address) = run_as_deployed(BINARY, &cp, &base, dir.path()).await;
    wait_for_copy_in(admin.clone(), "team-x", "settings").await;
    let clusters = engaged(address).await;
    assert!(clusters.contains(&"team-x".to_string()), "{clusters:?}");
    for system in ["kube-system", "kube-public", "kube-node-lease"] {
        assert!(!clusters.contains(&system.to_string()), "{clusters:?}");
    }
    assert!(can_i(&cp, &base, &["list", "configmaps", "--all-namespaces"]).await);
    assert!(can_i(&cp, &base, &["patch", "configmaps", "-n", "team-x"]).await);
    for what in [
        &["patch", "configmaps", "-n", "team-y"][..],
        &["update", "configmaps", "-n", "team-x"],
        &["get", "secrets", "-n", "team-x"][..],
        &["list", "secrets", "-A"],
        &["create", "namespaces"],
        &["delete", "namespaces"],
        &["list", "pods", "-A"],
        &[
            "update",
            "leases/some-other-lease",
            "-n",
            "multicluster-namespace",
        ],
        &["update", "leases", "-n", "kube-system"],
    ] {
        assert!(!can_i(&cp, &base, what).await, "the base may {what:?}");
    }
    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");

    // Two instances with disjoint watch filters.
    let (yaml, documents) = render(&format!("{CONFIG}/two-instances")).await;
    apply(&cp, &yaml).await;
    let pair = containers(&documents);
    assert_eq!(pair.len(), 2);
    for (namespace, instance, role) in [
        ("team-a", &pair[0], "multicluster-namespace-writer-a"),
        ("team-b", &pair[1], "multicluster-namespace-writer-b"),
    ] {
        bind_in(&cp, namespace, role, instance).await;
    }
    let mut running = Vec::new();
    for instance in &pair {
        running.push(run_as_deployed(BINARY, &cp, instance, dir.path()).await);
    }
    wait_for_copy_in(admin.clone(), "team-a", "for-a").await;
    wait_for_copy_in(admin, "team-b", "for-b").await;
    wait_until_engaged(&[
        (running[0].1, vec!["team-a".to_string()]),
        (running[1].1, vec!["team-b".to_string()]),
    ])
    .await;
    for (child, _) in &mut running {
        let status = terminate(child, GRACE + Duration::from_secs(5)).await;
        assert!(status.success(), "{status}");
    }
}
