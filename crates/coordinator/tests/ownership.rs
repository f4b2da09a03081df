//! Ownership holds everywhere, not only in dispatch (Go's issue #172): two
//! sharded replicas over one fleet each hand out, through
//! `Manager::get_cluster`, only the clusters they own and refuse the
//! others' with `Error::NotOwned`; unknown names are not found; the local
//! cluster is always handed out; once a replica stops, the other owns
//! everything and the stopped one owns nothing. A stopping replica hands
//! its clusters over only once the work on them has settled.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use multicluster_coordinator::sharding::{
    FenceHold, ShardedCoordinator, ShardingOptions, until_split,
};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::coordinator::Coordinator;
use multicluster_runtime::testing::{TestProvider, object_holds_throughout, run_manager, wait_on};
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, Manager, ManagerOptions};
use tokio_util::sync::CancellationToken;

/// A cluster built from a control plane's admin kubeconfig.
async fn cluster_for(
    name: &str,
    cp: &multicluster_envtest::ControlPlane,
) -> multicluster_runtime::Cluster {
    multicluster_runtime::Cluster::new(name, cp.client().await.expect("client"))
}

const MEMBERS: [&str; 6] = ["m0", "m1", "m2", "m3", "m4", "m5"];

/// A replica: its manager over the shared fleet, under `peer_id`.
async fn replica(cp: &ControlPlane, peer_id: &str) -> (Manager, Arc<ShardedCoordinator>) {
    replica_holding(cp, peer_id, FenceHold::default()).await
}

/// A replica keeping its fences as `hold` says.
async fn replica_holding(
    cp: &ControlPlane,
    peer_id: &str,
    hold: FenceHold,
) -> (Manager, Arc<ShardedCoordinator>) {
    replica_with(
        cp,
        ShardingOptions::default()
            .peer_id(peer_id.to_string())
            .fence_hold(hold),
        ManagerOptions::default(),
    )
    .await
}

/// A replica with these options.
async fn replica_with(
    cp: &ControlPlane,
    sharding: ShardingOptions,
    options: ManagerOptions,
) -> (Manager, Arc<ShardedCoordinator>) {
    let provider = TestProvider::default();
    for name in MEMBERS {
        provider
            .clusters
            .add(name, cluster_for(name, cp).await)
            .expect("add");
    }
    let client = cp.client().await.expect("client");
    let coordinator = Arc::new(ShardedCoordinator::new(client, sharding).expect("coordinator"));
    let manager = Manager::builder(cluster_for("local", cp).await)
        .provider(Arc::new(provider))
        .coordinator(coordinator.clone())
        .options(options)
        .build();
    (manager, coordinator)
}

/// What `manager` answers for `name`: owned, not owned, or not found.
async fn answer(manager: &Manager, name: &str) -> &'static str {
    match manager.get_cluster(&ClusterName::from(name)).await {
        Ok(_) => "owned",
        Err(Error::NotOwned(_)) => "not owned",
        Err(Error::ClusterNotFound(_)) => "not found",
        Err(_) => "other error",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_hands_out_only_the_clusters_it_owns() {
    let cp = ControlPlane::start().await.expect("control plane");
    let ((a, a_coordinator), (b, b_coordinator)) =
        tokio::join!(replica(&cp, "replica-a"), replica(&cp, "replica-b"));
    let (a_stop, a_task) = run_manager(&a);
    let (b_stop, b_task) = run_manager(&b);

    // Both replicas see each other and split the fleet as rendezvous
    // hashing over the two says. Any other split is a step on the way
    // (one replica still holding what it is about to hand over), and a
    // member between the two is owned by neither for a moment.
    // The local cluster is sharded like any other; only members count.
    let shares = until_split(
        &[&a_coordinator, &b_coordinator],
        &MEMBERS,
        Duration::from_secs(60),
    )
    .await
    .expect("the fleet to be split between the replicas within a minute");
    assert_eq!(shares.concat().len(), MEMBERS.len());
    for name in MEMBERS {
        let cluster = ClusterName::from(name);
        let answers = (answer(&a, name).await, answer(&b, name).await);
        let expected = if a_coordinator.owns(&cluster) {
            ("owned", "not owned")
        } else {
            ("not owned", "owned")
        };
        assert_eq!(answers, expected, "{name}");
    }
    for manager in [&a, &b] {
        assert_eq!(answer(manager, "nowhere").await, "not found");
        assert!(manager.get_cluster(&ClusterName::local()).await.is_ok());
    }

    // A stops (handing its fences back): B owns everything, A nothing.
    a_stop.cancel();
    a_task.await.expect("task").expect("clean stop");
    wait_working_on_every_member(&b_coordinator).await;
    for name in MEMBERS {
        assert_eq!(answer(&b, name).await, "owned", "{name}");
        assert_eq!(answer(&a, name).await, "not owned", "{name}");
    }

    b_stop.cancel();
    b_task.await.expect("task").expect("clean stop");
}

async fn wait_working_on_every_member(coordinator: &ShardedCoordinator) {
    wait_on(
        "the replica to work on every member",
        &mut coordinator.working_set(),
        |owned| {
            MEMBERS
                .iter()
                .all(|name| owned.contains(&ClusterName::from(*name)))
        },
    )
    .await;
}

/// A component whose work outlives its clusters' lifetimes until let go:
/// a reconcile still finishing, a ledger still writing.
#[derive(Default)]
struct Lingering {
    lifetimes: Mutex<Vec<CancellationToken>>,
    let_go: CancellationToken,
}

impl Aware for Lingering {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        _cluster: Cluster,
    ) -> Result<(), Error> {
        if !name.is_local() {
            self.lifetimes.lock().expect("lifetimes").push(lifetime);
        }
        Ok(())
    }

    fn settled(&self, _name: &ClusterName) -> BoxFuture<'static, ()> {
        let let_go = self.let_go.clone();
        Box::pin(async move { let_go.cancelled().await })
    }
}

