//! A workload rolled out across the fleet, a quarter of the members at a
//! time: a `FleetDeployment` on the hub (the cluster `$KUBECONFIG` points
//! at; its CRD, derived from the types below, is installed by this
//! example) becomes a Deployment of the same name in every member (one per
//! kubeconfig Secret). A new image reaches a member only once a slot is
//! free: at most 25 % of the members are between the new spec and its
//! availability (the Deployment's own report) at once. The annotation
//! `propagation.mcr.sigs.k8s.io/paused: "true"` pauses it. `kubectl get
//! fleetdeployments` shows the rollout's revision and progress.
//!
//! `multicluster_propagation::Propagation` does the work; this is its
//! policy: the hub type, the Deployment it wants in a member, and the
//! pace. Several replicas run with `--shard` share the members (a sharded
//! coordinator, its Leases on the hub): each rolls out to its own, and the
//! 25 % hold across all of them.

use std::sync::Arc;

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{CustomResource, CustomResourceExt};
use multicluster_coordinator::sharding::{ShardedCoordinator, ShardingOptions};
use multicluster_example_configmap_sync::{MainError, SecretFleetArgs, TraceArgs};
use multicluster_propagation::{Desired, MaxUnavailable, Propagation, PropagationStatus, Rollout};
use multicluster_runtime::Cluster;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A Deployment to run in every member.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, schemars::JsonSchema)]
#[kube(
    group = "fleet.example",
    version = "v1alpha1",
    kind = "FleetDeployment",
    namespaced,
    status = "PropagationStatus",
    category = "multicluster",
    printcolumn = r#"{"name": "Revision", "type": "string", "jsonPath": ".status.rollout.revision"}"#,
    printcolumn = r#"{"name": "Updated", "type": "integer", "jsonPath": ".status.rollout.updated"}"#,
    printcolumn = r#"{"name": "To go", "type": "integer", "jsonPath": ".status.rollout.remaining"}"#,
    printcolumn = r#"{"name": "Halted", "type": "string", "jsonPath": ".status.rollout.halted"}"#,
    printcolumn = r#"{"name": "Propagated", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Propagated\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FleetDeploymentSpec {
    /// The namespace of the Deployment in each member.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The container image.
    pub image: String,
    /// Replicas in each member.
    #[serde(default = "one")]
    pub replicas: i32,
}

fn default_namespace() -> String {
    "default".into()
}

fn one() -> i32 {
    1
}

/// Roll FleetDeployments out to every member cluster, 25 % at a time.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    fleet: SecretFleetArgs,
    /// Share the members with the other replicas run with --shard: each
    /// works on its own share (the bound holds across all of them).
    #[arg(long)]
    shard: bool,
    /// This replica's ID among them (default: the host name).
    #[arg(long, env = "PEER_ID")]
    peer_id: Option<String>,
    /// Where the replicas' Leases live, on the hub.
    #[arg(long, default_value = "kube-system")]
    lease_namespace: String,
    #[command(flatten)]
    traces: TraceArgs,
}

/// The Deployment a FleetDeployment wants in each member.
fn deployment_for(hub: &FleetDeployment) -> Result<Deployment, serde_json::Error> {
    let name = hub.metadata.name.clone().unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": hub.spec.namespace},
        "spec": {
            "replicas": hub.spec.replicas,
            "selector": {"matchLabels": {"fleet.example/deployment": name}},
            "template": {
                "metadata": {"labels": {"fleet.example/deployment": name}},
                "spec": {"containers": [{"name": "main", "image": hub.spec.image}]},
            },
        },
    }))
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    let _traces =
        multicluster_example_configmap_sync::init_logging(&args.traces, env!("CARGO_PKG_NAME"))?;

    let hub = Cluster::new("hub", kube::Client::try_default().await?);
    multicluster_example_configmap_sync::install_crd(
        &hub.client(),
        &FleetDeployment::crd(),
        "fleet-rollout",
    )
    .await?;
    let mut builder = args.fleet.builder(hub.clone())?;
    if args.shard {
        if args.fleet.manager.leader_elect {
            return Err("--shard and --leader-elect: choose one (sharded replicas all work, each on its share; under leader election one works)".into());
        }
        let sharding = ShardingOptions::default()
            .peer_id(args.peer_id.clone())
            .namespace(args.lease_namespace.clone());
        builder = builder.coordinator(Arc::new(ShardedCoordinator::new(hub.client(), sharding)?));
    }
    let manager = builder.build();

    let deployments = Propagation::<FleetDeployment>::new("fleet-rollout")
        .propagates::<Deployment>()
        .desired(|hub, _member| Ok(vec![Desired::new(&deployment_for(hub)?)?]))
        .rollout(Rollout::rolling(MaxUnavailable::Percent(25)))
        .status_subresource()
        .build()?;
    manager.add_controller(deployments)?;
    tracing::info!("rolling FleetDeployments out, 25 % of the members at a time; Ctrl-C stops");
    manager.run_until_signal().await?;
    Ok(())
}
