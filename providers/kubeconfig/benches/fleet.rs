//! Fleet benchmark for kubeconfig Secrets: N Secrets in one namespace of a
//! real control plane, each a kubeconfig for that same API server, so N
//! clusters with their own clients, connections and caches; one controller
//! over the fleet's ConfigMaps (20 small ones, plus the one patched for the
//! fan-out), trivial reconciler, 8 slots. Release build.
//!
//! Reports, per N: time from `Manager::run` to the first and to every
//! cluster's first reconcile; RSS and RSS per cluster; CPU seconds to
//! engage and per idle 30 s, this process's and the API server's; the
//! requests the API server answered while engaging, by verb; 429 answers from the API server and clusters
//! found unreachable while engaging; file descriptors, sockets and connections to
//! the API server; watches the API server counts; and change → reconcile
//! latency (p50, p99, max over the clusters) when one patched ConfigMap
//! reaches every cluster; then RSS again once every cluster's client has
//! sent 100 requests (`/version`), what a cluster costs a controller at
//! work: channels and header tables grow with use, and keep what they grew.
//!
//! Run with `make bench` or `cargo bench -p multicluster-provider-kubeconfig
//! --bench fleet`; `KUBECONFIG_FLEET_SIZES=1000,10000` chooses N (default
//! 1000), `KUBECONFIG_FLEET_HTTP1=1` reaches the members over HTTP/1.1,
//! `KUBECONFIG_FLEET_LIST=1` fills their caches from a LIST and a watch
//! instead of a streaming list, `KUBECONFIG_FLEET_IDLE_SECS` sets the idle
//! window (default 30; 330 holds every watch's renewal) and
//! `KUBECONFIG_FLEET_REQUESTS` the requests per cluster before the last
//! reading of memory (default 100, 0 for none). The request round's CPU
//! is printed too, and with `KUBECONFIG_FLEET_CLIENT_GO` naming the binary
//! of `hack/client-go-requests` (`make bench` builds it) the same round
//! runs through client-go afterwards, for the cost per request of each.
//! `KUBECONFIG_FLEET_IDENTITIES=1` gives every cluster a client
//! certificate of its own, so that clusters share no connection (here or
//! in client-go), as members on servers of their own do.
//!
//! `KUBECONFIG_FLEET_OWNED=none` measures instead what a sharded replica
//! pays for the clusters other replicas own: every replica runs the
//! provider over the whole fleet and checks each cluster before its
//! coordinator decides, so it holds a client for each. The manager here
//! has a coordinator that owns nothing; RSS and connections are read once
//! every cluster is ready, and again two minutes later, once idle
//! connections could have been let go.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_provider_kubeconfig::{
    DEFAULT_DATA_KEY, DEFAULT_LABEL, KubeconfigOptions, KubeconfigProvider,
};
use multicluster_runtime::cache::CacheOptions;
use multicluster_runtime::client::ClientOptions;
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::coordinator::Coordinator;
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::{connections_to, resident_memory_mib};
use multicluster_runtime::{Aware, Cluster, ClusterName, Manager};
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "fleet";
const OBJECTS: usize = 20;

type Outcome = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// When each cluster first reconciled, and when it reconciled the target
/// after the patch.
#[derive(Default)]
struct Seen {
    first: HashMap<ClusterName, Instant>,
    target_since: Option<Instant>,
    target: HashMap<ClusterName, Instant>,
}

/// Whether members are reached over HTTP/2 (the default) or, with
/// `KUBECONFIG_FLEET_HTTP1=1`, over HTTP/1.1.
fn http2() -> bool {
    std::env::var("KUBECONFIG_FLEET_HTTP1").map_or(true, |value| value != "1")
}

/// Where each cluster's own kubeconfig is written (in the control plane's
/// directory, removed with it) when every cluster has
/// an identity of its own (`KUBECONFIG_FLEET_IDENTITIES=1`): a client
/// certificate each, so that no two clusters share a connection, here or
/// in client-go, as clusters on servers of their own do. `None` (the
/// default): every cluster uses the admin's kubeconfig, and clusters share
/// connections as clients that connect alike do.
fn identities_dir(cp: &ControlPlane) -> Option<std::path::PathBuf> {
    std::env::var("KUBECONFIG_FLEET_IDENTITIES")
        .is_ok_and(|value| value == "1")
        .then(|| cp.data_dir().join("fleet-identities"))
}

/// Whether caches fill from streaming lists (the default) or, with
/// `KUBECONFIG_FLEET_LIST=1`, from a LIST and a watch.
fn streaming_lists() -> bool {
    std::env::var("KUBECONFIG_FLEET_LIST").map_or(true, |value| value != "1")
}

