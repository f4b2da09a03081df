//! File descriptors: the manager raises the soft open-files limit at start,
//! and a cluster that cannot connect because none is left says so, rather
//! than showing a generic connection error. (One test: the limit is the
//! process's, so nothing may run beside it.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::{wait_for_fleet, wait_for_state};
use multicluster_runtime::{ClusterName, Manager, ManagerOptions};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_are_raised_and_running_out_is_reported_as_such() {
    let member = ControlPlane::start().await.expect("member");
    let start = getrlimit(Resource::Nofile);
    let low = start.maximum.map(|hard| hard.min(1024).saturating_sub(1));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: low,
            maximum: start.maximum,
        },
    )
    .expect("lower the soft limit");

    let provider = TestProvider::default();
    let text = multicluster_envtest::to_yaml(member.kubeconfig()).expect("yaml");
    let cluster = KubeconfigCluster {
        inventory: Default::default(),
        policy: multicluster_runtime::client::KubeconfigPolicy::default(),
        name: "member".into(),
        text,
        source: "test kubeconfig".into(),
        stable_id: None,
        member: MemberOptions::default(),
    }
    .build()
    .await
    .expect("cluster");
    provider.clusters.add("member", cluster).expect("add");
    let manager = Manager::builder(cluster_for("local", &member).await)
        .provider(Arc::new(provider))
        .options(ManagerOptions::default().unhealthy_after(Duration::from_secs(1)))
        .build();
    // A watch on the member, which must connect again after the outage.
    manager
        .add_controller(
            multicluster_runtime::testing::recording_controller(
                "watching",
                multicluster_runtime::controller::Watch::<k8s_openapi::api::core::v1::ConfigMap>::new(),
                &Recorder::default(),
            )
            .expect("controller"),
        )
        .expect("add");
    let (stop, task) = run_manager(&manager);
    let name = ClusterName::from("member");
    wait_for_fleet(&manager, "the member to be ready", || {
        manager.cluster_state(&name) == Some(ClusterState::Ready)
    })
    .await;
    assert_eq!(
        getrlimit(Resource::Nofile).current,
        start.maximum,
        "the manager raised the soft limit to the hard one"
    );

    // No descriptor left when the member's connections must be made again:
    // a limit just above what is open, and the rest taken.
    member.stop_api_server();
    let open = std::fs::read_dir("/proc/self/fd").expect("/proc").count() as u64;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(open + 16),
            maximum: start.maximum,
        },
    )
    .expect("a tight limit");
    let mut hoard = Vec::new();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        hoard.push(file);
        assert!(hoard.len() < 1_000, "the tight limit holds");
    }
    let reported = wait_for_state(&manager, "member", Duration::from_secs(60), |state| {
        matches!(state, Some(ClusterState::Unreachable(reason))
            if reason.starts_with("this process has run out of file descriptors"))
    })
    .await;
    drop(hoard);
    let Some(ClusterState::Unreachable(reason)) = reported else {
        panic!("waited for unreachable, got {reported:?}");
    };
    assert!(reason.contains("open-files limit"), "{reason}");

    member.start_api_server().await.expect("back");
    wait_for_fleet(&manager, "the member to be ready again", || {
        manager.cluster_state(&name) == Some(ClusterState::Ready)
    })
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
    setrlimit(Resource::Nofile, start).expect("restore the limit");
}
