//! Isolation benchmark: ten member clusters, some of which stop answering
//! (their API servers paused with SIGSTOP) in the middle of a burst of
//! changes to them. Reports the change-to-reconcile latency on the healthy
//! members with every member healthy, with one stopped, and with three
//! stopped, all with the controller's default options (one slot per
//! cluster).
//!
//! Seven members are namespaces of one real control plane (each its own
//! client built from a kubeconfig, its cache limited to its namespace); the
//! other three are control planes of their own, so that they can be
//! stopped. The controller writes a copy of each changed ConfigMap into its
//! cluster (the write is what hangs on a stopped member); clients have the
//! default 30 s request deadline. The burst's reconciles wait before their
//! write until the members are stopped, so that the stop catches one in
//! flight in each.
//!
//! Run with `make bench` or `cargo bench -p multicluster-runtime --bench isolation`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::client::{self, ClientOptions};
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::testing::TestProvider;
use multicluster_runtime::{Cluster, Manager};
use tokio_util::sync::CancellationToken;

const HEALTHY: usize = 7;
/// Members with a control plane of their own, which can be stopped.
const STOPPABLE: usize = 3;
const UPDATES: usize = 180;
const UPDATE_INTERVAL: Duration = Duration::from_millis(20);
const BURST: usize = 40;

/// When each pending change was made, and how long each took to be
/// reconciled.
#[derive(Default)]
struct Observed {
    pending: HashMap<Request, Instant>,
    latencies: Vec<Duration>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn create_sources(api: &Api<ConfigMap>, names: impl Iterator<Item = String>) {
    for name in names {
        let source = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name),
                ..ObjectMeta::default()
            },
            data: Some([("value".to_string(), "0".to_string())].into()),
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &source)
            .await
            .expect("source");
    }
}

/// A cluster named `name` built from `cp`'s kubeconfig, its cache limited to
/// `namespace`.
async fn member(name: &str, cp: &ControlPlane, namespace: &str) -> Cluster {
    let client = client::build(
        cp.kubeconfig(),
        None,
        name,
        &Default::default(),
        &ClientOptions::default(),
    )
    .await
    .expect("client");
    let cache = Cache::with_options(
        name,
        client.clone(),
        CacheOptions::default().namespace(namespace.to_string()),
    );
    Cluster::with_cache(name, client, cache)
}

