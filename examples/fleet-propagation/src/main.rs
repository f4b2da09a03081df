//! Propagation across a fleet: every ConfigMap on the hub (the cluster
//! `$KUBECONFIG` points at) labelled `fleet.example/propagate=true` is
//! copied into every member cluster (one per kubeconfig Secret), kept equal
//! to the hub's, made in members that join later, and removed from every
//! member when it is deleted on the hub or unlabelled (a finalizer holds
//! the hub object until then). The hub object's `fleet.example/members-in-sync`
//! annotation says in how many members its copy is current.
//!
//! The controller shows the two fleet patterns: hub → members
//! (`map::to_every_member`, one request per member, so a slow member holds
//! up only its own copy) and members → hub (`map::to_owner`, from the
//! owner annotations each copy carries).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use multicluster_example_configmap_sync::{
    ClientArgs, MainError, ManagerArgs, PolicyArgs, put_member_copy, remove_member_copy,
};
use multicluster_provider_kubeconfig::{KubeconfigOptions, KubeconfigProvider};
use multicluster_runtime::controller::{
    Action, ClusterSelector, Controller, Request, Watch, filters, finalizer, map,
};
use multicluster_runtime::{Cluster, ClusterName, Manager};
use serde_json::json;

/// The label that marks a hub ConfigMap to propagate.
const PROPAGATE_LABEL: &str = "fleet.example/propagate";
/// The annotation counting the members whose copy is current.
const IN_SYNC_ANNOTATION: &str = "fleet.example/members-in-sync";
/// Held on a propagated hub object until its copies are gone.
const FINALIZER: &str = "fleet.example/copies";
/// The field manager of the copies and of our changes to the hub object.
const MANAGER: &str = "fleet-propagation";

/// Propagate labelled hub ConfigMaps to every member cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Namespace of the members' kubeconfig Secrets on the hub; every namespace when unset.
    #[arg(long, env = "NAMESPACE")]
    namespace: Option<String>,
    #[command(flatten)]
    manager: ManagerArgs,
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    policy: PolicyArgs,
}

/// What every reconcile shares.
struct Context {
    hub: Cluster,
    /// The controller itself, to read the members' caches.
    controller: OnceLock<Controller>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn propagated(object: &ConfigMap) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(PROPAGATE_LABEL))
        .is_some_and(|value| value == "true")
}

async fn reconcile(
    request: Request,
    cluster: Cluster,
    context: Arc<Context>,
) -> Result<Action, BoxError> {
    let namespace = request.namespace.clone().unwrap_or_default();
    let source = context
        .hub
        .cache()
        .get::<ConfigMap>(Some(&namespace), &request.name)
        .await?;
    if request.cluster.is_local() {
        return match source {
            Some(source) => reconcile_hub(source, &request, &context).await,
            None => Ok(Action::await_change()),
        };
    }
    let owner = Request::new(
        ClusterName::local(),
        Some(&namespace),
        request.name.as_str(),
    );
    let wanted = source.filter(|s| propagated(s) && s.metadata.deletion_timestamp.is_none());
    match wanted {
        Some(source) => put_member_copy(&cluster, &owner, source.data.as_ref(), MANAGER).await?,
        // Only the copy this hub object made is removed.
        None => remove_member_copy(&cluster, &owner).await?,
    }
    Ok(Action::await_change())
}

