//! Propagation across a fleet: every ConfigMap on the hub (the cluster
//! `$KUBECONFIG` points at) labelled `fleet.example/propagate=true` is
//! copied into every member cluster (one per kubeconfig Secret), kept equal
//! to the hub's, made in members that join later, and removed from every
//! member when it is deleted on the hub or unlabelled (a finalizer holds
//! the hub object until then). The hub object's `fleet.example/propagation`
//! annotation says how each member is doing.
//!
//! All of it is `multicluster_propagation::Propagation`: this example is
//! only its policy (which hub objects, what they want in a member, where
//! their status goes).

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_example_configmap_sync::{MainError, SecretFleetArgs, TraceArgs, hub_copy};
use multicluster_propagation::{Desired, Propagation};
use multicluster_runtime::Cluster;

/// The label that marks a hub ConfigMap to propagate.
const PROPAGATE_LABEL: &str = "fleet.example/propagate";
/// The annotation holding each member's state (JSON).
const STATUS_ANNOTATION: &str = "fleet.example/propagation";

/// Propagate labelled hub ConfigMaps to every member cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    fleet: SecretFleetArgs,
    #[command(flatten)]
    traces: TraceArgs,
}

fn propagated(object: &ConfigMap) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(PROPAGATE_LABEL))
        .is_some_and(|value| value == "true")
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    let _traces =
        multicluster_example_configmap_sync::init_logging(&args.traces, env!("CARGO_PKG_NAME"))?;

    // The hub: where the objects to propagate and the members' Secrets live.
    let hub = Cluster::new("hub", kube::Client::try_default().await?);
    // The members: one per kubeconfig Secret.
    let manager = args.fleet.manager(hub.clone())?;

    let propagation = Propagation::<ConfigMap>::new("fleet-propagation")
        .select(propagated)
        .propagates::<ConfigMap>()
        .desired(|hub, _member| Ok(vec![Desired::new(&hub_copy(hub))?]))
        .status_annotation(STATUS_ANNOTATION)
        .configure(|controller| controller.max_concurrent_reconciles(8))
        .build()?;

    manager.add_controller(propagation)?;
    tracing::info!("propagating; Ctrl-C stops");
    manager.run_until_signal().await?;
    Ok(())
}
