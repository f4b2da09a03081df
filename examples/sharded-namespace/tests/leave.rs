//! A replica that leaves (SIGTERM) while holding its fences with its peer
//! Lease hands each cluster straight to its next owner (its fence written
//! as that replica's) before it deletes that Lease; and the others learn of
//! peers coming and going from a watch of the peer Leases, not only at
//! their next read.
//!
//! The replicas read their peers every ten minutes here, so every
//! hand-over in this test that happens within its limit was set off by
//! the watch: without it, two replicas started together would not split
//! the fleet, and the leaver's clusters would wait ten minutes.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use multicluster_coordinator::sharding::fence_lease_name;
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::replica::{Replica, ShardedArgs};
use multicluster_example_testing::sharding::{
    LedgerFile, create_namespaces, now, owner_among, wait_settled,
};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-sharded-namespace");
const FILTER: &str = "leaving";
const CLUSTERS: usize = 200;
const LEASE_NAMESPACE: &str = "kube-system";

/// Far longer than the test: only the watch can tell of a peer in time.
const PEER_RENEW: &str = "600s";
const PEER_LEASE: &str = "1800s";
/// How long the fleet may take to settle: a minute, a tenth of a read.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

fn start(cp: &ControlPlane, id: &str, ledger: &Path) -> Replica {
    ShardedArgs::new(id, FILTER, "with-peer")
        .set("--lease-namespace", LEASE_NAMESPACE)
        .set("--probe-interval", "1s")
        .set("--peer-lease-duration", PEER_LEASE)
        .set("--peer-renew-interval", PEER_RENEW)
        .ledger(ledger)
        .start(BINARY, cp)
}

async fn signal(replica: &Replica, signal: &str) {
    let pid = replica.process.id().expect("running").to_string();
    let status = Command::new("kill")
        .args([signal, &pid])
        .status()
        .await
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_replica_hands_its_clusters_over_and_the_others_see_it_leave() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    let names: Vec<String> = (0..CLUSTERS).map(|i| format!("leaving-{i}")).collect();
    create_namespaces(&admin, &names, FILTER)
        .await
        .expect("namespaces");
    let dir = tempfile::tempdir().expect("dir");
    let mut ledgers: Vec<LedgerFile> = ["r0", "r1"]
        .into_iter()
        .map(|id| LedgerFile {
            replica: id.to_string(),
            path: dir.path().join(format!("{id}.ledger")),
            ended_at: None,
        })
        .collect();
    let r0 = start(&cp, "r0", &ledgers[0].path);
    let mut r1 = start(&cp, "r1", &ledgers[1].path);
    // Started together, each may read the peers before the other wrote its
    // Lease; only the watch tells them of each other within the limit.
    wait_settled(&names, &["r0", "r1"], &ledgers, SETTLE_LIMIT)
        .await
        .expect("two replicas split the fleet");

    let r1_share: Vec<&String> = names
        .iter()
        .filter(|name| owner_among(name, &["r0", "r1"]).as_deref() == Some("r1"))
        .collect();
    assert!(!r1_share.is_empty(), "r1 owns nothing");

    // r0 is paused, so nothing it does can change the fences while r1
    // leaves: what r1 leaves behind is what its leave wrote. r0's Lease
    // still holds (it is renewed every ten minutes), so r1 hands its
    // clusters to it.
    signal(&r0, "-STOP").await;
    signal(&r1, "-TERM").await;
    let exited = tokio::time::timeout(Duration::from_secs(60), r1.process.wait())
        .await
        .expect("r1 exits within a minute of SIGTERM")
        .expect("exit status");
    assert!(exited.success(), "r1 exited with {exited}");
    ledgers[1].ended_at = Some(now());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);
    assert!(
        leases
            .get_opt("mcr-peer-r1")
            .await
            .expect("peer lease")
            .is_none(),
        "r1 left its peer Lease behind"
    );
    // Its fences name r0 now, handed over by r1: none waits for its Lease
    // to go and for r0 to take it.
    for name in &r1_share {
        let fence = leases
            .get(&fence_lease_name("mcr-shard", name))
            .await
            .expect("fence");
        let handed_by = fence
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get("mcr.sigs.k8s.io/handed-by").cloned());
        let holder = fence.spec.and_then(|spec| spec.holder_identity);
        assert_eq!(
            (holder.as_deref(), handed_by.as_deref()),
            (Some("r0"), Some("r1")),
            "the fence of {name} was not handed from r1 to r0 at the leave"
        );
    }

    // r0 goes on: its watch of the fences handed to it tells it of r1's
    // clusters, and of r1's Lease gone, long before its next read of the
    // peers.
    let resumed = now();
    signal(&r0, "-CONT").await;
    let ownership = wait_settled(&names, &["r0"], &ledgers, SETTLE_LIMIT)
        .await
        .expect("r0 works on every cluster");
    let twice = ownership.worked_on_twice();
    assert!(
        twice.is_empty(),
        "{} clusters worked on by two replicas at once, e.g. {:?}",
        twice.len(),
        twice.keys().take(3).collect::<Vec<_>>()
    );
    eprintln!(
        "r1's {} clusters worked on by r0 {:?} after it went on",
        r1_share.len(),
        Duration::from_nanos(u64::try_from(now() - resumed).unwrap_or(u64::MAX))
    );
    drop(r0);
}
