//! Replicas of the namespace example under leader election, each its own
//! process, over one fleet of namespace-backed clusters on a real control
//! plane: one replica works, the others stand by with their informers
//! running; a killed leader is replaced once its Lease lapses, a stopped
//! one hands over at once.

use multicluster_runtime::testing::Polled;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_example_configmap_sync::{COPIED_BY_ANNOTATION, SYNC_LABEL};
use multicluster_example_testing::replica::Replica;
use multicluster_runtime::testing::eventually;
use serde_json::json;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-namespace");
const FILTER: &str = "led";
const CLUSTERS: usize = 6;
const LEASE: &str = "namespace-example";
/// Short, so a lapse takes seconds; far enough apart that a hand-over by
/// release (within one retry period) cannot be mistaken for a lapse.
const LEASE_DURATION: Duration = Duration::from_secs(8);
const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// Starting a process, its first request and the test's own polling.
const SLACK: Duration = Duration::from_secs(3);

/// A replica of the namespace example under leader election, with short
/// timings.
fn start(cp: &ControlPlane, id: &str) -> Replica {
    Replica::start(
        BINARY,
        cp,
        id,
        &[
            "--watch-filter",
            FILTER,
            "--leader-elect",
            "--leader-election-id",
            LEASE,
            "--leader-election-namespace",
            "default",
            "--leader-election-identity",
            id,
            "--leader-election-lease-duration",
            "8s",
            "--leader-election-renew-deadline",
            "5s",
            "--leader-election-retry-period",
            "1s",
        ],
    )
}

/// Whether `replica` reports every cluster of the fleet in `state`.
async fn reports_all(replica: &Replica, state: &str) -> bool {
    let clusters: Vec<String> = replica
        .clusters()
        .await
        .into_iter()
        .filter(|(name, _)| name.starts_with("led-"))
        .map(|(_, state)| state)
        .collect();
    clusters.len() == CLUSTERS && clusters.iter().all(|s| s == state)
}

fn names() -> Vec<String> {
    (0..CLUSTERS).map(|i| format!("led-{i}")).collect()
}

struct Fleet {
    client: kube::Client,
}

impl Fleet {
    async fn create(cp: &ControlPlane) -> Self {
        let client = cp.client().await.expect("client");
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
            Api::<Namespace>::all(client.clone())
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

    /// The leader Lease's holder.
    async fn holder(&self) -> Option<String> {
        Api::<Lease>::namespaced(self.client.clone(), "default")
            .get_opt(LEASE)
            .await
            .ok()
            .flatten()?
            .spec?
            .holder_identity
            .filter(|holder| !holder.is_empty())
    }

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

    /// Whether every copy carries `round` and was written by `by`.
    async fn copied(&self, round: u32, by: &str) -> bool {
        for name in names() {
            let copy = Api::<ConfigMap>::namespaced(self.client.clone(), &name)
                .get_opt("settings-copy")
                .await
                .ok()
                .flatten();
            let Some(copy) = copy else { return false };
            let writer = copy
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(COPIED_BY_ANNOTATION));
            let data = copy.data.as_ref().and_then(|d| d.get("round"));
            if writer.map(String::as_str) != Some(by) || data != Some(&round.to_string()) {
                return false;
            }
        }
        true
    }