/// One case: the update load over the healthy members, after a burst in
/// each of the stoppable members, the first `stop` of which are then
/// stopped.
async fn case(
    shared: &ControlPlane,
    stoppable: &[ControlPlane],
    case: &str,
    stop: usize,
) -> Vec<Duration> {
    let admin = shared.client().await.expect("client");
    let provider = TestProvider::default();
    for m in 0..HEALTHY {
        let namespace = format!("{case}-{m}");
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .expect("namespace");
        create_sources(
            &Api::namespaced(admin.clone(), &namespace),
            (0..20).map(|i| format!("cm-{i}")),
        )
        .await;
        provider
            .clusters
            .add(
                namespace.as_str(),
                member(&namespace, shared, &namespace).await,
            )
            .expect("add");
    }
    for (i, cp) in stoppable.iter().enumerate() {
        let name = format!("stoppable-{i}");
        provider
            .clusters
            .add(name.as_str(), member(&name, cp, "default").await)
            .expect("add");
    }

    let observed = Arc::new(Mutex::new(Observed::default()));
    let stopped = Arc::new(tokio::sync::watch::channel(false).0);
    let builder =
        Controller::builder("bench").for_resource(Watch::<ConfigMap>::new().filter_by(|event| {
            !event
                .object()
                .metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .ends_with("-copy")
        }));
    let controller = {
        let (observed, stopped) = (observed.clone(), stopped.clone());
        builder
            .build(move |request: Request, cluster: Cluster| {
                let (observed, mut stopped) = (observed.clone(), stopped.subscribe());
                async move {
                    if request.name.contains("-burst-") {
                        let _ = stopped.wait_for(|stopped| *stopped).await;
                    }
                    {
                        let mut observed = lock(&observed);
                        if let Some(sent) = observed.pending.remove(&request) {
                            observed.latencies.push(sent.elapsed());
                        }
                    }
                    let namespace = request.namespace.clone().unwrap_or_default();
                    let copy = format!("{}-copy", request.name);
                    Api::<ConfigMap>::namespaced(cluster.client(), &namespace)
                        .patch(
                            &copy,
                            &PatchParams::apply("bench"),
                            &Patch::Apply(serde_json::json!({
                                "apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": copy},
                            })),
                        )
                        .await?;
                    Ok::<_, kube::Error>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let manager = Manager::builder(Cluster::new("local", admin.clone()))
        .provider(Arc::new(provider))
        .build();
    manager.add_controller(controller).expect("add");
    let shutdown = CancellationToken::new();
    let task = {
        let (manager, shutdown) = (manager.clone(), shutdown.clone());
        tokio::spawn(async move { manager.run(shutdown).await })
    };
    // Every member engaged and its first pass done.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !manager
        .cluster_states()
        .iter()
        .filter(|(name, _)| !name.is_local())
        .all(|(_, status)| status.state == multicluster_runtime::manager::ClusterState::Ready)
        || manager.cluster_states().len() < HEALTHY + STOPPABLE + 1
    {
        assert!(Instant::now() < deadline, "members did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("{case}: every member ready");

    if stop > 0 {
        // A burst of changes in the members to be stopped, which stop
        // answering while they are being reconciled.
        for cp in &stoppable[..stop] {
            let api = Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default");
            create_sources(&api, (0..BURST).map(|i| format!("{case}-burst-{i}"))).await;
        }
        for cp in &stoppable[..stop] {
            cp.pause_api_server().expect("SIGSTOP");
        }
    }
    stopped.send_replace(true);

    // Steady load on the healthy members: one change every
    // UPDATE_INTERVAL, round-robin; latency = change sent -> its reconcile
    // begins.
    for u in 0..UPDATES {
        let namespace = format!("{case}-{}", u % HEALTHY);
        let name = format!("cm-{}", (u / HEALTHY) % 20);
        lock(&observed).pending.insert(
            Request::new(namespace.as_str(), Some(&namespace), name.as_str()),
            Instant::now(),
        );
        Api::<ConfigMap>::namespaced(admin.clone(), &namespace)
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"data": {"value": u.to_string()}})),
            )
            .await
            .expect("patch");
        tokio::time::sleep(UPDATE_INTERVAL).await;
    }
    eprintln!("{case}: load sent");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !lock(&observed).pending.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for cp in &stoppable[..stop] {
        cp.resume_api_server().expect("SIGCONT");
    }
    shutdown.cancel();
    task.await.expect("task").expect("manager");
    let mut latencies = lock(&observed).latencies.clone();
    latencies.sort();
    latencies
}

#[tokio::main]
async fn main() {
    let (shared, stoppable) = tokio::join!(
        ControlPlane::start(),
        futures::future::join_all((0..STOPPABLE).map(|_| ControlPlane::start()))
    );
    let shared = shared.expect("control plane");
    let stoppable: Vec<ControlPlane> = stoppable
        .into_iter()
        .map(|cp| cp.expect("control plane"))
        .collect();
    println!("case (default options)                       changes  p50 (ms)  p99 (ms)  max (ms)");
    for (name, label, stop) in [
        ("healthy", "all 10 members healthy", 0),
        ("one", "1 of 10 stopped mid-burst", 1),
        ("three", "3 of 10 stopped mid-burst", 3),
    ] {
        let latencies = case(&shared, &stoppable, name, stop).await;
        println!(
            "{label:<44} {:>7}  {:>8.1}  {:>8.1}  {:>8.1}",
            latencies.len(),
            percentile(&latencies, 0.50).as_secs_f64() * 1000.0,
            percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
            latencies.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
        );
    }
}