/// The hub object: its finalizer, its count of members in sync (told as
/// an Event on it when it changes), and, once it is being deleted or no
/// longer labelled, the removal of every copy before the finalizer goes.
async fn reconcile_hub(
    source: Arc<ConfigMap>,
    request: &Request,
    context: &Context,
) -> Result<Action, BoxError> {
    let Some(controller) = context.controller.get() else {
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let owner = request.clone();
    let ours = |copy: &ConfigMap| map::owner_of(copy).as_ref() == Some(&owner);
    let namespace = request.namespace.as_deref();
    if !propagated(&source) {
        finalizer::delete_from_members(controller, namespace, &request.name, ours).await?;
        finalizer::release(&context.hub, FINALIZER, source.as_ref()).await?;
        return Ok(Action::await_change());
    }
    let action = finalizer::finalizer(&context.hub, FINALIZER, source, |event| async {
        match event {
            finalizer::Event::Apply(source) => {
                count_in_sync(&source, request, context, controller).await
            }
            // Held until no member has a copy; retried with backoff, and at
            // once when a copy goes (mapped to its owner).
            finalizer::Event::Cleanup(_) => {
                finalizer::delete_from_members(controller, namespace, &request.name, ours).await?;
                Ok(Action::await_change())
            }
        }
    })
    .await?;
    Ok(action)
}

/// Writes how many members hold a current copy on the hub object, and
/// tells in an Event on it, when that changes, whether every member is
/// current.
async fn count_in_sync(
    source: &ConfigMap,
    request: &Request,
    context: &Context,
    controller: &Controller,
) -> Result<Action, BoxError> {
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let members: Vec<Cluster> = controller
        .engaged_clusters()
        .into_iter()
        .filter(|name| !name.is_local())
        .filter_map(|name| controller.cluster(&name))
        .collect();
    let in_sync = members
        .iter()
        .filter(|member| {
            member
                .cache()
                .informer::<ConfigMap>()
                .get(Some(namespace), &request.name)
                .is_some_and(|copy| copy.data == source.data)
        })
        .count();
    let current = source
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IN_SYNC_ANNOTATION));
    if current != Some(&in_sync.to_string()) {
        let patch = json!({"metadata": {"annotations": {IN_SYNC_ANNOTATION: in_sync.to_string()}}});
        Api::<ConfigMap>::namespaced(context.hub.client(), namespace)
            .patch(&request.name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        // The recorder counts a repeated Event (same reason) as a series
        // and keeps its first note, so the note must not carry the count.
        let (reason, note) = if in_sync == members.len() {
            ("InSync", "the copy is current in every member")
        } else {
            ("Propagating", "the copy is not yet current in every member")
        };
        let event = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Propagate".into(),
            secondary: None,
        };
        context
            .hub
            .recorder(MANAGER)
            .publish(&event, &source.object_ref(&()))
            .await?;
    }
    // Recounted on events: a copy's change in a member, a member joining
    // (its copies are made) or leaving (`owed_on_disengage`).
    Ok(Action::await_change())
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    multicluster_example_configmap_sync::init_logging();

    // The hub: where the objects to propagate and the members' Secrets live.
    let hub = Cluster::new("hub", kube::Client::try_default().await?);
    // The members: one per kubeconfig Secret.
    let provider = Arc::new(KubeconfigProvider::new(
        hub.client(),
        KubeconfigOptions::default()
            .namespace(args.namespace)
            .members(args.client.options())
            .kubeconfig_policy(args.policy.policy()?),
    ));
    let mut manager = Manager::builder(hub.clone())
        .provider(provider)
        .options(args.manager.options());
    if let Some(election) = args.manager.leader_election(&hub)? {
        manager = manager.coordinator(Arc::new(election));
    }
    let manager = manager.build();

    let context = Arc::new(Context {
        hub,
        controller: OnceLock::new(),
    });
    let labelled = || filters::labels([(PROPAGATE_LABEL.to_string(), "true".to_string())].into());
    let controller = Controller::builder("fleet-propagation")
        // The hub object itself: finalizer, count, clean-up.
        .for_resource(
            Watch::<ConfigMap>::new()
                .clusters(ClusterSelector::Local)
                .filter(labelled()),
        )
        // Hub → members: a change on the hub is a request in every member.
        .watches(
            Watch::<ConfigMap>::new()
                .clusters(ClusterSelector::Local)
                .filter(labelled()),
            map::to_every_member(),
        )
        // A copy changed or deleted in a member: put it right, and recount
        // on the hub.
        .watches(Watch::<ConfigMap>::new(), |context, copy: &ConfigMap| {
            let mut requests: Vec<Request> = map::owner_of(copy).into_iter().collect();
            if let Some(owner) = requests.first().cloned() {
                requests.push(Request::new(
                    context.cluster().clone(),
                    owner.namespace.as_deref(),
                    owner.name,
                ));
            }
            requests
        })
        // A member that joins gets every propagated hub object; one that
        // leaves makes every hub object count again.
        .owed_on_engage(map::local_objects::<ConfigMap>(propagated))
        .owed_on_disengage(map::local_requests::<ConfigMap>(propagated))
        // A failed reconcile says why on its object, in that object's cluster.
        .warning_events(MANAGER)
        .max_concurrent_reconciles(8)
        .build_with_context(context.clone(), reconcile)?;
    let _ = context.controller.set(controller.clone());

    manager.add_controller(controller)?;
    tracing::info!("propagating; Ctrl-C stops");
    manager.run_until_signal().await?;
    Ok(())
}