/// With fences held with the peer Lease, deleting that Lease frees every
/// cluster at once: a stopping replica must not delete it while work on
/// its clusters is still settling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_hands_its_clusters_over_only_once_their_work_settled() {
    let cp = ControlPlane::start().await.expect("control plane");
    let (manager, coordinator) = replica_holding(&cp, "replica-a", FenceHold::WithPeer).await;
    let lingering = Arc::new(Lingering::default());
    manager.add(lingering.clone()).expect("add");
    let (stop, task) = run_manager(&manager);
    wait_working_on_every_member(&coordinator).await;
    let engaged = lingering.lifetimes.lock().expect("lifetimes").len();
    assert_eq!(engaged, MEMBERS.len());

    stop.cancel();
    let lifetimes: Vec<CancellationToken> = lingering.lifetimes.lock().expect("lifetimes").clone();
    tokio::time::timeout(
        Duration::from_secs(60),
        futures::future::join_all(lifetimes.iter().map(CancellationToken::cancelled)),
    )
    .await
    .expect("the members' lifetimes to end within a minute");
    // The work has not settled: the peer Lease (and with it every fence)
    // stays for as long as it does not; two seconds are looked at.
    let leases: Api<Lease> = Api::namespaced(cp.client().await.expect("client"), "kube-system");
    object_holds_throughout(
        &leases,
        "mcr-peer-replica-a",
        Duration::from_secs(2),
        "the peer Lease stays while work on its clusters is still running",
        |lease| lease.is_some(),
    )
    .await;
    lingering.let_go.cancel();
    task.await.expect("task").expect("clean stop");
    assert!(
        leases
            .get_opt("mcr-peer-replica-a")
            .await
            .expect("peer lease")
            .is_none(),
        "the peer Lease stayed after the work settled"
    );
}

/// A replica whose work does not settle before the manager's stop deadline
/// is stopped anyway; its peer registry must stop with it, renewing no
/// more (and deleting nothing: the work may still run), so the others take
/// its clusters when the Lease lapses rather than never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_past_its_deadline_lets_its_peer_lease_lapse() {
    let cp = ControlPlane::start().await.expect("control plane");
    let (manager, coordinator) = replica_with(
        &cp,
        ShardingOptions::default()
            .peer_id("replica-a".to_string())
            .fence_hold(FenceHold::WithPeer)
            .peer_renew_interval(Duration::from_secs(1))
            .peer_lease_duration(Duration::from_secs(4)),
        ManagerOptions::default().shutdown_grace(Duration::from_secs(1)),
    )
    .await;
    let lingering = Arc::new(Lingering::default());
    manager.add(lingering.clone()).expect("add");
    let (stop, task) = run_manager(&manager);
    wait_working_on_every_member(&coordinator).await;
    // Never let go: the hand-back waits past the manager's deadline.
    stop.cancel();
    task.await.expect("task").expect("stopped");
    let leases: Api<Lease> = Api::namespaced(cp.client().await.expect("client"), "kube-system");
    let renewed = || async {
        leases
            .get_opt("mcr-peer-replica-a")
            .await
            .expect("peer lease")
            .and_then(|lease| lease.spec?.renew_time)
    };
    let last = renewed().await;
    assert!(
        last.is_some(),
        "the peer Lease was deleted with work running"
    );
    // Three renew intervals: a registry still running renews in each.
    object_holds_throughout(
        &leases,
        "mcr-peer-replica-a",
        Duration::from_secs(3),
        "the peer Lease is no longer renewed",
        |lease| lease.and_then(|lease| lease.spec.as_ref()?.renew_time.clone()) == last,
    )
    .await;
    lingering.let_go.cancel();
}
