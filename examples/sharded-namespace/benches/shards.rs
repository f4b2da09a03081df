//! Sharding benchmark: N namespace-backed clusters on one real control
//! plane shared by replicas of this example, each replica a process of its
//! own, with the coordinator's default timings (Go's: peer Lease 30 s
//! renewed every 10 s, fence Lease 20 s renewed every 10 s, a look every
//! 5 s).
//!
//! Who works where is read from the replicas' own records
//! (`--ownership-ledger`: a line when a replica starts or stops working on
//! a cluster, on the machine's monotonic clock), so every hand-over is
//! timed to the moment and the two numbers that must stay zero are counted
//! over the whole run: clusters worked on by two replicas at once, and
//! clusters worked on by nobody for longer than what holds them lasts plus
//! one look: a renewed fence (20 s) or the peer Lease (30 s: fences held
//! with it, and a replica killed without a word), plus 5 s.
//!
//! 1. **Start**: the replicas start together; time until every cluster is
//!    worked on by its owner (rendezvous hashing over the live replicas).
//! 2. **Idle**: once the replicas' Lease requests have died down (with
//!    fences held with the peer Lease each replica lists every fence once
//!    its share settled, to follow them: how long that took and what it
//!    cost the API server is printed), Lease requests per second and API
//!    server CPU over 30 s, and each replica's CPU and memory.
//! 3. **Churn**, each followed by the time until stable again, the clusters
//!    that changed hands, and the longest time a cluster went unworked: a
//!    replica joins; one leaves (SIGTERM); one is killed (SIGKILL); the
//!    API server is paused for 20 s; two replicas restart at once.
//!
//! Run with `make bench` or `cargo bench -p
//! multicluster-example-sharded-namespace --bench shards`; set
//! `SHARDING_CLUSTERS` to a comma-separated list of sizes (default 1000),
//! `SHARDING_REPLICAS` to the starting number of replicas (default 4) and
//! `SHARDING_FENCE_HOLD` to `renewed`, `with-peer` or both (the default),
//! how the replicas keep their fences, and `SHARDING_CHURN` to some of
//! `join,leave,kill,pause,restart` to run only those events (default all).
//! With `REPLICA_LOG_DIR` set, each replica's log is kept there. An event
//! that leaves clusters unworked beyond its bound prints, to stderr, how
//! long they went unworked and the story of the one that waited longest.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use multicluster_envtest::ControlPlane;
use multicluster_example_testing::replica::{Replica, ShardedArgs};
use multicluster_example_testing::sharding::{
    LedgerFile, Ownership, create_namespaces, now, wait_settled,
};
use multicluster_runtime::testing::{cpu_seconds_of, resident_memory_mib_of};

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-sharded-namespace");
const FILTER: &str = "bench";
const LEASE_NAMESPACE: &str = "kube-system";
/// Longest any phase may take before it is reported as never settling.
const PHASE_LIMIT: Duration = Duration::from_secs(300);

type Outcome = Result<(), Box<dyn std::error::Error>>;

/// How long a cluster may go unworked in the churn table: until what
/// holds it lapses, plus one look. A renewed fence holds 20 s; a fence
/// held with the peer Lease, and the clusters of a replica killed without
/// a word (whose fences the others take only once its peer Lease lapses),
/// wait for the peer Lease: 30 s.
const FENCE_AND_LOOK: Duration = Duration::from_secs(20 + 5);
const PEER_AND_LOOK: Duration = Duration::from_secs(30 + 5);

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
    for size in sizes {
        for hold in holds.split(',').map(str::trim) {
            run(size, replicas, hold).await?;
        }
    }
    Ok(())
}

/// What the churn table does to the fleet, in order.
#[derive(Clone, Copy)]
enum Churn {
    Join,
    Leave,
    Kill,
    PauseApiServer,
    TwoRestart,
}

impl Churn {
    const ALL: [Churn; 5] = [
        Churn::Join,
        Churn::Leave,
        Churn::Kill,
        Churn::PauseApiServer,
        Churn::TwoRestart,
    ];

