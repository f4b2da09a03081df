//! The Helm chart installed by the real helm on a real API server, with
//! the kubeconfig provider and prometheus-operator's own ServiceMonitor
//! CRD: the controller, run with the Deployment's flags and environment as
//! the chart's ServiceAccount, engages the member of a kubeconfig Secret in
//! its namespace and copies into it, and may do nothing more in the
//! management cluster (no Secrets elsewhere, no writes, no other Lease).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::upstream::PROMETHEUS_OPERATOR;
use multicluster_example_testing::manifests::{
    can_i, container, may_not, object, run_as_deployed, stop_all, wait_until_engaged,
};
use multicluster_example_testing::{chart, wait_for_copy};
use multicluster_provider_kubeconfig::DEFAULT_LABEL;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-kubeconfig");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_a_controller_that_works_with_the_least_privilege() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    let crd = PROMETHEUS_OPERATOR
        .file("example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml")
        .await
        .expect("the ServiceMonitor CRD");
    management
        .install_crds(&crd)
        .await
        .expect("install the CRD");
    let documents = chart::install(
        &management,
        "fleet-controller",
        "fleet",
        &["provider=kubeconfig", "metrics.serviceMonitor.enabled=true"],
    )
    .await;
    // The ServiceMonitor selects the metrics Service's port by name.
    let monitor = object(&documents, "ServiceMonitor");
    let service = object(&documents, "Service");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    let labels = service["metadata"]["labels"].as_object().expect("labels");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector")
    {
        assert_eq!(labels.get(key), Some(value), "{key}");
    }

    let deployed = container(&documents);
    assert_eq!(deployed.namespace, "fleet");
    let text = multicluster_envtest::to_yaml(member.kubeconfig()).expect("yaml");
    let admin = management.client().await.expect("client");
    Api::<Secret>::namespaced(admin, "fleet")
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("member".into()),
                    namespace: Some("fleet".into()),
                    labels: Some(BTreeMap::from([(
                        DEFAULT_LABEL.to_string(),
                        "true".to_string(),
                    )])),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([(
                    "kubeconfig".to_string(),
                    ByteString(text.into_bytes()),
                )])),
                ..Secret::default()
            },
        )
        .await
        .expect("secret");

    let dir = tempfile::tempdir().expect("dir");
    let (mut controller, address) =
        run_as_deployed(BINARY, &management, &deployed, dir.path()).await;
    wait_for_copy(member.client().await.expect("client"), "settings").await;
    wait_until_engaged(&[(address, vec!["member".to_string()])]).await;

    assert!(can_i(&management, &deployed, &["list", "secrets", "-n", "fleet"]).await);
    assert!(
        can_i(
            &management,
            &deployed,
            &["update", "leases/fleet-controller", "-n", "fleet"]
        )
        .await
    );
    may_not(
        &management,
        &deployed,
        &[
            vec!["get", "secrets", "-n", "default"],
            vec!["list", "secrets", "--all-namespaces"],
            vec!["create", "secrets", "-n", "fleet"],
            vec!["delete", "secrets", "-n", "fleet"],
            vec!["list", "configmaps", "-n", "fleet"],
            vec!["update", "leases/some-other-lease", "-n", "fleet"],
            vec!["list", "namespaces"],
        ],
    )
    .await;
    stop_all(&mut [&mut controller]).await;
}
