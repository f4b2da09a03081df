//! Sharding benchmark: N namespace-backed clusters on one real control
//! plane shared by replicas of this example, each replica a process of its
//! own, with the coordinator's default timings (Go's: peer Lease 30 s
//! renewed every 10 s, fence Lease 20 s renewed every 10 s, a look every
//! 5 s).
//!
//! The fence Leases are the truth of who works where (a replica works on a
//! cluster only while it holds its fence), so every figure is read from
//! them: the assignment is stable once every cluster's fence is held by the
//! replica rendezvous hashing picks among the live ones.
//!
//! 1. **Start**: four replicas start together; time until the assignment is
//!    stable.
//! 2. **Idle**: Lease requests per second at the API server over 30 s, and
//!    each replica's CPU and memory.
//! 3. **A fifth joins**: time until stable again, and how many clusters
//!    changed hands (rendezvous hashing moves about 1/5 of them).
//! 4. **One is killed** (SIGKILL, so it hands nothing back): time until its
//!    clusters are held by the others.
//!
//! Run with `make bench` or `cargo bench -p
//! multicluster-example-sharded-namespace --bench shards`; set
//! `SHARDING_CLUSTERS` to a comma-separated list of sizes (default 1000),
//! `SHARDING_REPLICAS` to the starting number of replicas (default 4) and
//! `SHARDING_FENCE_HOLD` to `renewed`, `with-peer` or both (the default),
//! how the replicas keep their fences.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::replica::Replica;
use multicluster_runtime::coordinator::sharding::{Peer, fence_lease_name, owner};
use multicluster_runtime::testing::{cpu_seconds_of, resident_memory_mib_of};

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-sharded-namespace");
const FILTER: &str = "bench";
const FENCE_PREFIX: &str = "mcr-shard";
const LEASE_NAMESPACE: &str = "kube-system";
/// Longest any phase may take before it is reported as never settling.
const PHASE_LIMIT: Duration = Duration::from_secs(300);

type Outcome = Result<(), Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Outcome {
    let sizes: Vec<usize> = std::env::var("SHARDING_CLUSTERS")
        .unwrap_or_else(|_| "1000".to_string())
        .split(',')
        .map(|size| size.trim().parse())
        .collect::<Result<_, _>>()?;
    let replicas: usize = std::env::var("SHARDING_REPLICAS")
        .ok()
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(4);
    let holds =
        std::env::var("SHARDING_FENCE_HOLD").unwrap_or_else(|_| "renewed,with-peer".to_string());
    println!(
        "| fences | clusters | replicas | stable after start | Lease requests/s idle | CPU per replica idle | RSS per replica | a fifth joins: stable after | clusters moved | one killed: stable after |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for size in sizes {
        for hold in holds.split(',').map(str::trim) {
            run(size, replicas, hold).await?;
        }
    }
    Ok(())
}