    /// The name `SHARDING_CHURN` knows it by.
    fn key(self) -> &'static str {
        match self {
            Churn::Join => "join",
            Churn::Leave => "leave",
            Churn::Kill => "kill",
            Churn::PauseApiServer => "pause",
            Churn::TwoRestart => "restart",
        }
    }

    /// The events `SHARDING_CHURN` asks for, in the table's order.
    fn chosen() -> Result<Vec<Churn>, String> {
        let Ok(asked) = std::env::var("SHARDING_CHURN") else {
            return Ok(Churn::ALL.to_vec());
        };
        let asked: Vec<&str> = asked.split(',').map(str::trim).collect();
        if let Some(unknown) = asked
            .iter()
            .find(|key| !Churn::ALL.iter().any(|event| event.key() == **key))
        {
            return Err(format!(
                "SHARDING_CHURN: no event {unknown:?} (join, leave, kill, pause, restart)"
            ));
        }
        Ok(Churn::ALL
            .into_iter()
            .filter(|event| asked.contains(&event.key()))
            .collect())
    }

    fn label(self) -> &'static str {
        match self {
            Churn::Join => "a replica joins",
            Churn::Leave => "one leaves (SIGTERM)",
            Churn::Kill => "one is killed (SIGKILL)",
            Churn::PauseApiServer => "API server paused 20 s",
            Churn::TwoRestart => "two restart at once",
        }
    }
}

/// The replicas of one run, each process with a ledger of its own.
struct Replicas<'a> {
    cp: &'a ControlPlane,
    dir: tempfile::TempDir,
    hold: String,
    running: Vec<Replica>,
    ledgers: Vec<LedgerFile>,
    started: usize,
}

impl<'a> Replicas<'a> {
    fn start(&mut self, id: &str) {
        self.started += 1;
        let path = self
            .dir
            .path()
            .join(format!("{id}.{}.ledger", self.started));
        self.running.push(start(self.cp, id, &self.hold, &path));
        self.ledgers.push(LedgerFile {
            replica: id.to_string(),
            path,
            ended_at: None,
        });
    }

    /// Ends the processes of `ids` together: SIGKILL with `kill`, else
    /// SIGTERM to each and a wait for all to hand their clusters back and
    /// exit.
    async fn end(&mut self, ids: &[String], kill: bool) -> Outcome {
        let mut ending = Vec::new();
        for id in ids {
            let at = self
                .running
                .iter()
                .position(|r| &r.id == id)
                .ok_or("no such replica")?;
            ending.push(self.running.remove(at));
        }
        let stops = ending.iter_mut().map(|replica| async move {
            if kill {
                replica.process.kill().await.map_err(|err| err.to_string())
            } else {
                multicluster_example_testing::terminate(
                    &mut replica.process,
                    Duration::from_secs(120),
                )
                .await;
                Ok(())
            }
        });
        for stopped in futures::future::join_all(stops).await {
            stopped?;
        }
        let ended = now();
        for ledger in self
            .ledgers
            .iter_mut()
            .filter(|ledger| ids.contains(&ledger.replica) && ledger.ended_at.is_none())
        {
            ledger.ended_at = Some(ended);
        }
        Ok(())
    }

    fn live(&self) -> Vec<String> {
        self.running.iter().map(|r| r.id.clone()).collect()
    }

    /// Waits until stable; who works on each cluster then.
    async fn settled(&self, names: &[String]) -> Result<BTreeMap<String, Vec<String>>, String> {
        let live = self.live();
        let live: Vec<&str> = live.iter().map(String::as_str).collect();
        Ok(wait_settled(names, &live, &self.ledgers, PHASE_LIMIT)
            .await?
            .current())
    }
}

