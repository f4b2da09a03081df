//! Propagation benchmark: one hub object to N members. Each member is
//! built from a kubeconfig for one real control plane as the kubeconfig
//! providers build members (HTTP/2, default options), its cache limited to
//! a namespace of its own where its copy goes; the hub is the same control
//! plane's `hub` namespace.
//!
//! Reports, for the hub object's creation and then an update: the time
//! until every member's copy holds the new data, p50/p99 of the time each
//! member's copy took, the time until the hub object's status shows every
//! member in sync, and how many times the hub object was written (the
//! finalizer and the status) until it settled.
//!
//! `cargo bench -p multicluster-propagation --bench propagation`; set
//! `PROPAGATION_MEMBERS=100,1000` to choose N.

mod fleet;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::watcher;
use multicluster_envtest::ControlPlane;
use multicluster_propagation::{Desired, PROPAGATION_LABEL, Propagation};
use multicluster_runtime::Manager;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const HUB_NAMESPACE: &str = "hub";
const HUB_OBJECT: &str = "fleet-settings";
const STATUS: &str = "bench.example/propagation";
/// How long the hub object must stay unwritten to count as settled.
const SETTLED_AFTER: Duration = Duration::from_secs(3);

/// What the watches saw: each member's copy (value, when first seen) and
/// the hub object's writes.
#[derive(Default)]
struct Seen {
    copies: HashMap<String, (String, Instant)>,
    /// When the hub object was written, and its resourceVersion then.
    hub_writes: Vec<(Instant, String)>,
    hub_in_sync: usize,
}

/// The `p` percentile of `sorted`.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Follows the copies (every namespace, by the propagation's label) and
/// the hub object.
fn watch(admin: &kube::Client, seen: Arc<Mutex<Seen>>, stop: CancellationToken) {
    let copies = watcher(
        Api::<ConfigMap>::all(admin.clone()),
        watcher::Config::default().labels(&format!("{PROPAGATION_LABEL}=bench")),
    );
    let hub = watcher(
        Api::<ConfigMap>::namespaced(admin.clone(), HUB_NAMESPACE),
        watcher::Config::default().fields(&format!("metadata.name={HUB_OBJECT}")),
    );
    let (copies_seen, hub_seen) = (seen.clone(), seen);
    let stopped = stop.clone();
    tokio::spawn(async move {
        let mut copies = std::pin::pin!(copies);
        loop {
            let event = tokio::select! {
                event = copies.next() => event,
                () = stopped.cancelled() => return,
            };
            let Some(Ok(watcher::Event::Apply(copy) | watcher::Event::InitApply(copy))) = event
            else {
                continue;
            };
            let value = copy
                .data
                .as_ref()
                .and_then(|data| data.get("v"))
                .cloned()
                .unwrap_or_default();
            let namespace = copy.metadata.namespace.unwrap_or_default();
            let mut seen = lock(&copies_seen);
            if seen
                .copies
                .get(&namespace)
                .is_none_or(|(have, _)| *have != value)
            {
                seen.copies.insert(namespace, (value, Instant::now()));
            }
        }
    });
    tokio::spawn(async move {
        let mut hub = std::pin::pin!(hub);
        loop {
            let event = tokio::select! {
                event = hub.next() => event,
                () = stop.cancelled() => return,
            };
            let Some(Ok(watcher::Event::Apply(object))) = event else {
                continue;
            };
            let in_sync = object
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(STATUS))
                .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
                // The status names at most 100 members; `counts` has them all.
                .and_then(|status| status["counts"]["InSync"].as_u64())
                .and_then(|count| usize::try_from(count).ok())
                .unwrap_or(0);
            let version = object.metadata.resource_version.clone().unwrap_or_default();
            let mut seen = lock(&hub_seen);
            seen.hub_writes.push((Instant::now(), version));
            seen.hub_in_sync = in_sync;
        }
    });
}

