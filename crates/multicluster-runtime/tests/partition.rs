//! A silent network partition, with the default options: a TCP relay on
//! loopback between a member's client and its API server stops forwarding
//! in both directions while keeping every socket open (nothing is closed,
//! nothing answers), then resumes. Members whose kubeconfig names a
//! `tls-server-name` are reached over HTTP/2 like the others, so their
//! keep-alive pings find the partition too; members reached over HTTP/1.1
//! (`http2: false`), whose connections carry no pings, are found by the
//! manager's liveness probes in the same time.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::relay::Relay;
use common::{TestProvider, cluster_for, run_manager};
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::client::{ClientOptions, KubeconfigPolicy};
use multicluster_runtime::controller::Watch;
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::wait_for_fleet;
use multicluster_runtime::testing::{Recorder, recording_controller};
use multicluster_runtime::{ClusterName, Manager};

/// At worst: a ping due 30 s after the last frame, 15 s for its answer,
/// then the watch's new connection failing at its 10 s connect deadline
/// (56 s with the pings' 1 s grid; 51 s seen), and room for a loaded
/// machine; over HTTP/1.1, a liveness probe every 30 s with 15 s to answer.
/// Over kube-rs's HTTP/1.1 stack without probes it was never reported.
const PARTITION_REPORTED_WITHIN: Duration = Duration::from_secs(75);

/// `cp` reached through `relay`, built as providers build members; its
/// certificate checked for `tls_server_name` when given; over HTTP/1.1
/// only when `http2` is false.
async fn through(
    name: &str,
    cp: &ControlPlane,
    relay: &Relay,
    tls_server_name: Option<&str>,
    http2: bool,
) -> multicluster_runtime::Cluster {
    let mut kubeconfig = cp.kubeconfig().clone();
    let cluster = kubeconfig.clusters[0].cluster.as_mut().expect("cluster");
    cluster.server = Some(format!("https://127.0.0.1:{}", relay.port));
    cluster.tls_server_name = tls_server_name.map(str::to_string);
    KubeconfigCluster {
        inventory: Default::default(),
        policy: KubeconfigPolicy::default(),
        name: name.into(),
        text: multicluster_envtest::to_yaml(&kubeconfig).expect("yaml"),
        source: format!("test kubeconfig of {name}"),
        stable_id: None,
        member: MemberOptions::default().client(ClientOptions::default().http2(http2)),
    }
    .build()
    .await
    .expect("cluster")
}

fn state_of(manager: &Manager, name: &str) -> Option<ClusterState> {
    manager.cluster_state(&ClusterName::from(name))
}

/// With the default options, a silent partition of a member reached over
/// HTTP/2, of one whose kubeconfig names a `tls-server-name` (kube-rs's
/// HTTP/1.1 stack served those, with no pings: it stayed `ready`), and of
/// one reached over HTTP/1.1 (`http2: false`: it stayed `ready` too) is
/// reported `unreachable` within a minute while a member reached directly
/// stays ready; once the relays forward again, all are ready by
/// themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_partition_is_found_over_http2_with_a_tls_server_name_and_over_http1() {
    let cp = ControlPlane::start().await.expect("control plane");
    let upstream: std::net::SocketAddr = cp
        .server()
        .trim_start_matches("https://")
        .parse()
        .expect("address");
    let (plain_relay, named_relay, http1_relay) = tokio::join!(
        Relay::start(upstream),
        Relay::start(upstream),
        Relay::start(upstream)
    );
    let provider = TestProvider::default();
    for (name, cluster) in [
        (
            "plain",
            through("plain", &cp, &plain_relay, None, true).await,
        ),
        (
            "named",
            through("named", &cp, &named_relay, Some("localhost"), true).await,
        ),
        (
            "http1",
            through("http1", &cp, &http1_relay, None, false).await,
        ),
        ("direct", cluster_for("direct", &cp).await),
    ] {
        provider.clusters.add(name, cluster).expect("add");
    }
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    manager
        .add_controller(
            recording_controller("recorder", Watch::<ConfigMap>::new(), &Recorder::default())
                .expect("controller"),
        )
        .expect("add");
    let (stop, task) = run_manager(&manager);
    wait_for_fleet(&manager, "every member to be ready", || {
        ["plain", "named", "http1", "direct"]
            .iter()
            .all(|name| state_of(&manager, name) == Some(ClusterState::Ready))
    })
    .await;

    let partitioned = ["plain", "named", "http1"];
    for relay in [&plain_relay, &named_relay, &http1_relay] {
        relay.partition(true);
    }
    let started = tokio::time::Instant::now();
    multicluster_runtime::testing::wait_for_fleet_within(
        &manager,
        PARTITION_REPORTED_WITHIN,
        "every partitioned member to be reported unreachable",
        || {
            partitioned
                .iter()
                .all(|name| matches!(state_of(&manager, name), Some(ClusterState::Unreachable(_))))
        },
    )
    .await;
    eprintln!("partition reported after {:?}", started.elapsed());
    assert_eq!(state_of(&manager, "direct"), Some(ClusterState::Ready));

    for relay in [&plain_relay, &named_relay, &http1_relay] {
        relay.partition(false);
    }
    wait_for_fleet(
        &manager,
        "every partitioned member to be ready again",
        || {
            partitioned
                .iter()
                .all(|name| state_of(&manager, name) == Some(ClusterState::Ready))
        },
    )
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
