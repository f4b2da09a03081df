//! The two numbers sharding must keep at zero, over a fleet of a couple of
//! thousand namespace-backed clusters and four replicas (each its own
//! process), one of them killed with SIGKILL: no cluster worked on by two
//! replicas at once, and no cluster worked on by nobody for longer than a
//! killed replica's clusters must wait. Both are read from the replicas'
//! own records (`--ownership-ledger`), written as work starts and stops.
//! (`make bench` runs the same at 100,000 clusters: `benches/shards.rs`.)

use std::path::Path;
use std::time::Duration;

use multicluster_envtest::ControlPlane;
use multicluster_example_testing::replica::{Replica, ShardedArgs};
use multicluster_example_testing::sharding::{LedgerFile, create_namespaces, now, wait_settled};

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-sharded-namespace");
const FILTER: &str = "owned";
const CLUSTERS: usize = 2000;
const REPLICAS: usize = 4;

/// The replicas' timings: Go's defaults divided by five (a look every
/// second, the peer Lease lasting 6 s, each fence 4 s, both renewed every
/// second), the fences held with the peer Lease: what a fleet of thousands
/// needs (renewed one by one every second, 2,000 fences are 2,000 Lease
/// writes a second, more than this machine's API server answers in time:
/// fences are then lost for want of an answer, and clusters go unworked).
const LOOK: Duration = Duration::from_secs(1);
const PEER_LEASE: Duration = Duration::from_secs(6);
const FENCE_LEASE: Duration = Duration::from_secs(4);

/// How long a killed replica's clusters may go unworked: until its peer
/// Lease lapses (at most `PEER_LEASE` after the kill; the fences held with
/// it lapse with it), the next look of their new owners, and those owners
/// taking the fences one by one (a Lease write each, about 500 of them
/// shared by three replicas: 1 to 2 s here, 5 s allowed for a loaded
/// machine). Measured: 6.7 to 8.3 s.
const KILLED_CLUSTERS_WAIT: Duration = Duration::from_secs(6 + 1 + 5);

/// How long the fleet may take to settle after a start or a kill.
const SETTLE_LIMIT: Duration = Duration::from_secs(180);

fn start(cp: &ControlPlane, id: &str, ledger: &Path) -> Replica {
    let secs = |d: Duration| format!("{}s", d.as_secs());
    ShardedArgs::new(id, FILTER, "with-peer")
        .quick()
        .set("--probe-interval", secs(LOOK))
        .set("--peer-lease-duration", secs(PEER_LEASE))
        .set("--fence-lease-duration", secs(FENCE_LEASE))
        .ledger(ledger)
        .start(BINARY, cp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cluster_is_worked_on_twice_or_left_unworked_when_a_replica_is_killed() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    let names: Vec<String> = (0..CLUSTERS).map(|i| format!("owned-{i}")).collect();
    create_namespaces(&admin, &names, FILTER)
        .await
        .expect("namespaces");
    let dir = tempfile::tempdir().expect("dir");
    let mut ledgers: Vec<LedgerFile> = (0..REPLICAS)
        .map(|i| LedgerFile {
            replica: format!("replica-{i}"),
            path: dir.path().join(format!("replica-{i}.ledger")),
            ended_at: None,
        })
        .collect();
    let mut replicas: Vec<Replica> = ledgers
        .iter()
        .map(|ledger| start(&cp, &ledger.replica, &ledger.path))
        .collect();
    let ids: Vec<String> = ledgers.iter().map(|l| l.replica.clone()).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    wait_settled(&names, &ids, &ledgers, SETTLE_LIMIT)
        .await
        .expect("settled after the start");
    let stable = now();

    // SIGKILL: it hands nothing back, and writes nothing more.
    let mut killed = replicas.pop().expect("a replica");
    killed.process.kill().await.expect("SIGKILL");
    let killed_at = now();
    ledgers[REPLICAS - 1].ended_at = Some(killed_at);
    let ownership = wait_settled(&names, &ids[..REPLICAS - 1], &ledgers, SETTLE_LIMIT)
        .await
        .expect("settled after the kill");
    let end = now();

    let twice = ownership.worked_on_twice();
    assert!(
        twice.is_empty(),
        "{} clusters worked on by two replicas at once, e.g. {:?}",
        twice.len(),
        twice.iter().take(3).collect::<Vec<_>>()
    );
    let unowned = ownership.longest_unowned(&names, stable, end);
    let (worst, longest) = unowned
        .iter()
        .max_by_key(|(_, gap)| **gap)
        .expect("clusters");
    eprintln!(
        "longest unworked after the kill: {longest:?} ({worst}); settled {:?} after it",
        Duration::from_nanos(u64::try_from(end - killed_at).unwrap_or(u64::MAX))
    );
    assert!(
        *longest <= KILLED_CLUSTERS_WAIT,
        "{worst} went unworked for {longest:?}; {} clusters longer than {KILLED_CLUSTERS_WAIT:?}",
        unowned
            .values()
            .filter(|gap| **gap > KILLED_CLUSTERS_WAIT)
            .count()
    );
    // Only the killed replica's clusters changed hands.
    let moved = unowned.values().filter(|gap| !gap.is_zero()).count();
    assert!(
        moved < CLUSTERS / 2,
        "{moved} clusters went unworked for a while"
    );
}
