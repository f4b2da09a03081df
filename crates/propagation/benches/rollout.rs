//! Rollout benchmark: one hub object rolled out to N members as a
//! Deployment, 10 % at a time with a health gate, each member turning
//! available 1 s after it is given a new spec (the Deployment controller
//! is played, `multicluster_envtest::played`, writing the status as the
//! real one does; the members run none). Members are built as in the
//! propagation bench.
//!
//! Reports, for the hub object's creation and an update: the time until
//! every member is available with it and the rollout says it is done,
//! the most members changing at once (bound: 10 %), the hub object's
//! writes (finalizer, status, rollout state) per member, and memory.
//! Then a bad release (never available): how many members took it, how
//! soon the rollout rolls back, and how soon every member is back.
//!
//! `ROLLOUT_MEMBERS=100,1000 cargo bench -p multicluster-propagation --bench rollout`;
//! `ROLLOUT_REPLICAS=2` runs two replicas sharing the fleet (a sharded
//! coordinator each, in this process).

mod fleet;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use multicluster_coordinator::sharding::{ShardedCoordinator, ShardingOptions};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::played::Deployments;
use multicluster_propagation::{Desired, MaxUnavailable, OnFailure, Propagation, Rollout};
use multicluster_runtime::coordinator::Coordinator;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const HUB_NAMESPACE: &str = "hub";
const HUB_OBJECT: &str = "web";
const STATUS: &str = "bench.example/propagation";
/// How long the played Deployment controller takes to roll a spec out.
const ROLL_TIME: Duration = Duration::from_secs(1);

/// What the bench follows of the hub object.
#[derive(Default)]
struct Hub {
    /// Its writes.
    writes: usize,
    /// What its condition says last.
    message: String,
}

fn lock(hub: &Mutex<Hub>) -> std::sync::MutexGuard<'_, Hub> {
    hub.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Follows the hub object's writes and condition.
fn follow(admin: &kube::Client, seen: Arc<Mutex<Hub>>, stop: CancellationToken) {
    let hub = watcher(
        Api::<ConfigMap>::namespaced(admin.clone(), HUB_NAMESPACE),
        watcher::Config::default().fields(&format!("metadata.name={HUB_OBJECT}")),
    );
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
            let message = object
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(STATUS))
                .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
                .and_then(|status| status["condition"]["message"].as_str().map(str::to_string))
                .unwrap_or_default();
            let mut seen = lock(&seen);
            seen.writes += 1;
            seen.message = message;
        }
    });
}

/// Writes `tag` to the hub object, for a new round; returns the hub
/// object's writes before it and when it was written.
async fn write_tag(
    admin: &kube::Client,
    played: &Deployments,
    hub: &Arc<Mutex<Hub>>,
    tag: &str,
) -> Result<(usize, Instant), fleet::Error> {
    let writes_before = lock(hub).writes;
    played.reset_most();
    let hub_object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": HUB_OBJECT, "namespace": HUB_NAMESPACE},
        "data": {"tag": tag},
    });
    let started = Instant::now();
    Api::<ConfigMap>::namespaced(admin.clone(), HUB_NAMESPACE)
        .patch(
            HUB_OBJECT,
            &PatchParams::apply("bench"),
            &Patch::Apply(&hub_object),
        )
        .await?;
    Ok((writes_before, started))
}

/// Rolls `tag` out and measures it.
async fn round(
    admin: &kube::Client,
    played: &Deployments,
    hub: &Arc<Mutex<Hub>>,
    members: usize,
    tag: &str,
    what: &str,
) -> Result<(), fleet::Error> {
    let image = format!("registry.k8s.io/pause:{tag}");
    let (writes_before, started) = write_tag(admin, played, hub, tag).await?;
    fleet::until(Duration::from_secs(900), "every member available", || {
        played.available(&image).len() == members
    })
    .await?;
    let every_member = started.elapsed();
    let done = format!("{members} updated, 0 updating, 0 to go");
    fleet::until(Duration::from_secs(300), "the rollout done", || {
        lock(hub).message.contains(&done)
    })
    .await?;
    let rolled_out = started.elapsed();
    // The bench's own write aside.
    let hub_writes = lock(hub).writes - writes_before - 1;
    println!(
        "members={members:>5} {what:<7} every member available={:>6.2}s rollout done={:>6.2}s most changing at once={} (bound {}) hub writes={hub_writes} ({:.3} per member)",
        every_member.as_secs_f64(),
        rolled_out.as_secs_f64(),
        played.most_changing(),
        (members / 10).max(1),
        hub_writes as f64 / members as f64,
    );
    Ok(())
}

