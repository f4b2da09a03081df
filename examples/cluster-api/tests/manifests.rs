//! `config/cluster-api`: the manifests render with `kubectl kustomize`,
//! apply to a real API server with Cluster API's CRD, and their
//! ServiceAccount's RBAC is enough for the example, run with the
//! Deployment's own flags and environment, to do its work — and no more.
//! The second-instance overlay's engaged clusters are disjoint from the
//! base's.

mod common;

use common::{install_crd, ready_cluster};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::manifests::{
    apply, can_i, container, may_not, render, run_as_deployed, stop_all, wait_until_engaged,
};
use multicluster_example_testing::wait_for_copy;
use multicluster_provider_cluster_api::WATCH_FILTER_LABEL;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-cluster-api");
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/cluster-api");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_deploy_with_the_least_privilege_and_instances_stay_apart() {
    let (management, workload) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, workload) = (management.expect("management"), workload.expect("workload"));
    install_crd(&management).await;
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
    let filtered = [(WATCH_FILTER_LABEL, "instance-b")];
    ready_cluster(&admin, &a.namespace, "in-a", workload.kubeconfig(), &[]).await;
    ready_cluster(
        &admin,
        &b.namespace,
        "in-b",
        workload.kubeconfig(),
        &filtered,
    )
    .await;
    ready_cluster(
        &admin,
        &b.namespace,
        "not-for-b",
        workload.kubeconfig(),
        &[],
    )
    .await;

    let (mut first, first_address) = run_as_deployed(BINARY, &management, &a, dir.path()).await;
    let (mut other, other_address) = run_as_deployed(BINARY, &management, &b, dir.path()).await;
    // It works: its RBAC is enough to read its Clusters, their Secrets and
    // to lead.
    wait_for_copy(workload.client().await.expect("client"), "settings").await;
    let (want_a, want_b) = (
        vec![format!("{}/in-a", a.namespace)],
        vec![format!("{}/in-b", b.namespace)],
    );
    wait_until_engaged(&[(first_address, want_a), (other_address, want_b)]).await;

    // And no more: reading Clusters and Secrets in its own namespace.
    for (instance, own, foreign) in [
        (&a, &a.namespace, &b.namespace),
        (&b, &b.namespace, &a.namespace),
    ] {
        assert!(
            can_i(
                &management,
                instance,
                &["list", "clusters.cluster.x-k8s.io", "-n", own]
            )
            .await
        );
        may_not(
            &management,
            instance,
            &[
                vec!["get", "secrets", "-n", foreign.as_str()],
                vec!["list", "clusters.cluster.x-k8s.io", "-n", foreign.as_str()],
                vec!["list", "secrets", "--all-namespaces"],
                vec!["update", "clusters.cluster.x-k8s.io", "-n", own.as_str()],
                vec!["create", "secrets", "-n", own.as_str()],
                vec!["update", "leases/some-other-lease", "-n", own.as_str()],
                vec!["list", "configmaps", "-n", own.as_str()],
            ],
        )
        .await;
    }

    stop_all(&mut [&mut first, &mut other]).await;
}
