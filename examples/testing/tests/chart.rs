//! The Helm chart against the kustomize bases in `config/`, rendered by the
//! real helm: for each base, the chart with the matching values grants
//! exactly the same permissions, in the same scopes, and runs the
//! controller with the same flags and environment; values it cannot honour
//! are refused naming them; `helm lint --strict` passes.

use std::collections::BTreeSet;

use multicluster_example_testing::chart;
use multicluster_example_testing::manifests::{self, Container};

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config");

/// Each base, and the chart's release, namespace and values that stand for
/// it.
const BASES: [(&str, &str, &str, &[&str]); 5] = [
    (
        "kubeconfig",
        "multicluster-kubeconfig",
        "fleet",
        &["provider=kubeconfig"],
    ),
    (
        "cluster-api",
        "multicluster-cluster-api",
        "fleet",
        &["provider=cluster-api"],
    ),
    (
        "cluster-inventory-api",
        "multicluster-cluster-inventory-api",
        "inventory",
        &["provider=cluster-inventory-api"],
    ),
    (
        "namespace",
        "multicluster-namespace",
        "multicluster-namespace",
        &["provider=namespace"],
    ),
    (
        "sharded-namespace",
        "multicluster-sharded",
        "multicluster-sharded",
        &["provider=namespace", "mode=sharding", "replicas=3"],
    ),
];

/// What a container runs, in an order that does not matter.
fn runs(container: &Container) -> (String, String, BTreeSet<String>, BTreeSet<(String, String)>) {
    (
        container.namespace.clone(),
        container.service_account.clone(),
        container.args.iter().cloned().collect(),
        container.env.iter().cloned().collect(),
    )
}

#[tokio::test]
async fn the_chart_grants_what_each_kustomize_base_grants_and_runs_it_alike() {
    for (base, release, namespace, values) in BASES {
        let (_, kustomized) = manifests::render(&format!("{CONFIG}/{base}/base")).await;
        let (_, charted) = chart::render(release, namespace, values).await;
        let (wanted, granted) = (chart::grants(&kustomized), chart::grants(&charted));
        assert!(!wanted.is_empty(), "{base}: the base grants nothing?");
        assert_eq!(
            granted.difference(&wanted).collect::<Vec<_>>(),
            Vec::<&chart::Grant>::new(),
            "{base}: the chart grants more"
        );
        assert_eq!(
            wanted.difference(&granted).collect::<Vec<_>>(),
            Vec::<&chart::Grant>::new(),
            "{base}: the chart grants less"
        );
        let replicas = |documents: &[serde_json::Value]| {
            manifests::object(documents, "Deployment")["spec"]["replicas"].clone()
        };
        assert_eq!(replicas(&charted), replicas(&kustomized), "{base}");
        assert_eq!(
            runs(&manifests::container(&charted)),
            runs(&manifests::container(&kustomized)),
            "{base}: flags and environment"
        );
        for kind in ["Service", "NetworkPolicy", "ServiceAccount"] {
            manifests::object(&charted, kind);
        }
    }
}

#[tokio::test]
async fn the_chart_is_linted_and_refuses_what_it_cannot_honour() {
    let said = chart::lint(&["metrics.serviceMonitor.enabled=true"]).await;
    assert!(said.contains("0 chart(s) failed"), "{said}");
    for (values, named) in [
        (
            &["provider=nope"][..],
            "provider \"nope\" is not one of kubeconfig, cluster-api, cluster-inventory-api, namespace",
        ),
        (
            &["mode=both"][..],
            "mode \"both\" is not one of leaderElection, sharding, single",
        ),
        (
            &[
                "metrics.serviceMonitor.enabled=true",
                "metrics.service.enabled=false",
            ][..],
            "metrics.serviceMonitor.enabled needs metrics.service.enabled",
        ),
    ] {
        let refused = chart::try_render("refused", "default", values)
            .await
            .expect_err("refused");
        assert!(refused.contains(named), "{values:?}: {refused}");
    }
    // One replica and no Lease at all when nothing is shared.
    let (_, single) = chart::render("single", "default", &["mode=single"]).await;
    assert_eq!(
        manifests::object(&single, "Deployment")["spec"]["replicas"],
        1
    );
    assert!(
        chart::grants(&single)
            .iter()
            .all(|(_, group, ..)| group != "coordination.k8s.io"),
        "{:?}",
        chart::grants(&single)
    );
    let args = manifests::container(&single).args;
    assert!(!args.iter().any(|arg| arg.contains("lease")), "{args:?}");
}
