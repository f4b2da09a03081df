//! An example binary running as one of several replicas, each its own
//! process, as a Deployment would run them.

use std::collections::BTreeMap;
use std::process::Stdio;

use multicluster_envtest::ControlPlane;
use multicluster_runtime::testing::http_get;
use tokio::process::{Child, Command};

/// One replica process serving its endpoints on a free local port; killed
/// when dropped.
pub struct Replica {
    /// The replica's ID (what it calls itself in Leases).
    pub id: String,
    /// Where it serves `/metrics`, `/clusters` and the probes.
    pub port: u16,
    /// The process.
    pub process: Child,
}

impl Replica {
    /// Starts `binary` with `args` against `cp` (as its `$KUBECONFIG`).
    pub fn start(binary: &str, cp: &ControlPlane, id: &str, args: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        // With REPLICA_LOG_DIR set, each replica logs to <dir>/<id>.log,
        // for looking into a test or benchmark that misbehaves
        // (REPLICA_RUST_LOG sets what it logs).
        let log = || match std::env::var_os("REPLICA_LOG_DIR") {
            Some(dir) => {
                // Appended to: a replica restarted keeps its first run's log.
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(std::path::Path::new(&dir).join(format!("{id}.log")))
                    .map_or_else(|_| Stdio::null(), Stdio::from)
            }
            None => Stdio::null(),
        };
        let process = Command::new(binary)
            .args(args)
            .args(["--health-address", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", cp.kubeconfig_path())
            // REPLICA_RUST_LOG: another log filter, to look closer.
            .env(
                "RUST_LOG",
                std::env::var("REPLICA_RUST_LOG")
                    .unwrap_or_else(|_| multicluster_runtime::LOG_FILTER.to_string()),
            )
            .stdout(Stdio::null())
            .stderr(log())
            .kill_on_drop(true)
            .spawn()
            .expect("replica");
        Self {
            id: id.to_string(),
            port,
            process,
        }
    }

    /// The body of `path` on the replica's endpoint, if it answers.
    pub async fn get(&self, path: &str) -> Option<String> {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let (_, body) = http_get(address, path).await.ok()?;
        Some(body)
    }

    /// Reconciles this replica has run, per cluster (with per-cluster
    /// metric labels).
    pub async fn reconciles_by_cluster(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for (line, count) in self.reconcile_lines().await {
            if let Some(cluster) = line
                .split("cluster=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
            {
                *counts.entry(cluster.to_string()).or_default() += count;
            }
        }
        counts
    }

    /// Reconciles this replica has run, in all.
    pub async fn reconciles(&self) -> u64 {
        self.reconcile_lines()
            .await
            .into_iter()
            .map(|(_, count)| count)
            .sum()
    }

    async fn reconcile_lines(&self) -> Vec<(String, u64)> {
        let metrics = self.get("/metrics").await.expect("metrics");
        metrics
            .lines()
            .filter(|l| l.starts_with("controller_runtime_reconcile_total{"))
            .filter_map(|l| {
                let count = l.rsplit(' ').next()?.parse::<f64>().ok()?;
                Some((l.to_string(), count as u64))
            })
            .collect()
    }

    /// The fleet's clusters this replica reports, name → state, from
    /// `/clusters` (the local cluster left out).
    pub async fn clusters(&self) -> BTreeMap<String, String> {
        let report = self.get("/clusters").await.unwrap_or_default();
        report
            .lines()
            .filter_map(|line| {
                let mut columns = line.split('\t');
                Some((columns.next()?, columns.next()?))
            })
            .filter(|(name, _)| *name != "<local>")
            .map(|(name, state)| (name.to_string(), state.to_string()))
            .collect()
    }
}

/// The command line of a replica of the sharded example
/// (`examples/sharded-namespace`): set flag by flag, a flag set twice
/// keeps its last value.
#[derive(Clone, Debug)]
pub struct ShardedArgs {
    id: String,
    flags: BTreeMap<&'static str, String>,
}

impl ShardedArgs {
    /// Replica `id` over the namespaces labelled with the watch filter
    /// `filter`, keeping its fences as `hold` says (`renewed`,
    /// `with-peer`), with the coordinator's default timings (Go's).
    pub fn new(id: &str, filter: &str, hold: &str) -> Self {
        Self {
            id: id.to_string(),
            flags: BTreeMap::from([
                ("--peer-id", id.to_string()),
                ("--watch-filter", filter.to_string()),
                ("--fence-hold", hold.to_string()),
            ]),
        }
    }

    /// Go's default timings divided by five, so that hand-overs take
    /// seconds: a look every second, the peer Lease lasting 6 s and each
    /// fence 4 s, both renewed every second.
    pub fn quick(self) -> Self {
        self.set("--probe-interval", "1s")
            .set("--peer-lease-duration", "6s")
            .set("--peer-renew-interval", "1s")
            .set("--fence-lease-duration", "4s")
            .set("--fence-renew-interval", "1s")
    }

    /// Sets `flag` to `value`.
    pub fn set(mut self, flag: &'static str, value: impl Into<String>) -> Self {
        self.flags.insert(flag, value.into());
        self
    }

    /// Keeps an ownership ledger at `path` (`--ownership-ledger`).
    pub fn ledger(self, path: &std::path::Path) -> Self {
        let path = path.to_str().expect("a UTF-8 path").to_string();
        self.set("--ownership-ledger", path)
    }

    /// Starts `binary` (the sharded example) with these flags against `cp`.
    pub fn start(&self, binary: &str, cp: &ControlPlane) -> Replica {
        let args: Vec<&str> = self
            .flags
            .iter()
            .flat_map(|(flag, value)| [*flag, value.as_str()])
            .collect();
        Replica::start(binary, cp, &self.id, &args)
    }
}
