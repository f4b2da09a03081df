//! Leader election benchmark: N clusters (kubeconfig-built clients to one
//! real control plane, each cache limited to its own namespace of 100
//! ConfigMaps), one controller, replicas under `LeaderElection` with
//! client-go's default timings (Lease 15 s, renew deadline 10 s, retry
//! 2 s), each replica a process of its own (this benchmark run again).
//!
//! Reports, for each way a replica comes to lead, the time to take the
//! Lease, to the first reconcile and to every object reconciled:
//!
//! - **cold start**: a replica starts alone and the Lease is free (what a
//!   restarted single replica goes through), counted from its start;
//! - **after SIGKILL** of the leader: its Lease is neither renewed nor
//!   released, and a warm standby waits for it to lapse;
//! - **after SIGTERM** of the leader: it releases the Lease as it stops,
//!   and the warm standby takes it at its next try.
//!
//! Run with `make bench` or `cargo bench -p multicluster-runtime --bench
//! failover`; set `FAILOVER_CLUSTERS` to choose N (default 100).

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_coordinator::leader_election::{LeaderElection, LeaderElectionOptions};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::testing::TestProvider;
use multicluster_runtime::{Cluster, Manager};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio_util::sync::CancellationToken;

const OBJECTS_PER_CLUSTER: usize = 100;
const LEASE: &str = "failover-bench";

type Outcome = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// Milliseconds since the epoch: comparable between the processes.
fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_millis())
        .unwrap_or_default()
}

/// What one replica reconciled.
#[derive(Default)]
struct Seen {
    requests: HashSet<Request>,
}