    /// ConfigMap watches open on the API server, from its own metrics.
    async fn configmap_watches(&self) -> u64 {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("request");
        let metrics = self
            .client
            .request_text(request)
            .await
            .expect("API server metrics");
        let watches: Vec<u64> = metrics
            .lines()
            .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
            .filter(|l| l.contains("resource=\"configmaps\"") && l.contains("verb=\"WATCH\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|n| n as u64)
            .collect();
        watches.iter().sum()
    }
}

/// Waits until a replica other than `not` holds the Lease; returns its
/// index and how long that took from `since`.
async fn new_leader(
    fleet: &Fleet,
    replicas: &[Replica],
    not: &str,
    since: Instant,
) -> (usize, Duration) {
    eventually(
        Polled::ApiServer,
        "a replica other than the last leader to take the Lease",
        || async { fleet.holder().await.is_some_and(|holder| holder != not) },
    )
    .await;
    let took = since.elapsed();
    let holder = fleet.holder().await.expect("holder");
    let leader = replicas
        .iter()
        .position(|r| r.id == holder)
        .unwrap_or_else(|| panic!("the Lease names {holder}, not a replica"));
    (leader, took)
}

/// Changes every source and waits until `leader` has copied it, while no
/// other replica reconciles.
async fn leads(fleet: &Fleet, replicas: &[Replica], leader: usize, round: u32) {
    let others: Vec<&Replica> = replicas
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, r)| r)
        .collect();
    let mut before = Vec::new();
    for replica in &others {
        before.push(replica.reconciles().await);
    }
    fleet.touch(round).await;
    let id = &replicas[leader].id;
    eventually(
        Polled::ApiServer,
        &format!("{id} to copy round {round}"),
        || fleet.copied(round, id),
    )
    .await;
    for (replica, before) in others.iter().zip(before) {
        assert_eq!(
            replica.reconciles().await,
            before,
            "{} reconciled while {id} led",
            replica.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_the_others_stand_by_warm_and_take_over() {
    let cp = ControlPlane::start().await.expect("control plane");
    let fleet = Fleet::create(&cp).await;
    let watches_before = fleet.configmap_watches().await;

    let mut replicas: Vec<Replica> = ["replica-a", "replica-b", "replica-c"]
        .into_iter()
        .map(|id| start(&cp, id))
        .collect();
    let (first, _) = new_leader(&fleet, &replicas, "", Instant::now()).await;
    let first_id = replicas[first].id.clone();
    eventually(Polled::ApiServer, "the leader to copy every source", || {
        fleet.copied(0, &first_id)
    })
    .await;

    // One leader at work on every cluster; the others know every cluster
    // and leave it to the leader.
    for replica in &replicas {
        let expected = if replica.id == first_id {
            "ready, worked on here"
        } else {
            "ready, left to another replica"
        };
        eventually(
            Polled::OtherProcess,
            &format!("{} to report {expected}", replica.id),
            || reports_all(replica, expected),
        )
        .await;
    }
    // Warm: each standby holds its own ConfigMap watch, as the leader does.
    eventually(
        Polled::ApiServer,
        "every replica to watch ConfigMaps",
        || async { fleet.configmap_watches().await == watches_before + 3 },
    )
    .await;
    leads(&fleet, &replicas, first, 1).await;

    // SIGKILL the leader: its Lease lapses, then a standby takes it.
    let killed = Instant::now();
    replicas[first].process.start_kill().expect("SIGKILL");
    replicas[first].process.wait().await.expect("killed");
    let mut gone = replicas.remove(first);
    let (second, took) = new_leader(&fleet, &replicas, &first_id, killed).await;
    assert!(
        took <= LEASE_DURATION + RETRY_PERIOD + SLACK,
        "taken over {took:?} after SIGKILL (lease {LEASE_DURATION:?} + retry {RETRY_PERIOD:?})"
    );
    eprintln!("SIGKILL: {} took over after {took:?}", replicas[second].id);
    leads(&fleet, &replicas, second, 2).await;

    // SIGTERM the new leader: it releases the Lease as it stops, so the
    // last replica takes it within a retry period, long before a lapse.
    let second_id = replicas[second].id.clone();
    let stopped = Instant::now();
    let status = multicluster_example_testing::terminate(
        &mut replicas[second].process,
        multicluster_example_testing::GRACE,
    )
    .await;
    assert!(status.success(), "{second_id} exited with {status}");
    let stopped_in = stopped.elapsed();
    replicas.remove(second);
    let (third, took) = new_leader(&fleet, &replicas, &second_id, stopped).await;
    assert!(
        took < stopped_in + RETRY_PERIOD + SLACK && took < LEASE_DURATION,
        "taken over {took:?} after SIGTERM ({second_id} took {stopped_in:?} to stop); a lapse would take {LEASE_DURATION:?}"
    );
    eprintln!(
        "SIGTERM: {} took over after {took:?} ({second_id} stopped in {stopped_in:?})",
        replicas[third].id
    );
    leads(&fleet, &replicas, third, 3).await;
    let _ = gone.process.kill().await;
}
