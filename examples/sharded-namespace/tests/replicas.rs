//! Replicas of the sharded example, each its own process, over one fleet of
//! namespace-backed clusters on a real control plane: who holds each
//! cluster's fence, who wrote each copy and whose reconcile counters move
//! must all name the one owner rendezvous hashing picks.

use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams, PostParams};
use multicluster_coordinator::sharding::{Peer, fence_lease_name, owner};
use multicluster_envtest::ControlPlane;
use multicluster_example_configmap_sync::{COPIED_BY_ANNOTATION, SYNC_LABEL};
use multicluster_example_testing::replica::{Replica, ShardedArgs};
use multicluster_runtime::testing::eventually;
use serde_json::json;
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-sharded-namespace");
const FILTER: &str = "sharded";
const CLUSTERS: usize = 12;

/// How the replicas keep their fences (`--fence-hold`).
const RENEWED: &str = "renewed";
const WITH_PEER: &str = "with-peer";

/// A replica of the sharded example, with short leases so hand-overs
/// take seconds, not half a minute, keeping its fences as `hold` says.
fn start(cp: &ControlPlane, id: &str, hold: &str) -> Replica {
    ShardedArgs::new(id, FILTER, hold).quick().start(BINARY, cp)
}

/// The clusters `replica` says it works on.
async fn working_on(replica: &Replica) -> Option<Vec<String>> {
    replica.get("/clusters").await?;
    Some(
        replica
            .clusters()
            .await
            .into_iter()
            .filter(|(_, state)| state.ends_with("worked on here"))
            .map(|(name, _)| name)
            .collect(),
    )
}

fn peers(replicas: &[&Replica]) -> Vec<Peer> {
    let mut peers: Vec<Peer> = replicas
        .iter()
        .map(|r| Peer {
            id: r.id.clone(),
            weight: 1,
        })
        .collect();
    peers.sort();
    peers
}

fn names() -> Vec<String> {
    (0..CLUSTERS).map(|i| format!("shard-{i}")).collect()
}

/// Who rendezvous hashing says owns each cluster.
fn expected(replicas: &[&Replica]) -> BTreeMap<String, String> {
    let peers = peers(replicas);
    names()
        .into_iter()
        .map(|name| {
            let owner = owner(&name, &peers).expect("owner").id.clone();
            (name, owner)
        })
        .collect()
}

struct Fleet {
    client: kube::Client,
}

impl Fleet {
    async fn create(cp: &ControlPlane) -> Self {
        let client = cp.client().await.expect("client");
        let namespaces = Api::<Namespace>::all(client.clone());
        for name in names() {
            let mut namespace = Namespace::default();
            namespace.metadata.name = Some(name.clone());
            namespace.metadata.labels = Some(
                [(
                    "cluster.x-k8s.io/watch-filter".to_string(),
                    FILTER.to_string(),
                )]
                .into(),
            );
            namespaces
                .create(&PostParams::default(), &namespace)
                .await
                .expect("namespace");
            let mut source = ConfigMap::default();
            source.metadata.name = Some("settings".into());
            source.metadata.labels = Some([(SYNC_LABEL.to_string(), "true".to_string())].into());
            source.data = Some([("round".to_string(), "0".to_string())].into());
            Api::<ConfigMap>::namespaced(client.clone(), &name)
                .create(&PostParams::default(), &source)
                .await
                .expect("source");
        }
        Self { client }
    }

    /// The holder and acquire time of each cluster's fence.
    async fn fences(&self) -> BTreeMap<String, (Option<String>, Option<String>)> {
        self.fence_times()
            .await
            .into_iter()
            .map(|(name, (holder, acquired, _))| (name, (holder, acquired)))
            .collect()
    }

    /// The holder, acquire time and renew time of each cluster's fence.
    async fn fence_times(
        &self,
    ) -> BTreeMap<String, (Option<String>, Option<String>, Option<String>)> {
        let leases = Api::<Lease>::namespaced(self.client.clone(), "kube-system");
        let mut fences = BTreeMap::new();
        for name in names() {
            let lease = leases
                .get_opt(&fence_lease_name("mcr-shard", &name))
                .await
                .ok()
                .flatten();
            let spec = lease.and_then(|l| l.spec);
            fences.insert(
                name,
                (
                    spec.as_ref().and_then(|s| s.holder_identity.clone()),
                    spec.as_ref()
                        .and_then(|s| s.acquire_time.as_ref())
                        .map(|t| t.0.to_string()),
                    spec.and_then(|s| s.renew_time).map(|t| t.0.to_string()),
                ),
            );
        }
        fences
    }

    async fn holders(&self) -> BTreeMap<String, String> {
        self.fences()
            .await
            .into_iter()
            .filter_map(|(name, (holder, _))| Some((name, holder?)))
            .collect()
    }

    /// Changes every source so that its cluster's owner copies it again.
    async fn touch(&self, round: u32) {
        for name in names() {
            Api::<ConfigMap>::namespaced(self.client.clone(), &name)
                .patch(
                    "settings",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": {"round": round.to_string()}})),
                )
                .await
                .expect("touch");
        }
    }

