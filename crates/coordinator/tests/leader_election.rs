//! Leader election against real API servers: a leader whose management
//! API server hangs stops all work before its Lease could lapse for the
//! others, and leads again once the server answers. (Several replicas as
//! separate processes are tested with `examples/namespace`.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use multicluster_coordinator::leader_election::{LeaderElection, LeaderElectionOptions};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::coordinator::Coordinator;
use multicluster_runtime::testing::recording_manager_from;
use multicluster_runtime::testing::{TestProvider, run_manager, wait_on};
use multicluster_runtime::{Cluster, Manager};

/// A cluster built from a control plane's admin kubeconfig.
async fn cluster_for(
    name: &str,
    cp: &multicluster_envtest::ControlPlane,
) -> multicluster_runtime::Cluster {
    multicluster_runtime::Cluster::new(name, cp.client().await.expect("client"))
}

fn req(cluster: &str, name: &str) -> multicluster_runtime::controller::Request {
    multicluster_runtime::controller::Request::new(cluster, Some("default"), name)
}

const LEASE_DURATION: Duration = Duration::from_secs(8);

fn options() -> LeaderElectionOptions {
    LeaderElectionOptions::new("recorder")
        .namespace("default")
        .identity("only-replica".to_string())
        .lease_duration(LEASE_DURATION)
        .renew_deadline(Duration::from_secs(5))
        .retry_period(Duration::from_secs(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_api_server_hangs_stops_working_before_its_lease_lapses() {
    let management = ControlPlane::start().await.expect("management");
    let member = ControlPlane::start().await.expect("member");
    member
        .create_config_map("before", &[])
        .await
        .expect("config map");
    let provider = TestProvider::default();
    provider
        .clusters
        .add("m1", cluster_for("m1", &member).await)
        .expect("add");
    let local = Cluster::new("local", management.client().await.expect("client"));
    let election = LeaderElection::new(local.client(), options()).expect("election");
    let (manager, recorder) = recording_manager_from(
        Manager::builder(local)
            .provider(Arc::new(provider))
            .coordinator(Arc::new(election.clone())),
    );
    let (stop, task) = run_manager(&manager);

    recorder.wait_for_more(&req("m1", "before"), 0).await;
    assert!(election.is_leader());
    assert_eq!(election.leader().as_deref(), Some("only-replica"));
    let mine = election.working_on().expect("a set");
    assert!(mine.iter().any(|name| name.as_str() == "m1"), "{mine:?}");

    // The management API server hangs: no renewal answers.
    management.pause_api_server().expect("pause");
    let paused = Instant::now();
    // It tells of standing down by letting go of the leader it shows.
    let mut leader = election.watch_leader();
    wait_on("the leader to stop working", &mut leader, |_| {
        !election.is_leader() && election.working_on() == Some(Vec::new())
    })
    .await;
    let stood_down = paused.elapsed();
    // The Lease was last renewed before the pause; others may take it
    // LEASE_DURATION after that, so all work must have stopped by then.
    assert!(
        stood_down < LEASE_DURATION,
        "still working {stood_down:?} after the API server hung"
    );
    eprintln!("stood down {stood_down:?} after the API server hung");

    // Back: the Lease still names this replica, which leads again and
    // catches up with what changed in the member meanwhile.
    member
        .create_config_map("meanwhile", &[])
        .await
        .expect("config map");
    management.resume_api_server().expect("resume");
    recorder.wait_for_more(&req("m1", "meanwhile"), 0).await;
    assert!(election.is_leader());

    stop.cancel();
    task.await.expect("task").expect("clean stop");
    // Released on the way out.
    let lease = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        management.client().await.expect("client"),
        "default",
    )
    .get("recorder")
    .await
    .expect("lease");
    let holder = lease.spec.and_then(|spec| spec.holder_identity);
    assert_eq!(holder, None, "the Lease still names a holder after stop");
}
