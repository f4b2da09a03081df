//! A fleet controller in one file: clusters from kubeconfig Secrets, a
//! summary of each cluster's ConfigMaps, and the fleet's state as it changes.

use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_provider_kubeconfig::{KubeconfigOptions, KubeconfigProvider};
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::{Cluster, Manager};
use std::sync::Arc;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Every ConfigMap of a cluster maps to this one request of that cluster, so
/// a burst of changes gives one reconcile per cluster, not one per object.
const SUMMARY: &str = "configmap-summary";

async fn summarise(request: Request, cluster: Cluster) -> Result<Action, Error> {
    // The cluster's shared cache: no request to its API server.
    let count = cluster.cache().list::<ConfigMap>(None).await?.len();
    tracing::info!(cluster = %request.cluster, count, "ConfigMaps");
    Ok(Action::await_change())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| multicluster_runtime::LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // The cluster this process runs against ($KUBECONFIG, in-cluster).
    let client = kube::Client::try_default().await?;
    // Members: Secrets labelled sigs.k8s.io/multicluster-runtime-kubeconfig=true
    // in namespace fleet, each holding a kubeconfig (key "kubeconfig"). Those
    // kubeconfigs may not run exec plugins or name files of this process
    // unless allowed: `.kubeconfig_policy(...)` (the core README's Security).
    let provider = Arc::new(KubeconfigProvider::new(
        client.clone(),
        KubeconfigOptions::default().namespace("fleet".to_string()),
    ));
    let manager = Manager::builder(Cluster::local(client))
        .provider(provider)
        .build();
    let controller = Controller::builder("configmap-summary")
        .watches(Watch::<ConfigMap>::new(), |context, _| {
            vec![context.here(None, SUMMARY)]
        })
        .build(summarise)?;
    manager.add_controller(controller)?;

    // The fleet view: counts by state, told of every change.
    let mut fleet = manager.watch_fleet();
    tokio::spawn(async move {
        while fleet.changed().await.is_ok() {
            let now = fleet.borrow_and_update().clone();
            tracing::info!(
                ready = now.ready,
                degraded = now.degraded,
                unreachable = now.unreachable,
                unusable = now.unusable,
                "fleet"
            );
        }
    });
    manager.run_until_signal().await?;
    Ok(())
}
