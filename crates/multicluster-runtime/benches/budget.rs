//! Request budget benchmark: a burst of 100 concurrent writes from one
//! member client to its API server, without a budget and with budgets of 20
//! a second (bursts of 30, controller-runtime's client defaults) and 5 a
//! second (bursts of 10, client-go's). Reports how long the burst took and
//! the most writes the server received within one second (its audit log's
//! receive times).
//!
//! Run with `make bench` or `cargo bench -p multicluster-runtime --bench budget`.

use std::time::Instant;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::client::ClientOptions;
use multicluster_runtime::client::budget::RequestBudget;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;

const WRITES: usize = 100;

fn receive_times(log: &std::path::Path, prefix: &str) -> Vec<Timestamp> {
    let mut times: Vec<Timestamp> = std::fs::read_to_string(log)
        .expect("audit log")
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|record| {
            record["verb"] == "create"
                && record["objectRef"]["name"]
                    .as_str()
                    .is_some_and(|name| name.starts_with(prefix))
        })
        .filter_map(|record| record["requestReceivedTimestamp"].as_str()?.parse().ok())
        .collect();
    times.sort();
    times
}

fn most_in_one_second(times: &[Timestamp]) -> usize {
    times
        .iter()
        .map(|start| {
            times
                .iter()
                .filter(|at| {
                    let after = at.duration_since(*start);
                    after >= SignedDuration::ZERO && after < SignedDuration::from_secs(1)
                })
                .count()
        })
        .max()
        .unwrap_or_default()
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
    )
    .expect("policy");
    let log = dir.path().join("audit.log");
    let cp = ControlPlane::builder()
        .api_server_arg(format!("--audit-policy-file={}", policy.display()))
        .api_server_arg(format!("--audit-log-path={}", log.display()))
        .start()
        .await
        .expect("control plane");
    let token = cp
        .cluster_admin_token("robots", "bench")
        .await
        .expect("token");
    let text = multicluster_envtest::to_yaml(&cp.token_kubeconfig("bench", token)).expect("yaml");
    println!("budget                       writes  took (s)  most in 1 s at the server");
    for (label, prefix, budget) in [
        ("none (the default)", "none", None),
        (
            "20/s, bursts of 30",
            "twenty",
            Some(RequestBudget::new(20.0, 30)),
        ),
        (
            "5/s, bursts of 10 (client-go)",
            "five",
            Some(RequestBudget::CLIENT_GO),
        ),
    ] {
        let cluster = KubeconfigCluster {
            inventory: Default::default(),
            policy: multicluster_runtime::client::KubeconfigPolicy::default(),
            name: "member".into(),
            text: text.clone(),
            source: "bench".into(),
            stable_id: None,
            member: MemberOptions::from(ClientOptions::default().request_budget(budget)),
        }
        .build()
        .await
        .expect("cluster");
        let api = Api::<ConfigMap>::namespaced(cluster.client(), "default");
        let started = Instant::now();
        let results = futures::future::join_all((0..WRITES).map(|i| {
            let api = api.clone();
            async move {
                let object = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("{prefix}-{i}")),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &object).await
            }
        }))
        .await;
        let took = started.elapsed();
        assert!(results.iter().all(Result::is_ok), "every write succeeds");
        let times = receive_times(&log, prefix);
        println!(
            "{label:<29} {:>6}  {:>8.2}  {:>5}",
            times.len(),
            took.as_secs_f64(),
            most_in_one_second(&times)
        );
    }
}
