//! The API server goes away for everyone (paused longer than a peer Lease
//! lasts): every replica stops its work, since none can renew, and every
//! peer Lease lapses. When it comes back each replica takes its own
//! clusters again, and no cluster goes to another replica in between: a
//! replica whose peer has not renewed yet in the first moments after the
//! outage does not count it as gone (it could not renew either). Nobody
//! ended anyone's epoch, so each replica resumes its fences as they are:
//! not one fence Lease is written.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use multicluster_coordinator::sharding::fence_lease_name;
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::replica::{Replica, ShardedArgs};
use multicluster_example_testing::sharding::{
    LedgerFile, create_namespaces, now, owner_among, wait_settled,
};

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-sharded-namespace");
const FILTER: &str = "outage";
const CLUSTERS: usize = 90;
const REPLICAS: [&str; 3] = ["r0", "r1", "r2"];
/// Longer than the peer Lease (6 s): every one lapses.
const OUTAGE: Duration = Duration::from_secs(9);
const SETTLE_LIMIT: Duration = Duration::from_secs(90);

/// The fence Leases of `names` and their resourceVersions.
async fn fence_versions(leases: &Api<Lease>, names: &[String]) -> BTreeMap<String, String> {
    let fences: BTreeMap<String, String> = names
        .iter()
        .map(|name| (fence_lease_name("mcr-shard", name), name.clone()))
        .collect();
    leases
        .list(&ListParams::default())
        .await
        .expect("leases")
        .items
        .into_iter()
        .filter_map(|lease| {
            let name = lease.metadata.name?;
            let cluster = fences.get(&name)?.clone();
            Some((cluster, lease.metadata.resource_version?))
        })
        .collect()
}

fn start(cp: &ControlPlane, id: &str, ledger: &Path) -> Replica {
    ShardedArgs::new(id, FILTER, "with-peer")
        .quick()
        .ledger(ledger)
        .start(BINARY, cp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_api_server_outage_every_cluster_goes_back_to_its_owner_only() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    let names: Vec<String> = (0..CLUSTERS).map(|i| format!("outage-{i}")).collect();
    create_namespaces(&admin, &names, FILTER)
        .await
        .expect("namespaces");
    let dir = tempfile::tempdir().expect("dir");
    let ledgers: Vec<LedgerFile> = REPLICAS
        .iter()
        .map(|id| LedgerFile {
            replica: id.to_string(),
            path: dir.path().join(format!("{id}.ledger")),
            ended_at: None,
        })
        .collect();
    let _replicas: Vec<Replica> = ledgers
        .iter()
        .map(|ledger| start(&cp, &ledger.replica, &ledger.path))
        .collect();
    wait_settled(&names, &REPLICAS, &ledgers, SETTLE_LIMIT)
        .await
        .expect("settled after the start");

    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
    let before = fence_versions(&leases, &names).await;
    assert_eq!(before.len(), CLUSTERS, "a fence missing: {before:?}");

    let paused_at = now();
    cp.pause_api_server().expect("pause");
    tokio::time::sleep(OUTAGE).await;
    cp.resume_api_server().expect("resume");
    let ownership = wait_settled(&names, &REPLICAS, &ledgers, SETTLE_LIMIT)
        .await
        .expect("settled after the outage");

    let stopped = names
        .iter()
        .filter(|name| {
            ownership
                .spells(name)
                .iter()
                .any(|spell| spell.end.is_some_and(|end| end > paused_at))
        })
        .count();
    assert!(
        stopped > 0,
        "no work stopped during the outage: it did not reach the replicas"
    );
    for name in &names {
        let owner = owner_among(name, &REPLICAS).expect("an owner");
        let others: Vec<_> = ownership
            .spells(name)
            .iter()
            .filter(|spell| spell.end.is_none_or(|end| end > paused_at))
            .filter(|spell| spell.replica != owner)
            .collect();
        assert!(
            others.is_empty(),
            "{name} (owned by {owner}) was worked on by another replica around the outage: {others:?}"
        );
    }
    let after = fence_versions(&leases, &names).await;
    let written: Vec<&String> = names
        .iter()
        .filter(|name| before.get(*name) != after.get(*name))
        .collect();
    assert!(
        written.is_empty(),
        "fences written around the outage (taken again rather than resumed): {written:?}"
    );
    let twice = ownership.worked_on_twice();
    assert!(twice.is_empty(), "worked on twice: {twice:?}");
}