async fn run(clusters: usize, replicas: usize, hold: &str) -> Outcome {
    let cp = ControlPlane::start().await?;
    let admin = cp.client().await?;
    let names: Vec<String> = (0..clusters).map(|i| format!("shard-{i}")).collect();
    create_namespaces(&admin, &names).await?;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEASE_NAMESPACE);

    // The row's cells; a phase that never settles ends the row there.
    let mut cells = vec![hold.to_string(), clusters.to_string(), replicas.to_string()];
    let unsettled = format!("not stable within {} min", PHASE_LIMIT.as_secs() / 60);
    let started = Instant::now();
    let mut running: Vec<Replica> = (0..replicas)
        .map(|i| start(&cp, &format!("replica-{i}"), hold))
        .collect();
    let held = stable(&leases, &names, &running).await?;
    cells.push(match &held {
        Some(_) => format!("{:.1} s", started.elapsed().as_secs_f64()),
        None => unsettled.clone(),
    });

    let before = lease_requests(&admin).await;
    let cpu_before: Vec<f64> = running.iter().map(cpu_seconds).collect();
    let idle = Duration::from_secs(30);
    tokio::time::sleep(idle).await;
    let requests_per_second = (lease_requests(&admin).await - before) / idle.as_secs_f64();
    let cpu_per_minute = running
        .iter()
        .zip(&cpu_before)
        .map(|(replica, before)| (cpu_seconds(replica) - before) * 60.0 / idle.as_secs_f64())
        .sum::<f64>()
        / running.len() as f64;
    let rss = running.iter().map(resident_mib).sum::<f64>() / running.len() as f64;
    cells.push(format!("{requests_per_second:.0}"));
    cells.push(format!("{cpu_per_minute:.2} s/min"));
    cells.push(format!("{rss:.0} MiB"));

    if let Some(held) = held {
        let joined = Instant::now();
        running.push(start(&cp, &format!("replica-{replicas}"), hold));
        match stable(&leases, &names, &running).await? {
            Some(after_join) => {
                let moved = names
                    .iter()
                    .filter(|name| held.get(*name) != after_join.get(*name))
                    .count();
                cells.push(format!("{:.1} s", joined.elapsed().as_secs_f64()));
                cells.push(format!(
                    "{moved} ({:.0} %)",
                    moved as f64 * 100.0 / clusters as f64
                ));
                let mut killed = running.remove(0);
                killed.process.start_kill()?;
                killed.process.wait().await?;
                let killed_at = Instant::now();
                cells.push(match stable(&leases, &names, &running).await? {
                    Some(_) => format!("{:.1} s", killed_at.elapsed().as_secs_f64()),
                    None => unsettled.clone(),
                });
            }
            None => cells.push(unsettled.clone()),
        }
    }
    cells.resize(10, "—".to_string());
    println!("| {} |", cells.join(" | "));
    drop(running);
    cp.stop();
    Ok(())
}

/// A replica with the coordinator's default timings, keeping its fences
/// as `fence_hold` says.
fn start(cp: &ControlPlane, id: &str, fence_hold: &str) -> Replica {
    Replica::start(
        BINARY,
        cp,
        id,
        &[
            "--peer-id",
            id,
            "--watch-filter",
            FILTER,
            "--lease-namespace",
            LEASE_NAMESPACE,
            "--fence-hold",
            fence_hold,
        ],
    )
}

async fn create_namespaces(admin: &kube::Client, names: &[String]) -> Outcome {
    let api: Api<Namespace> = Api::all(admin.clone());
    let created: Vec<Result<Namespace, kube::Error>> = futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(
                        "cluster.x-k8s.io/watch-filter".to_string(),
                        FILTER.to_string(),
                    )])),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            async move { api.create(&PostParams::default(), &namespace).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    for result in created {
        result?;
    }
    Ok(())
}

/// Polls the fence Leases until every cluster's is held by its owner among
/// `running`; returns the holders, or `None` after [`PHASE_LIMIT`].
async fn stable(
    leases: &Api<Lease>,
    names: &[String],
    running: &[Replica],
) -> Result<Option<BTreeMap<String, String>>, Box<dyn std::error::Error>> {
    let mut peers: Vec<Peer> = running
        .iter()
        .map(|replica| Peer {
            id: replica.id.clone(),
            weight: 1,
        })
        .collect();
    peers.sort();
    let deadline = Instant::now() + PHASE_LIMIT;
    loop {
        let holders: BTreeMap<String, String> = leases
            .list(&ListParams::default())
            .await?
            .into_iter()
            .filter_map(|lease| {
                let holder = lease.spec?.holder_identity?;
                Some((lease.metadata.name?, holder))
            })
            .collect();
        let by_cluster: BTreeMap<String, String> = names
            .iter()
            .filter_map(|name| {
                let holder = holders.get(&fence_lease_name(FENCE_PREFIX, name))?;
                Some((name.clone(), holder.clone()))
            })
            .collect();
        let settled = names
            .iter()
            .all(|name| owner(name, &peers).map(|peer| &peer.id) == by_cluster.get(name));
        if settled {
            return Ok(Some(by_cluster));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Requests for Leases the API server has answered so far.
async fn lease_requests(admin: &kube::Client) -> f64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let Ok(metrics) = admin.request_text(request).await else {
        return 0.0;
    };
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"leases\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// CPU time of a replica so far.
fn cpu_seconds(replica: &Replica) -> f64 {
    replica.process.id().map_or(0.0, cpu_seconds_of)
}

/// Resident memory of a replica.
fn resident_mib(replica: &Replica) -> f64 {
    replica.process.id().map_or(0.0, resident_memory_mib_of)
}
