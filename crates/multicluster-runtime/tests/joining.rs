//! A sharded replica joins its peers (writes its peer Lease) only once its
//! provider has engaged the inventory it first found and the manager has
//! checked each of those clusters (handed to the coordinator, or found
//! unreachable): the others never hand it clusters it cannot work on yet.
//! A provider that never says so delays the join by `inventory_wait`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::coordinator::Coordinator;
use multicluster_runtime::coordinator::sharding::{ShardedCoordinator, ShardingOptions};
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::testing::{eventually, run_manager, wait_until_ready};
use multicluster_runtime::{Manager, ProviderContext, RunnableProvider};
use tokio_util::sync::CancellationToken;

const MEMBERS: [&str; 3] = ["m0", "m1", "m2"];

/// A provider whose clusters are all engaged at the start, but which says
/// so only when the test lets it (`said`), if ever.
#[derive(Clone, Debug, Default)]
struct Holding {
    clusters: Clusters,
    said: Option<CancellationToken>,
}

impl ClusterSetProvider for Holding {
    fn cluster_set(&self) -> &Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for Holding {
    async fn start(&self, context: ProviderContext) -> Result<(), multicluster_runtime::Error> {
        self.clusters
            .start(context.shutdown.clone(), context.aware.clone())?;
        if let Some(said) = &self.said {
            tokio::select! {
                () = said.cancelled() => context.inventory_engaged(),
                () = context.shutdown.cancelled() => {}
            }
        }
        context.shutdown.cancelled().await;
        Ok(())
    }
}

async fn replica(
    cp: &ControlPlane,
    provider: Holding,
    sharding: ShardingOptions,
) -> (Manager, Arc<ShardedCoordinator>) {
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
        .build();
    (manager, coordinator)
}

/// Whether `coordinator` works on every member (and the local cluster).
fn works_on_every_member(coordinator: &ShardedCoordinator) -> bool {
    let working_on = coordinator.working_on().unwrap_or_default();
    MEMBERS
        .iter()
        .all(|name| working_on.iter().any(|held| held.as_str() == *name))
}

async fn peer_lease(cp: &ControlPlane, name: &str) -> Option<Lease> {
    let leases: Api<Lease> = Api::namespaced(cp.client().await.expect("client"), "kube-system");
    leases.get_opt(name).await.expect("peer lease")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joins_its_peers_only_once_its_inventory_is_engaged() {
    let cp = ControlPlane::start().await.expect("control plane");
    let said = CancellationToken::new();
    let provider = Holding {
        said: Some(said.clone()),
        ..Holding::default()
    };
    let (manager, coordinator) = replica(
        &cp,
        provider,
        ShardingOptions::default().peer_id("r0".to_string()),
    )
    .await;
    let (shutdown, run) = run_manager(&manager);
    // Every member is engaged and checked (ready), and the replica still
    // has not joined: its provider has not said the inventory is engaged.
    for name in MEMBERS {
        wait_until_ready(&manager, name).await;
    }
    assert!(
        peer_lease(&cp, "mcr-peer-r0").await.is_none(),
        "the replica joined before its provider said its inventory was engaged"
    );
    assert_eq!(
        coordinator.working_on(),
        Some(Vec::new()),
        "working before joining"
    );

    said.cancel();
    eventually("the replica joins", || async {
        peer_lease(&cp, "mcr-peer-r0").await.is_some()
    })
    .await;
    eventually("the replica works on every member", || async {
        works_on_every_member(&coordinator)
    })
    .await;
    shutdown.cancel();
    run.await.expect("manager task").expect("manager");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_never_says_delays_the_join_by_the_inventory_wait_only() {
    let cp = ControlPlane::start().await.expect("control plane");
    let (manager, coordinator) = replica(
        &cp,
        Holding::default(),
        ShardingOptions::default()
            .peer_id("r0".to_string())
            .inventory_wait(Duration::from_secs(3)),
    )
    .await;
    let (shutdown, run) = run_manager(&manager);
    eventually("the replica joins after the wait", || async {
        peer_lease(&cp, "mcr-peer-r0").await.is_some()
    })
    .await;
    eventually("the replica works on every member", || async {
        works_on_every_member(&coordinator)
    })
    .await;
    shutdown.cancel();
    run.await.expect("manager task").expect("manager");
}
