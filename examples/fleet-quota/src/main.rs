//! A hub custom resource propagated into the members, with each member's
//! state in its status: a `FleetQuota` on the hub (the cluster
//! `$KUBECONFIG` points at; its CRD, derived from the types below, is
//! installed by this example) becomes a ResourceQuota of the same name in every member
//! (one per kubeconfig Secret), in the namespace it names. Its status lists
//! every member (`InSync`, `Failed` with the member's reason, ...) and a
//! `Propagated` condition sums up: `kubectl get fleetquotas` shows it.
//!
//! `multicluster_propagation::Propagation` does the work; this is its
//! policy: a hub type of one's own, the object it wants in a member, and a
//! status subresource to report in, of the type the propagation ships
//! (`PropagationStatus`, schema included: no status schema to write).

use std::collections::BTreeMap;

use clap::Parser;
use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use kube::{CustomResource, CustomResourceExt};
use multicluster_example_configmap_sync::{MainError, SecretFleetArgs, TraceArgs};
use multicluster_propagation::{Desired, Propagation, PropagationStatus};
use multicluster_runtime::Cluster;
use serde::{Deserialize, Serialize};

/// A ResourceQuota to keep in every member.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, schemars::JsonSchema)]
#[kube(
    group = "fleet.example",
    version = "v1alpha1",
    kind = "FleetQuota",
    namespaced,
    status = "PropagationStatus",
    category = "multicluster",
    printcolumn = r#"{"name": "Propagated", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Propagated\")].status"}"#,
    printcolumn = r#"{"name": "Reason", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Propagated\")].reason"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
pub struct FleetQuotaSpec {
    /// The namespace of the quota in each member.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The quota's hard limits.
    pub hard: BTreeMap<String, Quantity>,
}

fn default_namespace() -> String {
    "default".into()
}

/// Propagate FleetQuotas to every member cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    fleet: SecretFleetArgs,
    #[command(flatten)]
    traces: TraceArgs,
}

/// The quota a FleetQuota wants in each member.
fn quota_for(hub: &FleetQuota) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            name: hub.metadata.name.clone(),
            namespace: Some(hub.spec.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(hub.spec.hard.clone()),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    }
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    let _traces =
        multicluster_example_configmap_sync::init_logging(&args.traces, env!("CARGO_PKG_NAME"))?;

    let hub = Cluster::new("hub", kube::Client::try_default().await?);
    multicluster_example_configmap_sync::install_crd(
        &hub.client(),
        &FleetQuota::crd(),
        "fleet-quota",
    )
    .await?;
    let manager = args.fleet.manager(hub.clone())?;

    let quotas = Propagation::<FleetQuota>::new("fleet-quota")
        .propagates::<ResourceQuota>()
        .desired(|hub, _member| Ok(vec![Desired::new(&quota_for(hub))?]))
        .status_subresource()
        .build()?;
    manager.add_controller(quotas)?;
    tracing::info!("propagating FleetQuotas; Ctrl-C stops");
    manager.run_until_signal().await?;
    Ok(())
}