/// A replica process: runs a manager over the fleet of the control plane
/// in `$KUBECONFIG` and prints `<event> <ms>` lines as it gets warm, leads,
/// first reconciles and has reconciled every object. Stops on SIGTERM.
async fn replica(id: &str, clusters: usize) -> Outcome {
    let kubeconfig = kube::config::Kubeconfig::read()?;
    let provider = TestProvider::default();
    let mut members = Vec::new();
    for c in 0..clusters {
        let name = format!("failover-{c}");
        let client = multicluster_envtest::client_for(&kubeconfig).await?;
        let cache = Cache::with_options(
            name.as_str(),
            client.clone(),
            CacheOptions::default().namespace(Some(name.clone())),
        );
        let cluster = Cluster::with_cache(name.as_str(), client, cache);
        members.push(cluster.clone());
        provider.clusters.add(name.as_str(), cluster)?;
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let controller = {
        let seen = seen.clone();
        Controller::builder("failover")
            .for_resource(Watch::<ConfigMap>::new())
            .max_concurrent_reconciles(8)
            .build(move |request, _cluster| {
                let seen = seen.clone();
                async move {
                    let mut seen = seen
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if seen.requests.is_empty() {
                        println!("first {}", now_ms());
                    }
                    seen.requests.insert(request);
                    Ok::<_, Never>(Action::await_change())
                }
            })?
    };
    let local = Cluster::new(
        "local",
        multicluster_envtest::client_for(&kubeconfig).await?,
    );
    let election = LeaderElection::new(
        local.client(),
        LeaderElectionOptions::new(LEASE)
            .namespace("default")
            .identity(id.to_string()),
    )?;
    let manager = Manager::builder(local)
        .provider(Arc::new(provider))
        .coordinator(Arc::new(election.clone()))
        .build();
    manager.add_controller(controller)?;
    let shutdown = CancellationToken::new();
    let task = {
        let (manager, shutdown) = (manager.clone(), shutdown.clone());
        tokio::spawn(async move { manager.run(shutdown).await })
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let objects = clusters * OBJECTS_PER_CLUSTER;
    let (mut warm, mut leading, mut all) = (false, false, false);
    // Leadership is followed as it changes; the rest is polled every
    // millisecond.
    let mut leader = election.watch_leader();
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = leader.changed() => {}
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
        if !warm
            && members
                .iter()
                .all(|c| c.cache().informer_count() > 0 && c.cache().is_synced())
        {
            warm = true;
            println!("warm {}", now_ms());
        }
        if !leading && leader.borrow().as_deref() == Some(id) {
            leading = true;
            println!("leading {}", now_ms());
        }
        let reconciled = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .requests
            .len();
        if !all && reconciled >= objects {
            all = true;
            println!("all {}", now_ms());
        }
    }
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// A replica process and the events it printed.
struct Process {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    events: HashMap<String, u128>,
}

impl Process {
    fn start(
        cp: &ControlPlane,
        id: &str,
        clusters: usize,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let mut child = Command::new(std::env::current_exe()?)
            .env("FAILOVER_REPLICA", id)
            .env("FAILOVER_CLUSTERS", clusters.to_string())
            .env("KUBECONFIG", cp.kubeconfig_path())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok(Self {
            child,
            lines: BufReader::new(stdout).lines(),
            events: HashMap::new(),
        })
    }

    /// Waits for `event` (which may have been printed already) and
    /// returns when it happened.
    async fn wait_for(&mut self, event: &str) -> Result<u128, Box<dyn std::error::Error>> {
        let wait = async {
            loop {
                if let Some(at) = self.events.get(event) {
                    return Ok(*at);
                }
                let Some(line) = self.lines.next_line().await? else {
                    return Err(format!("the replica exited before {event}").into());
                };
                if let Some((name, at)) = line.split_once(' ')
                    && let Ok(at) = at.trim().parse()
                {
                    self.events.entry(name.to_string()).or_insert(at);
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(600), wait)
            .await
            .map_err(|_| format!("no {event} within 600 s"))?
    }

    async fn signal(&mut self, signal: &str) -> Outcome {
        let pid = self.child.id().ok_or("exited")?.to_string();
        let status = Command::new("kill").args([signal, &pid]).status().await?;
        if !status.success() {
            return Err(format!("kill {signal} {pid}").into());
        }
        Ok(())
    }
}

/// Prints when `replica` led, first reconciled and had reconciled every
/// object, counted from `since` (ms since the epoch).
async fn report(case: &str, replica: &mut Process, since: u128, objects: usize) -> Outcome {
    let leading = replica.wait_for("leading").await?;
    let first = replica.wait_for("first").await?;
    let all = replica.wait_for("all").await?;
    let s = |at: u128| at.saturating_sub(since) as f64 / 1000.0;
    println!(
        "{case:<28} leads after {:>6.2}s  first reconcile {:>6.2}s  all {objects} objects {:>6.2}s  (lead to first reconcile {:>6.3}s)",
        s(leading),
        s(first),
        s(all),
        first.saturating_sub(leading) as f64 / 1000.0,
    );
    Ok(())
}

async fn create_fleet(cp: &ControlPlane, clusters: usize) -> Outcome {
    let admin = cp.client().await?;
    for c in 0..clusters {
        let ns = format!("failover-{c}");
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        let api = Api::<ConfigMap>::namespaced(admin.clone(), &ns);
        for i in 0..OBJECTS_PER_CLUSTER {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("cm-{i}")),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &cm).await?;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Outcome {
    let clusters: usize = std::env::var("FAILOVER_CLUSTERS")
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(100);
    if let Ok(id) = std::env::var("FAILOVER_REPLICA") {
        return replica(&id, clusters).await;
    }
    let objects = clusters * OBJECTS_PER_CLUSTER;
    let cp = ControlPlane::start().await?;
    create_fleet(&cp, clusters).await?;
    println!(
        "clusters={clusters} objects={objects}; Lease 15s, renew deadline 10s, retry 2s; one process per replica"
    );

    let started = now_ms();
    let mut a = Process::start(&cp, "replica-a", clusters)?;
    report("cold start (from its start)", &mut a, started, objects).await?;

    let mut b = Process::start(&cp, "replica-b", clusters)?;
    b.wait_for("warm").await?;
    let killed = now_ms();
    a.child.start_kill()?;
    a.child.wait().await?;
    report("warm standby, after SIGKILL", &mut b, killed, objects).await?;

    let mut c = Process::start(&cp, "replica-c", clusters)?;
    c.wait_for("warm").await?;
    let stopped = now_ms();
    b.signal("-TERM").await?;
    report("warm standby, after SIGTERM", &mut c, stopped, objects).await?;
    let status = b.child.wait().await?;
    if !status.success() {
        return Err(format!("the stopped leader exited with {status}").into());
    }
    c.signal("-TERM").await?;
    c.child.wait().await?;
    Ok(())
}
