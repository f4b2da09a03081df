//! `config/kubeconfig`: the manifests render with `kubectl kustomize`, apply
//! to a real API server, and their ServiceAccount's RBAC is enough for the
//! example, run with the Deployment's own flags and environment, to do its
//! work — and no more. The second-instance overlay's engaged clusters are
//! disjoint from the base's.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::manifests::{
    apply, can_i, container, may_not, render, run_as_deployed, stop_all, wait_until_engaged,
};
use multicluster_example_testing::wait_for_copy;
use multicluster_provider_kubeconfig::{DEFAULT_LABEL, WATCH_FILTER_LABEL};

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-kubeconfig");
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/kubeconfig");

/// A kubeconfig Secret for `member` in `namespace`, with more labels.
fn secret(namespace: &str, name: &str, member: &ControlPlane, labels: &[(&str, &str)]) -> Secret {
    let text = multicluster_envtest::to_yaml(member.kubeconfig()).expect("yaml");
    let mut all = BTreeMap::from([(DEFAULT_LABEL.to_string(), "true".to_string())]);
    all.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(all),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(text.into_bytes()),
        )])),
        ..Secret::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_deploy_with_the_least_privilege_and_instances_stay_apart() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    let dir = tempfile::tempdir().expect("dir");

    let (base_yaml, base) = render(&format!("{CONFIG}/base")).await;
    let (second_yaml, second) = render(&format!("{CONFIG}/second-instance")).await;
    apply(&management, &base_yaml).await;
    apply(&management, &second_yaml).await;
    let (a, b) = (container(&base), container(&second));
    assert_ne!(
        a.namespace, b.namespace,
        "each instance has its own namespace"
    );

    let admin = management.client().await.expect("client");
    for (namespace, name, labels) in [
        (&a.namespace, "in-a", vec![]),
        (
            &b.namespace,
            "in-b",
            vec![(WATCH_FILTER_LABEL, "instance-b")],
        ),
        (&b.namespace, "not-for-b", vec![]),
    ] {
        Api::<Secret>::namespaced(admin.clone(), namespace)
            .create(
                &PostParams::default(),
                &secret(namespace, name, &member, &labels),
            )
            .await
            .expect("secret");
    }

    let (mut first, first_address) = run_as_deployed(BINARY, &management, &a, dir.path()).await;
    let (mut other, other_address) = run_as_deployed(BINARY, &management, &b, dir.path()).await;
    // It works: its RBAC is enough to read its Secrets.
    wait_for_copy(member.client().await.expect("client"), "settings").await;
    wait_until_engaged(&[
        (first_address, vec!["in-a".to_string()]),
        (other_address, vec!["in-b".to_string()]),
    ])
    .await;

    // And no more: only reading Secrets, only in its own namespace.
    for (instance, own, foreign) in [
        (&a, &a.namespace, &b.namespace),
        (&b, &b.namespace, &a.namespace),
    ] {
        assert!(can_i(&management, instance, &["list", "secrets", "-n", own]).await);
        may_not(
            &management,
            instance,
            &[
                vec!["get", "secrets", "-n", foreign.as_str()],
                vec!["get", "secrets", "-n", "kube-system"],
                vec!["list", "secrets", "--all-namespaces"],
                vec!["create", "secrets", "-n", own.as_str()],
                vec!["delete", "secrets", "-n", own.as_str()],
                vec!["list", "configmaps", "-n", own.as_str()],
                vec!["update", "leases/some-other-lease", "-n", own.as_str()],
            ],
        )
        .await;
    }

    stop_all(&mut [&mut first, &mut other]).await;
}