/// Writes `tag`, a release whose Deployments never become available, and
/// measures the roll back: how many members took it, how soon the rollout
/// rolls back, and how soon every member is available with `back_to`
/// again.
async fn roll_back_round(
    admin: &kube::Client,
    played: &Deployments,
    hub: &Arc<Mutex<Hub>>,
    members: usize,
    tag: &str,
    back_to: &str,
) -> Result<(), fleet::Error> {
    let (bad, good) = (
        format!("registry.k8s.io/pause:{tag}"),
        format!("registry.k8s.io/pause:{back_to}"),
    );
    played.fail_image(&bad, true);
    let (writes_before, started) = write_tag(admin, played, hub, tag).await?;
    fleet::until(Duration::from_secs(300), "the rollout rolling back", || {
        lock(hub).message.contains("roll back from revision")
    })
    .await?;
    let rolling_back = started.elapsed();
    fleet::until(Duration::from_secs(900), "every member back", || {
        played.running(&good).len() == members
    })
    .await?;
    let every_member = started.elapsed();
    let done = format!("{members} updated, 0 updating, 0 to go");
    fleet::until(Duration::from_secs(300), "the roll back done", || {
        let message = &lock(hub).message;
        message.contains("roll back from revision") && message.contains(&done)
    })
    .await?;
    let rolled_back = started.elapsed();
    played.fail_image(&bad, false);
    // Every spec given is kept: those given the bad release at all.
    let took_bad = played.given(&bad).len();
    let hub_writes = lock(hub).writes - writes_before - 1;
    println!(
        "members={members:>5} roll back: took the bad release={took_bad} rolling back={:>6.2}s every member back={:>6.2}s roll back done={:>6.2}s most changing at once={} (bound {}) hub writes={hub_writes} ({:.3} per member)",
        rolling_back.as_secs_f64(),
        every_member.as_secs_f64(),
        rolled_back.as_secs_f64(),
        played.most_changing(),
        (members / 10).max(1),
        hub_writes as f64 / members as f64,
    );
    Ok(())
}

/// The propagation under test: the hub ConfigMap as a Deployment in every
/// member, 10 % at a time, rolling back past its failure budget (none).
fn propagation() -> Result<multicluster_runtime::controller::Controller, fleet::Error> {
    Ok(Propagation::<ConfigMap>::new("bench")
        .select(|hub| hub.metadata.name.as_deref() == Some(HUB_OBJECT))
        .propagates::<Deployment>()
        .desired(|hub, member| {
            let tag = hub
                .data
                .as_ref()
                .and_then(|data| data.get("tag"))
                .cloned()
                .unwrap_or_default();
            let deployment: Deployment = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": member.name().as_str()},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": format!("registry.k8s.io/pause:{tag}")}]},
                    },
                },
            }))?;
            Ok(vec![Desired::new(&deployment)?])
        })
        .rollout(Rollout::rolling(MaxUnavailable::Percent(10)).on_failure(OnFailure::RollBack))
        .status_annotation(STATUS)
        .configure(|controller| controller.max_concurrent_reconciles(8))
        .build()?)
}

/// Starts `replicas` managers over the fleet: one alone, or several
/// sharing it by a sharded coordinator each (as separate processes
/// would: every replica builds its own members). Returns once every
/// member is worked on.
async fn start(
    cp: &ControlPlane,
    members: usize,
    replicas: usize,
    shutdown: &CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<Result<(), multicluster_runtime::Error>>>, fleet::Error> {
    let mut tasks = Vec::new();
    let mut managers = Vec::new();
    let mut coordinators = Vec::new();
    for replica in 0..replicas {
        let provider = fleet::members(cp, HUB_NAMESPACE, members).await?;
        let manager = if replicas == 1 {
            fleet::manager(cp, provider).await?
        } else {
            let client = cp.client().await?;
            let coordinator = Arc::new(ShardedCoordinator::new(
                client.clone(),
                ShardingOptions::default().peer_id(format!("bench-{replica}")),
            )?);
            coordinators.push(coordinator.clone());
            multicluster_runtime::Manager::builder(multicluster_runtime::Cluster::local(client))
                .provider(Arc::new(provider))
                .coordinator(coordinator)
                .build()
        };
        manager.add_controller(propagation()?)?;
        let (run, stop) = (manager.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move { run.run(stop).await }));
        managers.push(manager);
    }
    if replicas == 1 {
        fleet::all_ready(&managers[0], members).await?;
    } else {
        let worked_on = || {
            coordinators
                .iter()
                .map(|c| {
                    c.working_on()
                        .unwrap_or_default()
                        .iter()
                        .filter(|name| !name.is_local())
                        .count()
                })
                .sum::<usize>()
        };
        fleet::until(
            Duration::from_secs(600),
            "every member worked on by a replica",
            || worked_on() == members,
        )
        .await?;
    }
    Ok(tasks)
}

async fn run(cp: &ControlPlane, members: usize, replicas: usize) -> Result<(), fleet::Error> {
    let admin = cp.client().await?;
    let rss_before = multicluster_runtime::testing::resident_memory_mib();
    let shutdown = CancellationToken::new();
    let tasks = start(cp, members, replicas, &shutdown).await?;
    let hub = Arc::new(Mutex::new(Hub::default()));
    follow(&admin, hub.clone(), shutdown.clone());
    let played = Deployments::default();
    played.watch("member", admin.clone(), ROLL_TIME);
    println!("members={members:>5} replicas={replicas}");
    round(&admin, &played, &hub, members, "v1", "create").await?;
    round(&admin, &played, &hub, members, "v2", "update").await?;
    roll_back_round(&admin, &played, &hub, members, "v3", "v2").await?;
    let rss_after = multicluster_runtime::testing::resident_memory_mib();
    println!(
        "members={members:>5} rss={rss_after:.1}MiB (+{:.1}MiB for the fleet, its Deployments and the rollout)",
        rss_after - rss_before
    );
    shutdown.cancel();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), fleet::Error> {
    let replicas = std::env::var("ROLLOUT_REPLICAS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_usize)
        .max(1);
    fleet::each_size("ROLLOUT_MEMBERS", |cp, members| async move {
        run(&cp, members, replicas).await
    })
    .await
}