/// CPU time of this process (all threads), to the nanosecond.
fn cpu_seconds() -> f64 {
    multicluster_runtime::testing::process_cpu_seconds()
}

/// Open file descriptors, and how many of them are sockets.
fn descriptors() -> (usize, usize) {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return (0, 0);
    };
    let targets: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .collect();
    let sockets = targets.iter().filter(|t| t.starts_with("socket:")).count();
    (targets.len(), sockets)
}

/// The sum of the samples in Prometheus text `metrics` whose line starts
/// with `prefix` and contains `with`.
fn metric_sum(metrics: &str, prefix: &str, with: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The API server's own metrics.
async fn server_metrics(admin: &kube::Client) -> String {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    admin.request_text(request).await.unwrap_or_default()
}

/// Watches open on the API server, from its metrics.
async fn server_watches(admin: &kube::Client) -> u64 {
    let metrics = server_metrics(admin).await;
    metric_sum(
        &metrics,
        "apiserver_longrunning_requests{",
        "verb=\"WATCH\"",
    )
}

/// CPU seconds the API server has used so far, from its metrics.
async fn server_cpu_seconds(admin: &kube::Client) -> f64 {
    let metrics = server_metrics(admin).await;
    metrics
        .lines()
        .find(|l| l.starts_with("process_cpu_seconds_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Requests the API server has answered so far, by verb.
async fn server_requests(admin: &kube::Client) -> BTreeMap<String, u64> {
    let metrics = server_metrics(admin).await;
    let mut by_verb = BTreeMap::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let verb = line
            .split("verb=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("?");
        let count = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0);
        *by_verb.entry(verb.to_string()).or_insert(0) += count as u64;
    }
    by_verb
}

/// The requests the API server has answered since it answered `before`,
/// by verb (`GET:2,WATCH:1000`); a watch is counted when it ends.
async fn requests_since(admin: &kube::Client, before: &BTreeMap<String, u64>) -> String {
    server_requests(admin)
        .await
        .into_iter()
        .map(|(verb, count)| (count - before.get(&verb).copied().unwrap_or(0), verb))
        .filter(|(count, _)| *count > 0)
        .map(|(count, verb)| format!("{verb}:{count}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// How long idle CPU is measured (`KUBECONFIG_FLEET_IDLE_SECS`, default
/// 30); it is reported per 30 s whatever the window.
fn idle_window() -> Duration {
    Duration::from_secs(
        std::env::var("KUBECONFIG_FLEET_IDLE_SECS")
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(30),
    )
}

/// Requests the API server has answered with 429 (Too Many Requests) so far.
async fn server_throttled(admin: &kube::Client) -> u64 {
    let metrics = server_metrics(admin).await;
    metric_sum(&metrics, "apiserver_request_total{", "code=\"429\"")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn poll(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Outcome {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn create_secrets(
    cp: &ControlPlane,
    admin: &kube::Client,
    from: usize,
    to: usize,
) -> Outcome {
    let shared = multicluster_envtest::to_yaml(cp.kubeconfig())?;
    let identities = identities_dir(cp);
    if let Some(dir) = &identities {
        std::fs::create_dir_all(dir)?;
    }
    let mut texts = Vec::with_capacity(to - from);
    for i in from..to {
        let Some(dir) = &identities else {
            texts.push(shared.clone());
            continue;
        };
        let own = cp.user_kubeconfig(&format!("member-{i:05}"), Some("system:masters"))?;
        let text = multicluster_envtest::to_yaml(&own)?;
        std::fs::write(dir.join(format!("member-{i:05}.yaml")), &text)?;
        texts.push(text);
    }
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    let results: Vec<Result<Secret, kube::Error>> = futures::stream::iter(from..to)
        .zip(futures::stream::iter(texts))
        .map(|(i, text)| {
            let secrets = secrets.clone();
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(format!("member-{i:05}")),
                    labels: Some([(DEFAULT_LABEL.to_string(), "true".to_string())].into()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([(
                    DEFAULT_DATA_KEY.to_string(),
                    ByteString(text.into_bytes()),
                )])),
                ..Secret::default()
            };
            async move { secrets.create(&PostParams::default(), &secret).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    for result in results {
        result?;
    }
    Ok(())
}

async fn run(
    cp: &ControlPlane,
    admin: &kube::Client,
    port: u16,
    clusters: usize,
    created: &mut usize,
) -> Outcome {
    create_secrets(cp, admin, *created, clusters).await?;
    *created = clusters;

    let rss_before = resident_memory_mib();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let controller = {
        let seen = seen.clone();
        Controller::builder("bench")
            .for_resource(Watch::<ConfigMap>::new())
            .max_concurrent_reconciles(8)
            .build(move |request: Request, _cluster| {
                let seen = seen.clone();
                async move {
                    let now = Instant::now();
                    let mut seen = seen
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    seen.first.entry(request.cluster.clone()).or_insert(now);
                    if request.name == "target" && seen.target_since.is_some() {
                        seen.target.entry(request.cluster.clone()).or_insert(now);
                    }
                    Ok::<_, Never>(Action::await_change())
                }
            })?
    };
    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        KubeconfigOptions::default()
            .namespace(NAMESPACE.to_string())
            .members(
                MemberOptions::default()
                    .client(ClientOptions::default().http2(http2()))
                    .cache(CacheOptions::default().streaming_lists(streaming_lists())),
            ),
    ));
    let metrics = Metrics::default();
    let manager = Manager::builder(Cluster::new("local", admin.clone()))
        .provider(provider)
        .metrics(metrics.clone())
        .build();
    manager.add_controller(controller)?;
    let throttled_before = server_throttled(admin).await;
    let server_cpu_before = server_cpu_seconds(admin).await;
    let requests_before = server_requests(admin).await;
    let shutdown = CancellationToken::new();
    eprintln!("engaging {clusters} clusters from now");
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let task = {
        let (manager, shutdown) = (manager.clone(), shutdown.clone());
        tokio::spawn(async move { manager.run(shutdown).await })
    };
    // Why clusters were found unreachable while engaging, if any were:
    // sampled, for the record on stderr.
    let reasons = Arc::new(Mutex::new(BTreeMap::<String, String>::new()));
    let sampler = {
        let (manager, reasons, stop) = (manager.clone(), reasons.clone(), shutdown.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                for (name, status) in manager.cluster_states() {
                    if let ClusterState::Unreachable(reason) = status.state {
                        reasons
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(name.to_string(), reason.to_string());
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let lock = || {
        seen.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    poll(
        "every cluster's first reconcile",
        Duration::from_secs(900),
        || lock().first.len() >= clusters,
    )
    .await?;
    let all = started.elapsed();
    let first = lock()
        .first
        .values()
        .min()
        .map_or(Duration::ZERO, |at| *at - started);
    let cpu_engage = cpu_seconds() - cpu_before;
    sampler.abort();
    for (cluster, reason) in reasons
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .take(5)
    {
        eprintln!("found unreachable while engaging: {cluster}: {reason}");
    }
    let rss = resident_memory_mib();
    let throttled = server_throttled(admin).await - throttled_before;
    let server_cpu_engage = server_cpu_seconds(admin).await - server_cpu_before;
    let requests = requests_since(admin, &requests_before).await;
    let unreachable = metric_sum(
        &metrics.encode(),
        "mcr_cluster_state_changes_total{",
        "state=\"unreachable\"",
    );

    // Idle: nothing changes. The first 10 s after the last cluster was
    // engaged still carry its wake (connections settling), so idle CPU is
    // measured from then (said on stderr, for a profiler to attach: `perf
    // record -p`), over 30 s by default: each connection's first
    // keep-alive ping. A window of five minutes or more also holds the
    // watches' bookmarks (one a minute each) and their renewal (every
    // 290 s), what a quiet fleet does for good.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = idle_window();
    eprintln!(
        "{clusters} clusters engaged; idle for {} s from now",
        idle.as_secs()
    );
    let idle_cpu_before = cpu_seconds();
    let server_idle_before = server_cpu_seconds(admin).await;
    let idle_requests_before = server_requests(admin).await;
    tokio::time::sleep(idle).await;
    let per_30s = 30.0 / idle.as_secs_f64();
    let idle_per_30s = (cpu_seconds() - idle_cpu_before) * per_30s;
    let server_idle = (server_cpu_seconds(admin).await - server_idle_before) * per_30s;
    let idle_requests = requests_since(admin, &idle_requests_before).await;
    let (fds, sockets) = descriptors();
    let connections = connections_to(port);
    let watches = server_watches(admin).await;

    // One patch, seen by every cluster.
    let sent = Instant::now();
    lock().target_since = Some(sent);
    Api::<ConfigMap>::namespaced(admin.clone(), "default")
        .patch(
            "target",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"sent": format!("{:?}", sent)}})),
        )
        .await?;
    poll(
        "the patch to reach every cluster",
        Duration::from_secs(300),
        || lock().target.len() >= clusters,
    )
    .await?;
    let mut latencies: Vec<Duration> = lock().target.values().map(|at| *at - sent).collect();
    latencies.sort();

    println!(
        "clusters={clusters:>5} first={:>6.2}s all={:>6.2}s rss={:>7.1}MiB (+{:.1}MiB, {:.0}KiB/cluster) \
         cpu-engage={:>6.1}s apiserver-cpu-engage={server_cpu_engage:.1}s requests-while-engaging={requests} 429s={throttled} found-unreachable={unreachable} cpu-idle={:>6.3}s/30s apiserver-cpu-idle={server_idle:.2}s/30s requests-while-idle={idle_requests} fds={fds} sockets={sockets} connections-to-apiserver={connections} \
         apiserver-watches={watches} fan-out p50={:>7.1}ms p99={:>7.1}ms max={:>7.1}ms",
        first.as_secs_f64(),
        all.as_secs_f64(),
        rss,
        rss - rss_before,
        (rss - rss_before) * 1024.0 / clusters as f64,
        cpu_engage,
        idle_per_30s,
        percentile(&latencies, 0.50).as_secs_f64() * 1000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
    );
    let uses = requests_per_cluster();
    if uses > 0 {
        let (sent, cpu_before) = (Instant::now(), cpu_seconds());
        let failures = use_every_client(&manager, uses).await;
        let (wall, cpu) = (sent.elapsed().as_secs_f64(), cpu_seconds() - cpu_before);
        let rss_used = resident_memory_mib();
        println!(
            "clusters={clusters:>5} after {uses} requests each ({wall:.2}s, {failures} failed, cpu={cpu:.2}s, {:.1}us/request): rss={rss_used:>7.1}MiB (+{:.1}MiB, {:.0}KiB/cluster)",
            cpu * 1e6 / (clusters * uses) as f64,
            rss_used - rss_before,
            (rss_used - rss_before) * 1024.0 / clusters as f64,
        );
    }
    shutdown.cancel();
    task.await??;
    if uses > 0 {
        same_round_through_client_go(cp, clusters, uses).await?;
    }
    Ok(())
}

/// The request round again, through client-go
/// (`hack/client-go-requests`), once this process's fleet has stopped:
/// the binary `KUBECONFIG_FLEET_CLIENT_GO` names (`make bench` builds it),
/// against the same API server with the same kubeconfigs. Skipped when
/// the variable is unset or empty.
async fn same_round_through_client_go(cp: &ControlPlane, clusters: usize, uses: usize) -> Outcome {
    let Some(binary) =
        std::env::var_os("KUBECONFIG_FLEET_CLIENT_GO").filter(|binary| !binary.is_empty())
    else {
        return Ok(());
    };
    let mut command = tokio::process::Command::new(&binary);
    match identities_dir(cp) {
        Some(dir) => command.arg("-kubeconfigs").arg(dir),
        None => command.arg("-kubeconfig").arg(cp.kubeconfig_path()),
    };
    command
        .arg(format!("-clusters={clusters}"))
        .arg(format!("-requests={uses}"))
        .arg("-parallel=64")
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(600), command.output())
        .await
        .map_err(|_| format!("{} took more than 10 minutes", binary.to_string_lossy()))??;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            binary.to_string_lossy(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    print!("{}", String::from_utf8_lossy(&output.stdout));
    Ok(())
}

/// Sends `uses` requests (`/version`) through every engaged cluster's
/// client, one after another per cluster, 64 clusters at once, each
/// cluster's in a task of its own; returns how
/// many failed. A controller at work sends its clusters requests all the
/// time, and what a cluster costs once its client has carried some is what
/// a long run holds (channels keep the blocks they grew into, for one).
async fn use_every_client(manager: &Manager, uses: usize) -> usize {
    let names: Vec<ClusterName> = manager
        .cluster_states()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    futures::stream::iter(names)
        .map(|name| async move {
            let Ok(cluster) = manager.get_cluster(&name).await else {
                return uses;
            };
            // On the runtime's workers, as a controller's reconciles run:
            // polled by `main`'s `block_on` instead, every answer would wake
            // a thread outside the runtime.
            let client = cluster.client();
            tokio::spawn(async move {
                let mut failed = 0;
                for _ in 0..uses {
                    let request = http::Request::get("/version")
                        .body(Vec::new())
                        .expect("request");
                    if client.request_text(request).await.is_err() {
                        failed += 1;
                    }
                }
                failed
            })
            .await
            .unwrap_or(uses)
        })
        .buffer_unordered(64)
        .fold(0, |total, failed| async move { total + failed })
        .await
}

/// How many requests each cluster's client sends after the fan-out before
/// memory is read again (`KUBECONFIG_FLEET_REQUESTS`, default 100; 0 skips
/// it).
fn requests_per_cluster() -> usize {
    std::env::var("KUBECONFIG_FLEET_REQUESTS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(100)
}

#[tokio::main]
async fn main() -> Outcome {
    let sizes: Vec<usize> = std::env::var("KUBECONFIG_FLEET_SIZES")
        .unwrap_or_else(|_| "1000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    // The manager raises the soft limit too; the control plane's clients
    // in this process need it before.
    multicluster_runtime::testing::raise_open_files_limit()?;
    let cp = ControlPlane::start().await?;
    let admin = cp.client().await?;
    let port: u16 = cp
        .server()
        .rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .ok_or("no port in the server URL")?;
    cp.create_namespace(NAMESPACE).await?;
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), "default");
    for i in 0..OBJECTS {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("cm-{i}"));
        cm.data = Some([("value".to_string(), i.to_string())].into());
        configmaps.create(&PostParams::default(), &cm).await?;
    }
    let mut target = ConfigMap::default();
    target.metadata.name = Some("target".into());
    configmaps.create(&PostParams::default(), &target).await?;
    println!(
        "machine: {} cores; {} ConfigMaps per cluster; {} to the API server; caches filled from {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        OBJECTS + 1,
        if http2() { "HTTP/2" } else { "HTTP/1.1" },
        if streaming_lists() {
            "streaming lists"
        } else {
            "a LIST and a watch"
        }
    );
    let mut created = 0;
    let owned_none = std::env::var("KUBECONFIG_FLEET_OWNED").is_ok_and(|value| value == "none");
    for clusters in sizes {
        if owned_none {
            run_owning_nothing(&cp, &admin, port, clusters, &mut created).await?;
        } else {
            run(&cp, &admin, port, clusters, &mut created).await?;
        }
    }
    Ok(())
}

/// A replica that owns no cluster of the fleet (`KUBECONFIG_FLEET_OWNED=none`).
struct OwnsNothing;

#[async_trait::async_trait]
impl Coordinator for OwnsNothing {
    fn engage(
        &self,
        _lifetime: CancellationToken,
        _name: ClusterName,
        _cluster: Cluster,
        _components: &[Arc<dyn Aware>],
    ) -> Result<(), multicluster_runtime::Error> {
        Ok(())
    }

    fn working_on(&self) -> Option<Vec<ClusterName>> {
        Some(Vec::new())
    }
}

/// What the clusters of a fleet cost a replica that works on none of them.
async fn run_owning_nothing(
    cp: &ControlPlane,
    admin: &kube::Client,
    port: u16,
    clusters: usize,
    created: &mut usize,
) -> Outcome {
    create_secrets(cp, admin, *created, clusters).await?;
    *created = clusters;
    let rss_before = resident_memory_mib();
    let controller = Controller::builder("bench")
        .for_resource(Watch::<ConfigMap>::new())
        .build(|_request: Request, _cluster| async { Ok::<_, Never>(Action::await_change()) })?;
    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        KubeconfigOptions::default()
            .namespace(NAMESPACE.to_string())
            .members(MemberOptions::default().client(ClientOptions::default().http2(http2()))),
    ));
    let manager = Manager::builder(Cluster::new("local", admin.clone()))
        .provider(provider)
        .coordinator(Arc::new(OwnsNothing))
        .build();
    manager.add_controller(controller)?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let task = {
        let (manager, shutdown) = (manager.clone(), shutdown.clone());
        tokio::spawn(async move { manager.run(shutdown).await })
    };
    let ready = || {
        manager
            .cluster_states()
            .into_iter()
            .filter(|(_, status)| status.state == ClusterState::Ready)
            .count()
    };
    poll("every cluster ready", Duration::from_secs(900), || {
        ready() >= clusters
    })
    .await?;
    let all = started.elapsed();
    let per_cluster = |rss: f64| (rss - rss_before) * 1024.0 / clusters as f64;
    let rss_ready = resident_memory_mib();
    let connections_ready = connections_to(port);
    tokio::time::sleep(Duration::from_secs(120)).await;
    let rss_later = resident_memory_mib();
    let connections_later = connections_to(port);
    let (fds, _) = descriptors();
    println!(
        "clusters={clusters:>5} owned=none all-ready={:.2}s rss-ready={:.0}KiB/cluster connections-ready={connections_ready} \
         rss-2-min-later={:.0}KiB/cluster connections-2-min-later={connections_later} fds={fds}",
        all.as_secs_f64(),
        per_cluster(rss_ready),
        per_cluster(rss_later),
    );
    shutdown.cancel();
    task.await??;
    Ok(())
}
