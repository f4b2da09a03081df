//! How the namespace provider grows with the number of namespaces: N
//! namespaces with 10 ConfigMaps each on one real control plane, one
//! controller over all virtual clusters. Reports the time until every
//! object was reconciled once, process RSS, and the number of API watches
//! the host cache holds (one per type, whatever N) and the connections the
//! process keeps to the host.
//!
//! `cargo bench -p multicluster-provider-namespace --bench scale`
//! (`NAMESPACE_COUNTS=10,100,500`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_provider_namespace::{NamespaceOptions, NamespaceProvider, WATCH_FILTER_LABEL};
use multicluster_runtime::controller::Watch;
use multicluster_runtime::testing::{Recorder, recording_controller, resident_memory_mib};
use multicluster_runtime::{Cluster, Manager};
use tokio_util::sync::CancellationToken;

const OBJECTS_PER_NAMESPACE: usize = 10;

async fn run(cp: &ControlPlane, count: usize) -> Result<(), Box<dyn std::error::Error>> {
    let admin = cp.client().await?;
    // Each round labels its namespaces with its own watch filter so earlier
    // rounds' namespaces stay out.
    let filter = format!("round-{count}");
    for n in 0..count {
        let ns = format!("scale-{count}-{n}");
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                labels: Some([(WATCH_FILTER_LABEL.to_string(), filter.clone())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        for i in 0..OBJECTS_PER_NAMESPACE {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("cm-{i}"));
            Api::<ConfigMap>::namespaced(admin.clone(), &ns)
                .create(&PostParams::default(), &cm)
                .await?;
        }
    }

    let before = resident_memory_mib();
    let host = Cluster::new("host", cp.client().await?);
    let provider = Arc::new(NamespaceProvider::new(
        host.client(),
        NamespaceOptions::default().watch_filter(Some(filter)),
    ));
    let manager = Manager::builder(host.clone()).provider(provider).build();
    let recorder = Recorder::default();
    manager.add_controller(recording_controller(
        "scale",
        Watch::<ConfigMap>::new(),
        &recorder,
    )?)?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let task = {
        let (manager, shutdown) = (manager.clone(), shutdown.clone());
        tokio::spawn(async move { manager.run(shutdown).await })
    };
    let expected = count * OBJECTS_PER_NAMESPACE;
    let deadline = Instant::now() + Duration::from_secs(600);
    // Count distinct requests: each object once in its own virtual cluster.
    while recorder.clusters().len() < count || recorder.total() < expected {
        if Instant::now() > deadline {
            return Err(format!("only {} of {expected} reconciles", recorder.total()).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    let after = resident_memory_mib();
    let port: u16 = cp
        .server()
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_default();
    println!(
        "namespaces={count:>4} objects={expected:>5} first-pass={:>6.2}s rss={after:>6.1}MiB (+{:.1}MiB, {:.0}KiB per namespace) \
         host API watches={} connections to the host={} virtual clusters={}",
        elapsed.as_secs_f64(),
        after - before,
        (after - before) * 1024.0 / count as f64,
        host.cache().informer_count(),
        multicluster_runtime::testing::connections_to(port),
        recorder.clusters().len(),
    );
    shutdown.cancel();
    task.await??;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let counts: Vec<usize> = std::env::var("NAMESPACE_COUNTS")
        .unwrap_or_else(|_| "10,100,500".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let cp = ControlPlane::start().await?;
    for count in counts {
        run(&cp, count).await?;
    }
    Ok(())
}
