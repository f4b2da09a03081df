//! A member that ends every watch with `410 Gone` (a gateway or a broken
//! server: the resource version it was just given is "too old") is not
//! listed and watched again without a pause, silently: from the second
//! in a row its watch backs off (1 s, 2 s, 4 s, ...: the refusal
//! backoff), and from the third the cluster is degraded, naming the 410s,
//! however well each fresh list goes. Its lists are answered fine; the
//! rest of the fleet (the real local cluster) is ready throughout.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway::{self, Answer};
use common::*;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Manager;
use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::{
    Polled, eventually, recording_controller, wait_for_state, wait_until_ready,
};

/// When each watch came.
type Watches = Arc<Mutex<Vec<Instant>>>;

/// Lists answered with an empty ConfigMap list, every watch with one
/// ERROR event: 410 Expired.
async fn expiring_server(watches: Watches) -> SocketAddr {
    gateway::serve(move |asked| {
        if !asked.watch {
            return Answer::empty_list();
        }
        watches.lock().expect("lock").push(Instant::now());
        Answer::error_event(serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": "too old resource version: 1 (2)",
            "reason": "Expired",
            "code": 410,
        }))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_ending_every_watch_with_gone_backs_off_and_is_degraded() {
    let local = ControlPlane::start().await.expect("control plane");
    let watches = Watches::default();
    let server = expiring_server(watches.clone()).await;
    let member = KubeconfigCluster {
        inventory: Default::default(),
        policy: KubeconfigPolicy::trusted(),
        name: "expiring".into(),
        text: format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: http://{server}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: expiring-token\n"
        ),
        source: "the expiring kubeconfig".to_string(),
        stable_id: None,
        member: MemberOptions::default(),
    }
    .build()
    .await
    .expect("a cluster");
    let provider = TestProvider::default();
    provider.clusters.add("expiring", member).expect("add");
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

    let state = wait_for_state(&manager, "expiring", Duration::from_secs(60), |state| {
        matches!(state, Some(ClusterState::Degraded(reason)) if reason.contains("410 Gone"))
    })
    .await;
    let Some(ClusterState::Degraded(reason)) = state else {
        unreachable!("waited for degraded")
    };
    // Three or more, as far as the health walk got meanwhile.
    assert!(
        reason.contains("watching configmaps: ")
            && reason.contains(" watches in a row ended with 410 Gone before delivering a change"),
        "{reason}"
    );
    wait_until_ready(&manager, "").await;

    // Watches 2 to 5 come at least 1 + 2 + 4 s apart (the delays before
    // their random part): without the backoff they came within a second.
    eventually(Polled::OtherProcess, "five watches", || async {
        watches.lock().expect("lock").len() >= 5
    })
    .await;
    let times = watches.lock().expect("lock").clone();
    let spread = times[4].duration_since(times[1]);
    assert!(
        spread >= Duration::from_secs(7),
        "{spread:?} for watches 2 to 5"
    );
    // Still degraded: the fresh lists between them prove nothing.
    assert!(
        matches!(
            manager.cluster_state(&"expiring".into()),
            Some(ClusterState::Degraded(_))
        ),
        "{:?}",
        manager.cluster_state(&"expiring".into())
    );
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