/// Writes the hub object with data `v=value`, then measures until every
/// copy holds it and the hub object has settled.
async fn round(
    admin: &kube::Client,
    seen: &Arc<Mutex<Seen>>,
    members: usize,
    value: &str,
    what: &str,
) -> Result<(), fleet::Error> {
    let writes_before = lock(seen).hub_writes.len();
    let hub_object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": HUB_OBJECT, "namespace": HUB_NAMESPACE},
        "data": {"v": value},
    });
    let started = Instant::now();
    let own = Api::<ConfigMap>::namespaced(admin.clone(), HUB_NAMESPACE)
        .patch(
            HUB_OBJECT,
            &PatchParams::apply("bench"),
            &Patch::Apply(&hub_object),
        )
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let current = |seen: &Seen| {
        seen.copies
            .values()
            .filter(|(have, _)| have == value)
            .count()
    };
    fleet::until(Duration::from_secs(600), "every copy", || {
        current(&lock(seen)) == members
    })
    .await?;
    let applied = started.elapsed();
    fleet::until(Duration::from_secs(600), "the hub status", || {
        lock(seen).hub_in_sync == members
    })
    .await?;
    let reported = started.elapsed();
    // Settled: no write for a while.
    fleet::until(Duration::from_secs(600), "the hub object to settle", || {
        lock(seen)
            .hub_writes
            .last()
            .is_some_and(|(last, _)| last.elapsed() >= SETTLED_AFTER)
    })
    .await?;
    let seen = lock(seen);
    let mut latencies: Vec<Duration> = seen
        .copies
        .values()
        .map(|(_, at)| at.saturating_duration_since(started))
        .collect();
    latencies.sort();
    // Every write but the bench's own.
    let hub_writes = seen.hub_writes[writes_before..]
        .iter()
        .filter(|(_, version)| *version != own)
        .count();
    println!(
        "members={members:>5} {what:<7} every copy={:>7.2}s per member p50={:>7.1}ms p99={:>7.1}ms hub status complete={:>7.2}s hub writes={hub_writes}",
        applied.as_secs_f64(),
        percentile(&latencies, 0.50).as_secs_f64() * 1000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
        reported.as_secs_f64(),
    );
    Ok(())
}

async fn run(cp: &ControlPlane, members: usize) -> Result<(), fleet::Error> {
    let admin = cp.client().await?;
    let rss_before = multicluster_runtime::testing::resident_memory_mib();
    let provider = fleet::members(cp, HUB_NAMESPACE, members).await?;
    let propagation = Propagation::<ConfigMap>::new("bench")
        .select(|hub| hub.metadata.name.as_deref() == Some(HUB_OBJECT))
        .propagates::<ConfigMap>()
        .desired(|hub, member| {
            let copy = ConfigMap {
                metadata: ObjectMeta {
                    name: Some("copy".into()),
                    namespace: Some(member.name().as_str().to_string()),
                    ..ObjectMeta::default()
                },
                data: hub.data.clone(),
                ..ConfigMap::default()
            };
            Ok(vec![Desired::new(&copy)?])
        })
        .status_annotation(STATUS)
        .configure(|controller| controller.max_concurrent_reconciles(8))
        .build()?;
    let manager = fleet::manager(cp, provider).await?;
    manager.add_controller(propagation)?;
    let shutdown = CancellationToken::new();
    let task = {
        let (manager, shutdown) = (manager.clone(), shutdown.clone());
        tokio::spawn(async move { manager.run(shutdown).await })
    };
    fleet::all_ready(&manager, members).await?;

    let seen = Arc::new(Mutex::new(Seen::default()));
    watch(&admin, seen.clone(), shutdown.clone());
    let reconciles = |manager: &Manager| {
        manager
            .metrics()
            .encode()
            .lines()
            .filter(|line| {
                line.starts_with("controller_runtime_reconcile_") && !line.contains("_bucket")
            })
            .map(str::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    };
    round(&admin, &seen, members, "1", "create").await?;
    if std::env::var_os("BENCH_DETAIL").is_some() {
        println!("{}", reconciles(&manager));
    }
    round(&admin, &seen, members, "2", "update").await?;
    if std::env::var_os("BENCH_DETAIL").is_some() {
        println!("{}", reconciles(&manager));
    }
    let rss_after = multicluster_runtime::testing::resident_memory_mib();
    println!(
        "members={members:>5} rss={rss_after:.1}MiB (+{:.1}MiB for the fleet and its copies)",
        rss_after - rss_before
    );
    shutdown.cancel();
    task.await??;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), fleet::Error> {
    fleet::each_size("PROPAGATION_MEMBERS", |cp, members| async move {
        run(&cp, members).await
    })
    .await
}
