//! Fleet benchmark: N clusters (each a kubeconfig-built client to one real
//! control plane, its cache limited to its own namespace holding 100
//! ConfigMaps), one controller over all of them.
//!
//! Reports, per N: time from `Manager::run` until every cluster's first
//! reconcile pass has completed, process RSS after sync, and
//! event-to-reconcile latency (p50/p99) under a steady update load.
//!
//! Run with `make bench` or `cargo bench -p multicluster-runtime --bench fleet`;
//! set `FLEET_SIZES=10,100` to choose N.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::testing::TestProvider;
use multicluster_runtime::{Cluster, Manager};
use tokio_util::sync::CancellationToken;

const OBJECTS_PER_CLUSTER: usize = 100;
const UPDATES: usize = 400;
const UPDATE_INTERVAL: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// Reconcile bookkeeping: first-pass coverage and update latencies.
#[derive(Default)]
struct Observed {
    reconciled: HashMap<Request, usize>,
    pending_updates: HashMap<Request, Instant>,
    latencies: Vec<Duration>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn run(cp: &ControlPlane, clusters: usize) -> Result<(), Box<dyn std::error::Error>> {
    let admin = cp.client().await?;
    // Objects are created up front; the benchmark measures the fleet, not
    // the set-up.
    for c in 0..clusters {
        let ns = format!("bench-{clusters}-{c}");
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(ns.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await?;
        let api = Api::<ConfigMap>::namespaced(admin.clone(), &ns);
        for i in 0..OBJECTS_PER_CLUSTER {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("cm-{i}")),
                    ..ObjectMeta::default()
                },
                data: Some([("value".to_string(), "0".to_string())].into()),
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &cm).await?;
        }
    }

    let rss_before = multicluster_runtime::testing::resident_memory_mib();
    let provider = TestProvider::default();
    for c in 0..clusters {
        let name = format!("bench-{clusters}-{c}");
        let client = multicluster_envtest::client_for(cp.kubeconfig()).await?;
        let cache = Cache::with_options(
            name.as_str(),
            client.clone(),
            CacheOptions::default().namespace(Some(name.clone())),
        );
        provider.clusters.add(
            name.as_str(),
            Cluster::with_cache(name.as_str(), client, cache),
        )?;
    }
    let observed = Arc::new(Mutex::new(Observed::default()));
    let controller = {
        let observed = observed.clone();
        Controller::builder("bench")
            .for_resource(Watch::<ConfigMap>::new())
            .max_concurrent_reconciles(8)
            .build(move |request, _cluster| {
                let observed = observed.clone();
                async move {
                    let mut observed = observed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    *observed.reconciled.entry(request.clone()).or_default() += 1;
                    if let Some(sent) = observed.pending_updates.remove(&request) {
                        observed.latencies.push(sent.elapsed());
                    }
                    Ok::<_, Never>(Action::await_change())
                }
            })?
    };
    let manager = Manager::builder(Cluster::new("local", cp.client().await?))
        .provider(Arc::new(provider))
        .build();
    manager.add_controller(controller)?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let task = {
        let manager = manager.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { manager.run(shutdown).await })
    };

    let expected = clusters * OBJECTS_PER_CLUSTER;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = observed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .reconciled
            .len();
        if done >= expected {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("only {done} of {expected} objects reconciled").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first_pass = started.elapsed();
    let rss_after = multicluster_runtime::testing::resident_memory_mib();

    // Steady update load: one patch every UPDATE_INTERVAL, round-robin over
    // clusters; latency = patch sent -> reconcile of that object begins.
    for u in 0..UPDATES {
        let c = u % clusters;
        let name = format!("cm-{}", (u / clusters) % OBJECTS_PER_CLUSTER);
        let ns = format!("bench-{clusters}-{c}");
        let request = Request::new(ns.as_str(), Some(&ns), name.as_str());
        observed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pending_updates
            .insert(request, Instant::now());
        Api::<ConfigMap>::namespaced(admin.clone(), &ns)
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"data": {"value": u.to_string()}})),
            )
            .await?;
        tokio::time::sleep(UPDATE_INTERVAL).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !observed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .pending_updates
        .is_empty()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut latencies = observed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .latencies
        .clone();
    latencies.sort();

    println!(
        "clusters={clusters:>4} objects={expected:>6} first-pass={:>7.2}s rss-after-sync={:>7.1}MiB (+{:.1}MiB for the fleet) \
         update-latency p50={:>6.1}ms p99={:>6.1}ms (n={})",
        first_pass.as_secs_f64(),
        rss_after,
        rss_after - rss_before,
        percentile(&latencies, 0.50).as_secs_f64() * 1000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
        latencies.len(),
    );
    shutdown.cancel();
    task.await??;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sizes: Vec<usize> = std::env::var("FLEET_SIZES")
        .unwrap_or_else(|_| "10,100".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let cp = ControlPlane::start().await?;
    for clusters in sizes {
        run(&cp, clusters).await?;
    }
    Ok(())
}
