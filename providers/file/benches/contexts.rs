//! One kubeconfig file with many contexts (each its own cluster entry and
//! user, all pointing at one real control plane): how long until the first
//! and until every context is engaged, and what adding one context to the
//! file costs (how long until it is engaged, how many others are rebuilt).
//!
//! Run with `make bench` or `cargo bench -p multicluster-provider-file --bench contexts`;
//! set `FILE_CONTEXTS=100,1000` to choose the sizes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::config::Kubeconfig;
use multicluster_envtest::ControlPlane;
use multicluster_provider_file::{FileOptions, FileProvider};
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, ProviderContext, RunnableProvider};
use tokio_util::sync::CancellationToken;

/// Records when each cluster was engaged (the provider's side of
/// engagement; no manager probes the clusters).
#[derive(Default)]
struct Engagements(Mutex<Vec<(ClusterName, Instant)>>);

impl Aware for Engagements {
    fn engage(&self, _: CancellationToken, name: ClusterName, _: Cluster) -> Result<(), Error> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name, Instant::now()));
        Ok(())
    }
}

impl Engagements {
    fn count(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn first(&self) -> Option<Instant> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first()
            .map(|(_, at)| *at)
    }
}

/// `count` contexts `ctx-<i>`, each with its own cluster and user entry,
/// copies of `base`'s.
fn fleet(base: &Kubeconfig, count: usize) -> String {
    let mut fleet = base.clone();
    fleet.clusters.clear();
    fleet.contexts.clear();
    fleet.auth_infos.clear();
    for index in 0..count {
        let mut cluster = base.clusters[0].clone();
        cluster.name = format!("cluster-{index}");
        let mut user = base.auth_infos[0].clone();
        user.name = format!("user-{index}");
        let mut context = base.contexts[0].clone();
        context.name = format!("ctx-{index}");
        if let Some(entry) = context.context.as_mut() {
            entry.cluster = cluster.name.clone();
            entry.user = Some(user.name.clone());
        }
        fleet.clusters.push(cluster);
        fleet.auth_infos.push(user);
        fleet.contexts.push(context);
    }
    fleet.current_context = Some("ctx-0".into());
    multicluster_envtest::to_yaml(&fleet).expect("yaml")
}

/// Polls `check` until it holds, for at most ten minutes.
async fn wait_until(check: impl Fn() -> bool) -> Result<(), ()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !check() {
        if Instant::now() >= deadline {
            return Err(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let cp = ControlPlane::start().await.expect("control plane");
    let sizes = std::env::var("FILE_CONTEXTS").unwrap_or_else(|_| "100,1000".into());
    println!("contexts  first engaged  all engaged  one added: engaged after  others rebuilt");
    for size in sizes.split(',') {
        let count: usize = size.trim().parse().expect("FILE_CONTEXTS: numbers");
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("fleet.kubeconfig");
        std::fs::write(&file, fleet(cp.kubeconfig(), count)).expect("write");

        let provider = Arc::new(FileProvider::new(
            FileOptions::default().files(vec![file.clone()]),
        ));
        let engagements = Arc::new(Engagements::default());
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn({
            let (provider, shutdown, aware) =
                (provider.clone(), shutdown.clone(), engagements.clone());
            async move {
                let context = ProviderContext::new(shutdown, aware, Metrics::default());
                provider.start(context).await
            }
        });
        wait_until(|| engagements.count() == count)
            .await
            .unwrap_or_else(|()| {
                panic!(
                    "{} of {count} contexts engaged; not engaged: {:?}",
                    engagements.count(),
                    provider.failures().into_iter().take(3).collect::<Vec<_>>()
                )
            });
        let all = started.elapsed();
        let first = engagements.first().expect("one") - started;

        // One more context; the others are unchanged.
        let added_at = Instant::now();
        let tmp = dir.path().join("fleet.tmp");
        std::fs::write(&tmp, fleet(cp.kubeconfig(), count + 1)).expect("write");
        std::fs::rename(&tmp, &file).expect("rename");
        wait_until(|| engagements.count() > count)
            .await
            .expect("the added context is engaged");
        let added = added_at.elapsed();
        // Anything rebuilt would be engaged again; give it a moment to show.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rebuilt = engagements.count() - count - 1;
        shutdown.cancel();
        task.await.expect("task").expect("provider");
        println!(
            "{count:>8}  {:>11.3} s  {:>9.3} s  {:>23.3} s  {rebuilt:>14}",
            first.as_secs_f64(),
            all.as_secs_f64(),
            added.as_secs_f64()
        );
    }
}