    /// Whether every copy carries `round` and was written by its owner.
    async fn copied(&self, round: u32, owners: &BTreeMap<String, String>) -> bool {
        for name in names() {
            let copy = Api::<ConfigMap>::namespaced(self.client.clone(), &name)
                .get_opt("settings-copy")
                .await
                .ok()
                .flatten();
            let Some(copy) = copy else { return false };
            let by = copy
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(COPIED_BY_ANNOTATION));
            let data = copy.data.as_ref().and_then(|d| d.get("round"));
            if by != owners.get(&name) || data != Some(&round.to_string()) {
                return false;
            }
        }
        true
    }
}

/// Reconcile counts of every replica, keyed by replica then cluster.
async fn counts(replicas: &[&Replica]) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut all = BTreeMap::new();
    for replica in replicas {
        all.insert(replica.id.clone(), replica.reconciles_by_cluster().await);
    }
    all
}

/// Between `before` and `after`, only each cluster's owner reconciled it.
fn only_owners_reconciled(
    before: &BTreeMap<String, BTreeMap<String, u64>>,
    after: &BTreeMap<String, BTreeMap<String, u64>>,
    owners: &BTreeMap<String, String>,
) {
    for (replica, counts) in after {
        for (cluster, count) in counts {
            let was = before
                .get(replica)
                .and_then(|c| c.get(cluster))
                .copied()
                .unwrap_or(0);
            if count > &was {
                assert_eq!(
                    owners.get(cluster),
                    Some(replica),
                    "{replica} reconciled {cluster}, owned by {:?}",
                    owners.get(cluster)
                );
            }
        }
    }
    for (cluster, owner) in owners {
        let grew = after[owner].get(cluster).copied().unwrap_or(0)
            > before
                .get(owner)
                .and_then(|c| c.get(cluster))
                .copied()
                .unwrap_or(0);
        assert!(grew, "{owner} never reconciled {cluster}, which it owns");
    }
}

