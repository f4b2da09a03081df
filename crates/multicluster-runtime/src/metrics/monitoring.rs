//! The Grafana dashboard and the alert rules in `config/monitoring` name
//! only metrics the library exports, in expressions Prometheus accepts:
//! checked with Prometheus's own PromQL parser and rule loader
//! (`hack/monitoring`, built from the Go module proxy as the test control
//! plane is), so a renamed metric fails here.
//!
//! A unit test, not an integration test: a family shows in the registry's
//! text only once it has a series, and only the crate can record one of
//! each.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ClusterAge, Metrics};
use multicluster_core::ClusterName;
use multicluster_core::redact::Redacted;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every metric of the registry with one series each (per-cluster ones
/// included), in the text format a scrape gets.
fn every_series() -> String {
    let metrics = Metrics::new(true);
    let cluster = ClusterName::from("member");
    metrics.cluster_engaged();
    metrics.cluster_disengaged();
    metrics.engagement_failed("provider", "invalid-kubeconfig");
    metrics.cluster_states([1, 1, 1, 1]);
    metrics.state_changed("ready");
    metrics.cluster_state(&cluster, "ready");
    metrics.reconciled("controller", &cluster, "error", Duration::from_millis(5));
    metrics.queue_depth("controller", 1);
    metrics
        .fleet()
        .unusable("provider", &"broken".into(), Redacted::new("no key"));
    metrics.report_ages(Box::new(move || {
        vec![ClusterAge {
            name: ClusterName::from("member"),
            state: "ready",
            in_state: Duration::from_secs(1),
            failed_attempts: 0,
        }]
    }));
    metrics.encode()
}

/// The checker, built on first use.
fn checker() -> PathBuf {
    multicluster_envtest::monitoring::checker(&repository().join("hack/monitoring/build.sh"))
        .unwrap_or_else(|err| panic!("{err}"))
}

#[test]
fn the_dashboard_and_alert_rules_name_only_exported_metrics() {
    let checker = checker();
    let scratch = tempfile::tempdir().expect("dir");
    let exported = scratch.path().join("exported.txt");
    std::fs::write(&exported, every_series()).expect("write");
    let monitoring = repository().join("config/monitoring");
    let dashboard = monitoring.join("dashboard.json");
    let alerts = monitoring.join("alerts.yaml");

    let (passed, said) = multicluster_envtest::monitoring::check(
        &checker,
        &exported,
        &[dashboard.clone(), alerts.clone()],
    );
    assert!(passed, "{said}");
    assert!(said.contains("expressions checked"), "{said}");

    // A metric renamed in the library (here: in the dashboard, the same
    // mismatch) fails the check, which names it.
    let renamed = scratch.path().join("renamed.json");
    let text = std::fs::read_to_string(&dashboard).expect("dashboard");
    assert!(text.contains("mcr_cluster_most_failed_attempts"));
    std::fs::write(
        &renamed,
        text.replace(
            "mcr_cluster_most_failed_attempts",
            "mcr_cluster_most_failed_attempt",
        ),
    )
    .expect("write");
    let (passed, said) = multicluster_envtest::monitoring::check(&checker, &exported, &[renamed]);
    assert!(!passed, "{said}");
    assert!(
        said.contains("mcr_cluster_most_failed_attempt is not a metric the library exports"),
        "{said}"
    );

    // So does an alert rule that Prometheus would not load.
    let broken = scratch.path().join("broken.yaml");
    let rules = std::fs::read_to_string(&alerts).expect("alerts");
    std::fs::write(&broken, rules.replacen("> 300", "> > 300", 1)).expect("write");
    let (passed, said) = multicluster_envtest::monitoring::check(&checker, &exported, &[broken]);
    assert!(!passed, "{said}");
}
