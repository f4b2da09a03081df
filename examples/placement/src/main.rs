//! Propagation by placement: a ConfigMap on the hub (the cluster
//! `$KUBECONFIG` points at) annotated `fleet.example/placement=<key>` is
//! copied into the clusters a scheduler chose for it, that is those the
//! PlacementDecision slices labelled `multicluster.x-k8s.io/placement-key=<key>`
//! in its namespace list (ClusterProfiles, engaged by the ClusterProfile
//! provider with their consumer Secrets). A cluster added to the decision
//! gets its copy; one removed from it (or whose slice is deleted) loses it
//! after a few seconds' grace, so a cluster that moves from one slice to
//! another keeps its copy; every cluster loses it when the hub object is
//! deleted or loses its annotation. The hub object's
//! `fleet.example/placement-status` annotation says how each chosen
//! cluster is doing (`InSync`, `Pending`, `NotEngaged`, ...).
//!
//! `multicluster_propagation::Propagation` does the work; this example is
//! its policy and `placement::Placements` as the choice of members.

use std::sync::Arc;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_example_configmap_sync::{
    ClientArgs, MainError, ManagerArgs, PolicyArgs, TraceArgs, hub_copy,
};
use multicluster_propagation::{Desired, Propagation};
use multicluster_provider_cluster_inventory_api::placement::{DecisionKey, Placements};
use multicluster_provider_cluster_inventory_api::{ClusterProfileOptions, ClusterProfileProvider};
use multicluster_runtime::{Cluster, Manager};

/// The annotation naming the placement a hub ConfigMap follows.
const PLACEMENT_ANNOTATION: &str = "fleet.example/placement";
/// The annotation reporting each chosen cluster's state.
const STATUS_ANNOTATION: &str = "fleet.example/placement-status";

/// Propagate annotated hub ConfigMaps to the clusters their placement chose.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Credentials from Secrets labelled x-k8s.io/cluster-inventory-consumer=<CONSUMER>.
    #[arg(long, env = "CONSUMER")]
    consumer: String,
    /// Namespace of the ClusterProfiles in the hub; every namespace when unset.
    #[arg(long, env = "NAMESPACE")]
    namespace: Option<String>,
    #[command(flatten)]
    manager: ManagerArgs,
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    #[command(flatten)]
    traces: TraceArgs,
}

/// The decision a hub object follows, if it is annotated.
fn key_of(object: &ConfigMap) -> Option<DecisionKey> {
    let placement = object
        .metadata
        .annotations
        .as_ref()?
        .get(PLACEMENT_ANNOTATION)?;
    Some(DecisionKey::Placement(placement.clone()))
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    let _traces =
        multicluster_example_configmap_sync::init_logging(&args.traces, env!("CARGO_PKG_NAME"))?;

    // The hub: the ClusterProfiles, their Secrets, the PlacementDecisions
    // and the objects to propagate.
    let hub = Cluster::local(kube::Client::try_default().await?);
    let mut options = ClusterProfileOptions::with_secrets(args.consumer);
    options.namespace = args.namespace;
    options.members = args.client.options().into();
    options.kubeconfig_policy = args.policy.policy()?;
    let provider = Arc::new(ClusterProfileProvider::new(hub.client(), options));
    let (manager, _replica) = args.manager.builder(hub.clone())?;
    let manager: Manager = manager.provider(provider).build();

    // The decisions, read from the hub's cache (the watch `reselect_on`
    // starts below).
    let placements = Placements::new(&hub).await?;
    let chosen = {
        let placements = placements.clone();
        move |object: &ConfigMap| {
            key_of(object)
                .map(|key| placements.clusters(object.metadata.namespace.as_deref(), &key))
                .unwrap_or_default()
        }
    };
    let propagation = Propagation::<ConfigMap>::new("placement-propagation")
        .select(|object| key_of(object).is_some())
        .members_chosen_by(chosen)
        // A decision's change decides its hub objects' members again.
        .reselect_on(
            placements.resource(),
            placements.on_decision::<ConfigMap>(key_of),
        )
        .propagates::<ConfigMap>()
        .desired(|hub, _member| Ok(vec![Desired::new(&hub_copy(hub))?]))
        .status_annotation(STATUS_ANNOTATION)
        .configure(|controller| controller.max_concurrent_reconciles(8))
        .build()?;

    manager.add_controller(propagation)?;
    tracing::info!("propagating by placement; Ctrl-C stops");
    manager.run_until_signal().await?;
    Ok(())
}