/// Waits until each replica says it works on exactly the clusters it owns.
async fn wait_until_working(replicas: &[&Replica], owners: &BTreeMap<String, String>) {
    for replica in replicas {
        let mine: Vec<_> = owners
            .iter()
            .filter(|(_, owner)| **owner == replica.id)
            .map(|(cluster, _)| cluster.clone())
            .collect();
        eventually(
            Polled::OtherProcess,
            "each replica at work on exactly its own clusters",
            || async { working_on(replica).await.as_ref() == Some(&mine) },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_fleet_and_hand_clusters_over() {
    share_and_hand_over(RENEWED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_holding_fences_with_their_peer_lease_share_and_hand_over() {
    share_and_hand_over(WITH_PEER).await;
}

async fn share_and_hand_over(hold: &str) {
    let cp = ControlPlane::start().await.expect("control plane");
    let fleet = Fleet::create(&cp).await;
    let r0 = start(&cp, "r0", hold);
    let r1 = start(&cp, "r1", hold);
    let mut r2 = start(&cp, "r2", hold);

    // Three replicas: every cluster's fence is held by its owner, the
    // owner wrote its copy, and no other replica reconciled it.
    let owners = expected(&[&r0, &r1, &r2]);
    let shares: std::collections::BTreeSet<_> = owners.values().collect();
    assert_eq!(
        shares.len(),
        3,
        "the fleet is too small to reach all three: {owners:?}"
    );
    eventually(
        Polled::ApiServer,
        "each cluster's fence held by its owner",
        || async { fleet.holders().await == owners },
    )
    .await;
    wait_until_working(&[&r0, &r1, &r2], &owners).await;
    eventually(
        Polled::ApiServer,
        "every copy written by its owner",
        || async { fleet.copied(0, &owners).await },
    )
    .await;
    // Replicas starting together may each see too few peers at first and
    // take a cluster they hand back a moment later: from here on only the
    // owners may reconcile.
    let before = counts(&[&r0, &r1, &r2]).await;
    fleet.touch(1).await;
    eventually(
        Polled::ApiServer,
        "every changed source copied by its owner",
        || async { fleet.copied(1, &owners).await },
    )
    .await;
    let after = counts(&[&r0, &r1, &r2]).await;
    only_owners_reconciled(&before, &after, &owners);

    // r2 dies without a word: its peer Lease and fences lapse, and the two
    // others take its clusters.
    let times_before = fleet.fence_times().await;
    r2.process.start_kill().expect("kill r2");
    r2.process.wait().await.expect("r2 gone");
    let killed = tokio::time::Instant::now();
    let owners = expected(&[&r0, &r1]);
    eventually(Polled::ApiServer, "r2's clusters taken over", || async {
        fleet.holders().await == owners
    })
    .await;
    eprintln!(
        "clusters of the killed replica taken over after {:?}",
        killed.elapsed()
    );
    // That took longer than the peer Lease (6 s), so fences renewed every
    // second have all been renewed since; fences held with the peer Lease
    // never are.
    let times_after = fleet.fence_times().await;
    let kept: Vec<&String> = owners
        .iter()
        .filter(|(cluster, owner)| times_before[*cluster].0.as_ref() == Some(*owner))
        .map(|(cluster, _)| cluster)
        .collect();
    assert!(!kept.is_empty(), "no cluster kept its holder: {owners:?}");
    for cluster in kept {
        let (before, after) = (&times_before[cluster].2, &times_after[cluster].2);
        if hold == WITH_PEER {
            assert_eq!(before, after, "the fence of {cluster} was renewed");
        } else {
            assert_ne!(before, after, "the fence of {cluster} was not renewed");
        }
    }
    wait_until_working(&[&r0, &r1], &owners).await;
    let before = counts(&[&r0, &r1]).await;
    fleet.touch(2).await;
    eventually(
        Polled::ApiServer,
        "every source copied by its new owner",
        || async { fleet.copied(2, &owners).await },
    )
    .await;
    only_owners_reconciled(&before, &counts(&[&r0, &r1]).await, &owners);

    // r3 joins: it takes its share, and nothing else moves.
    let fences_before = fleet.fences().await;
    let r3 = start(&cp, "r3", hold);
    let owners = expected(&[&r0, &r1, &r3]);
    eventually(Polled::ApiServer, "r3's share handed over", || async {
        fleet.holders().await == owners
    })
    .await;
    let fences_after = fleet.fences().await;
    let mut moved = 0;
    for (cluster, owner) in &owners {
        if owner == "r3" {
            moved += 1;
        } else {
            assert_eq!(
                fences_before[cluster], fences_after[cluster],
                "{cluster} changed hands though r3 does not own it"
            );
        }
    }
    assert!(moved > 0, "r3 owns nothing: {owners:?}");
    wait_until_working(&[&r0, &r1, &r3], &owners).await;
    let before = counts(&[&r0, &r1, &r3]).await;
    fleet.touch(3).await;
    eventually(
        Polled::ApiServer,
        "every source copied by its owner",
        || async { fleet.copied(3, &owners).await },
    )
    .await;
    only_owners_reconciled(&before, &counts(&[&r0, &r1, &r3]).await, &owners);

    // r3 stops cleanly: it hands its fences back and deletes its peer Lease,
    // so the others need not wait for anything to lapse. (Fences held with
    // the peer Lease are freed by its deletion, all at once; renewed ones
    // are cleared one by one.)
    let mut r3 = r3;
    let pid = r3.process.id().expect("r3 pid").to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(status.success());
    assert!(r3.process.wait().await.expect("r3 exit").success());
    let peers = Api::<Lease>::namespaced(fleet.client.clone(), "kube-system");
    assert!(
        peers
            .get_opt("mcr-peer-r3")
            .await
            .expect("peer lease")
            .is_none(),
        "r3 left its peer Lease behind"
    );
    let fences = fleet.fences().await;
    for (cluster, owner) in &owners {
        if owner == "r3" && hold == RENEWED {
            // Free, or already taken by its next owner.
            assert_ne!(
                fences[cluster].0.as_deref(),
                Some("r3"),
                "r3 kept the fence of {cluster}"
            );
        }
    }
    let owners = expected(&[&r0, &r1]);
    eventually(Polled::ApiServer, "r3's clusters taken over", || async {
        fleet.holders().await == owners
    })
    .await;
    wait_until_working(&[&r0, &r1], &owners).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_replica_works_on_without_its_fence() {
    stop_without_the_api_server(RENEWED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_replica_works_on_without_its_peer_lease() {
    stop_without_the_api_server(WITH_PEER).await;
}

/// With the API server gone, no fence (or peer Lease) can be renewed, and
/// every replica stops working before anything could lapse.
async fn stop_without_the_api_server(hold: &str) {
    let cp = ControlPlane::start().await.expect("control plane");
    let fleet = Fleet::create(&cp).await;
    let replicas = [start(&cp, "r0", hold), start(&cp, "r1", hold)];
    let owners = expected(&[&replicas[0], &replicas[1]]);
    eventually(
        Polled::ApiServer,
        "each cluster's fence held by its owner",
        || async { fleet.holders().await == owners },
    )
    .await;
    wait_until_working(&[&replicas[0], &replicas[1]], &owners).await;

    // With the API server gone no fence can be renewed, and every replica
    // stops working before its fences could lapse.
    cp.stop_api_server();
    let stopped = tokio::time::Instant::now();
    for replica in &replicas {
        eventually(
            Polled::OtherProcess,
            "the replica to stop all work",
            || async { working_on(replica).await == Some(Vec::new()) },
        )
        .await;
    }
    eprintln!(
        "all work stopped {:?} after the API server",
        stopped.elapsed()
    );

    // Back again: the owners take their fences again and carry on.
    cp.start_api_server().await.expect("API server back");
    wait_until_working(&[&replicas[0], &replicas[1]], &owners).await;
    fleet.touch(1).await;
    eventually(
        Polled::ApiServer,
        "every changed source copied by its owner",
        || async { fleet.copied(1, &owners).await },
    )
    .await;
}
