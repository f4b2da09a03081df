//! Propagation by placement: a ConfigMap on the hub (the cluster
//! `$KUBECONFIG` points at) annotated `fleet.example/placement=<key>` is
//! copied into the clusters a scheduler chose for it, that is those the
//! PlacementDecision slices labelled `multicluster.x-k8s.io/placement-key=<key>`
//! in its namespace list (ClusterProfiles, engaged by the ClusterProfile
//! provider with their consumer Secrets). A cluster added to the decision
//! gets its copy, one removed from it (or whose slice is deleted) loses
//! it, and so does every cluster when the hub object is deleted or loses
//! its annotation. The hub object's `fleet.example/placement-status`
//! annotation says, per chosen cluster, whether its copy is `in-sync`,
//! `pending` or the cluster `not-engaged`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use multicluster_example_configmap_sync::{
    ClientArgs, MainError, ManagerArgs, PolicyArgs, put_member_copy, remove_member_copy,
};
use multicluster_provider_cluster_inventory_api::placement::{DecisionKey, Placements};
use multicluster_provider_cluster_inventory_api::{ClusterProfileOptions, ClusterProfileProvider};
use multicluster_runtime::controller::{
    Action, ClusterSelector, Controller, MapContext, Request, Watch, map,
};
use multicluster_runtime::{Cluster, ClusterName, Manager};
use serde_json::json;

/// The annotation naming the placement a hub ConfigMap follows.
const PLACEMENT_ANNOTATION: &str = "fleet.example/placement";
/// The annotation reporting each chosen cluster's state.
const STATUS_ANNOTATION: &str = "fleet.example/placement-status";
/// The field manager of the copies and of our changes to the hub object.
const MANAGER: &str = "placement-propagation";

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
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What every reconcile shares.
struct Context {
    hub: Cluster,
    placements: Placements,
    /// The controller itself, to read the members' caches.
    controller: OnceLock<Controller>,
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

async fn reconcile(
    request: Request,
    cluster: Cluster,
    context: Arc<Context>,
) -> Result<Action, BoxError> {
    let namespace = request.namespace.as_deref();
    let source = context
        .hub
        .cache()
        .get::<ConfigMap>(namespace, &request.name)
        .await?;
    if request.cluster.is_local() {
        return match source {
            Some(source) => report(&source, &request, &context).await,
            None => Ok(Action::await_change()),
        };
    }
    let owner = Request::new(ClusterName::local(), namespace, request.name.as_str());
    let wanted = source.filter(|source| {
        key_of(source).is_some_and(|key| context.placements.chosen(namespace, &key, cluster.name()))
    });
    match wanted {
        Some(source) => put_member_copy(&cluster, &owner, source.data.as_ref(), MANAGER).await?,
        None => remove_member_copy(&cluster, &owner).await?,
    }
    Ok(Action::await_change())
}

/// Writes each chosen cluster's state on the hub object, when it changed.
async fn report(
    source: &ConfigMap,
    request: &Request,
    context: &Context,
) -> Result<Action, BoxError> {
    let Some(controller) = context.controller.get() else {
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let namespace = request.namespace.as_deref();
    let hub_objects =
        Api::<ConfigMap>::namespaced(context.hub.client(), namespace.unwrap_or_default());
    let current = source
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(STATUS_ANNOTATION));
    let Some(key) = key_of(source) else {
        // Not placed (any more): no report.
        if current.is_some() {
            let patch = json!({"metadata": {"annotations": {STATUS_ANNOTATION: null}}});
            hub_objects
                .patch(&request.name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        return Ok(Action::await_change());
    };
    let chosen = context.placements.clusters(namespace, &key);
    let states: BTreeMap<String, &str> = chosen
        .into_iter()
        .map(|name| {
            let state = match controller.cluster(&name) {
                None => "not-engaged",
                Some(member) => {
                    let copy = member
                        .cache()
                        .informer::<ConfigMap>()
                        .get(namespace, &request.name);
                    if copy.is_some_and(|copy| copy.data == source.data) {
                        "in-sync"
                    } else {
                        "pending"
                    }
                }
            };
            (name.to_string(), state)
        })
        .collect();
    let report = serde_json::to_string(&states)?;
    if current != Some(&report) {
        let patch = json!({"metadata": {"annotations": {STATUS_ANNOTATION: report}}});
        hub_objects
            .patch(&request.name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    // Reported again on events: a copy changing, a decision changing, a
    // cluster joining or leaving.
    Ok(Action::await_change())
}

/// Each request in a member, and the hub object it is for (to report on).
fn with_hub_requests(mut requests: Vec<Request>) -> Vec<Request> {
    let hub: Vec<Request> = requests
        .iter()
        .map(|request| {
            Request::new(
                ClusterName::local(),
                request.namespace.as_deref(),
                request.name.as_str(),
            )
        })
        .collect();
    requests.extend(hub);
    requests
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    multicluster_example_configmap_sync::init_logging();

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

    // The decisions, read from the hub's cache (the same watch the
    // controller's source below starts).
    let placements = Placements::new(hub.cache().clone());
    let context = Arc::new(Context {
        hub,
        placements: placements.clone(),
        controller: OnceLock::new(),
    });
    let on_decision = placements.on_decision::<ConfigMap>(key_of);
    let placed = placements.to_placed_clusters::<ConfigMap>(key_of);
    let every_member = map::to_every_member::<ConfigMap>();
    let owed = placements.owed::<ConfigMap>(key_of);
    let controller = Controller::builder("placement-propagation")
        // The hub object: its report.
        .for_resource(Watch::<ConfigMap>::new().clusters(ClusterSelector::Local))
        // Hub → the chosen clusters; an object that lost its annotation →
        // every member, to remove its copies.
        .watches(
            Watch::<ConfigMap>::new().clusters(ClusterSelector::Local),
            move |context: &MapContext<'_>, object: &ConfigMap| match key_of(object) {
                Some(_) => placed(context, object),
                None => every_member(context, object),
            },
        )
        // A decision changed: its clusters, old and new, and a new report.
        .watches_dynamic(
            Placements::resource(),
            Watch::new().clusters(ClusterSelector::Local),
            move |context: &MapContext<'_>, slice: &DynamicObject| {
                with_hub_requests(on_decision(context, slice))
            },
        )
        // A copy changed or deleted in a member: put it right, report.
        .watches(Watch::<ConfigMap>::new(), |context, copy: &ConfigMap| {
            map::owner_of(copy)
                .map(|owner| {
                    with_hub_requests(vec![Request::new(
                        context.cluster().clone(),
                        owner.namespace.as_deref(),
                        owner.name,
                    )])
                })
                .unwrap_or_default()
        })
        // A cluster that joins gets the objects placed on it; one that
        // leaves is reported as not engaged.
        .owed_on_engage(move |cluster, controller| with_hub_requests(owed(cluster, controller)))
        .owed_on_disengage(map::local_requests::<ConfigMap>(|object| {
            key_of(object).is_some()
        }))
        .warning_events(MANAGER)
        .max_concurrent_reconciles(8)
        .build_with_context(context.clone(), reconcile)?;
    let _ = context.controller.set(controller.clone());

    manager.add_controller(controller)?;
    tracing::info!("propagating by placement; Ctrl-C stops");
    manager.run_until_signal().await?;
    Ok(())
}