async fn run(clusters: usize, replicas: usize, hold: &str) -> Outcome {
    let cp = ControlPlane::start().await?;
    let admin = cp.client().await?;
    let names: Vec<String> = (0..clusters).map(|i| format!("shard-{i}")).collect();
    let created = Instant::now();
    create_namespaces(&admin, &names, FILTER).await?;
    eprintln!(
        "{clusters} namespaces created in {:.0} s",
        created.elapsed().as_secs_f64()
    );
    let mut fleet = Replicas {
        cp: &cp,
        dir: tempfile::tempdir()?,
        hold: hold.to_string(),
        running: Vec::new(),
        ledgers: Vec::new(),
        started: 0,
    };
    let started = Instant::now();
    for i in 0..replicas {
        fleet.start(&format!("replica-{i}"));
    }
    let mut owners = fleet.settled(&names).await?;
    let start_time = started.elapsed();

    let (quiet_after, quiet_cpu) = leases_quiet(&admin).await;
    eprintln!(
        "Lease requests died down {:.1} s after the start settled; the API server spent {quiet_cpu:.1} CPU-seconds meanwhile",
        quiet_after.as_secs_f64()
    );
    let before = api_server_counters(&admin).await;
    let cpu_before: Vec<f64> = fleet.running.iter().map(cpu_seconds).collect();
    let idle = Duration::from_secs(30);
    tokio::time::sleep(idle).await;
    let after = api_server_counters(&admin).await;
    let lease_rate = (after.0 - before.0) / idle.as_secs_f64();
    let api_cpu = (after.1 - before.1) * 60.0 / idle.as_secs_f64();
    let cpu_per_minute = fleet
        .running
        .iter()
        .zip(&cpu_before)
        .map(|(replica, before)| (cpu_seconds(replica) - before) * 60.0 / idle.as_secs_f64())
        .sum::<f64>()
        / fleet.running.len() as f64;
    let rss = fleet.running.iter().map(resident_mib).sum::<f64>() / fleet.running.len() as f64;
    println!(
        "| fences | clusters | replicas | all worked on after start | Lease requests/s idle | API server CPU idle | CPU per replica idle | RSS per replica |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {hold} | {clusters} | {replicas} | {:.1} s | {lease_rate:.0} | {api_cpu:.2} s/min | {cpu_per_minute:.2} s/min | {rss:.0} MiB |",
        start_time.as_secs_f64()
    );

    println!();
    println!(
        "| {hold}, {clusters} clusters: event | clusters moved | stable after | longest unworked | bound | over the bound | worked on twice |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let joiner = format!("replica-{replicas}");
    let held = if hold == "with-peer" {
        PEER_AND_LOOK
    } else {
        FENCE_AND_LOOK
    };
    for event in Churn::chosen()? {
        let bound = match event {
            // The others take a killed replica's clusters once its peer
            // Lease lapses, however its fences are held.
            Churn::Kill => PEER_AND_LOOK,
            _ => held,
        };
        let from = now();
        let began = Instant::now();
        match event {
            Churn::Join => fleet.start(&joiner),
            Churn::Leave => fleet.end(&["replica-0".to_string()], false).await?,
            Churn::Kill => fleet.end(&["replica-1".to_string()], true).await?,
            Churn::PauseApiServer => {
                cp.pause_api_server()?;
                tokio::time::sleep(Duration::from_secs(20)).await;
                cp.resume_api_server()?;
            }
            Churn::TwoRestart => {
                let restarting: Vec<String> = fleet.live().into_iter().take(2).collect();
                fleet.end(&restarting, false).await?;
                for id in &restarting {
                    fleet.start(id);
                }
            }
        }
        let settled = fleet.settled(&names).await;
        let to = now();
        let stable_after = began.elapsed();
        let ownership = Ownership::read(&fleet.ledgers)?;
        let unowned = ownership.longest_unowned(&names, from, to);
        let longest = unowned.values().max().copied().unwrap_or_default();
        let over = unowned.values().filter(|gap| **gap > bound).count();
        let twice = ownership.worked_on_twice().len();
        if over > 0 {
            tell_the_wait(&ownership, &unowned, from, event.label());
        }
        match settled {
            Ok(now_owners) => {
                let moved = names
                    .iter()
                    .filter(|name| owners.get(*name) != now_owners.get(*name))
                    .count();
                println!(
                    "| {} | {moved} | {:.1} s | {:.1} s | {} s | {over} | {twice} |",
                    event.label(),
                    stable_after.as_secs_f64(),
                    longest.as_secs_f64(),
                    bound.as_secs()
                );
                owners = now_owners;
            }
            Err(err) => {
                println!(
                    "| {} | — | not stable ({err}) | {:.1} s | {} s | {over} | {twice} |",
                    event.label(),
                    longest.as_secs_f64(),
                    bound.as_secs()
                );
                break;
            }
        }
    }
    let whole = Ownership::read(&fleet.ledgers)?;
    println!(
        "\nWhole run: {} clusters worked on by two replicas at once.",
        whole.worked_on_twice().len()
    );
    drop(fleet);
    cp.stop();
    Ok(())
}

/// A replica with the coordinator's default timings, keeping its fences
/// as `fence_hold` says.
/// To stderr: how many clusters went unworked how long after `event`
/// (from `from`), by 5 s, and who worked on the one that waited longest.
fn tell_the_wait(
    ownership: &Ownership,
    unowned: &BTreeMap<String, Duration>,
    from: u128,
    event: &str,
) {
    let mut by_five: BTreeMap<u64, usize> = BTreeMap::new();
    for gap in unowned.values() {
        *by_five.entry(gap.as_secs() / 5 * 5).or_default() += 1;
    }
    eprintln!("{event}: clusters by longest unworked time (s, from): {by_five:?}");
    let Some((worst, gap)) = unowned.iter().max_by_key(|(_, gap)| **gap) else {
        return;
    };
    let at = |t: u128| (t as f64 - from as f64) / 1e9;
    eprintln!(
        "{event}: {worst} went unworked {:.1} s; its spells (s after the event):",
        gap.as_secs_f64()
    );
    for spell in ownership.spells(worst) {
        eprintln!(
            "  {} from {:.1} to {}",
            spell.replica,
            at(spell.start),
            spell
                .end
                .map_or("now".to_string(), |end| format!("{:.1}", at(end)))
        );
    }
}

fn start(cp: &ControlPlane, id: &str, fence_hold: &str, ledger: &std::path::Path) -> Replica {
    ShardedArgs::new(id, FILTER, fence_hold)
        .set("--lease-namespace", LEASE_NAMESPACE)
        .ledger(ledger)
        .start(BINARY, cp)
}

/// Requests for Leases the API server has answered so far, and its CPU
/// seconds (`process_cpu_seconds_total`), from its `/metrics`.
async fn api_server_counters(admin: &kube::Client) -> (f64, f64) {
    let metrics = api_server_metrics(admin).await;
    let leases = sum_of(&metrics, |l| {
        l.starts_with("apiserver_request_total{") && l.contains("resource=\"leases\"")
    });
    let cpu = sum_of(&metrics, |l| l.starts_with("process_cpu_seconds_total "));
    (leases, cpu)
}

/// Waits until the lists of Leases die down (under 3 a second over 5 s:
/// the peer reads are one a second for ten replicas; at most two
/// minutes): how long that took, and the API server's CPU seconds
/// meanwhile.
async fn leases_quiet(admin: &kube::Client) -> (Duration, f64) {
    let began = Instant::now();
    let cpu_before = api_server_counters(admin).await.1;
    let mut lists = lease_lists(admin).await;
    let window = Duration::from_secs(5);
    while began.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(window).await;
        let now = lease_lists(admin).await;
        let rate = (now - lists) / window.as_secs_f64();
        lists = now;
        if rate < 3.0 {
            break;
        }
    }
    (
        began.elapsed(),
        api_server_counters(admin).await.1 - cpu_before,
    )
}

/// Lists of Leases the API server has answered so far.
async fn lease_lists(admin: &kube::Client) -> f64 {
    let metrics = api_server_metrics(admin).await;
    sum_of(&metrics, |l| {
        l.starts_with("apiserver_request_total{")
            && l.contains("resource=\"leases\"")
            && l.contains("verb=\"LIST\"")
    })
}

/// The API server's metrics, empty if they could not be read.
async fn api_server_metrics(admin: &kube::Client) -> String {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    admin.request_text(request).await.unwrap_or_default()
}

/// The sum of the metric lines `line` picks.
fn sum_of(metrics: &str, line: impl Fn(&str) -> bool) -> f64 {
    metrics
        .lines()
        .filter(|l| line(l))
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
