//! Cross-cluster requests on real control planes: a hub object (in the
//! local cluster) is propagated to every member, follows its changes,
//! reaches a member that joins later without a hub event, is restored in a
//! member where it was deleted, and is removed from every member when it
//! is deleted on the hub; the hub object counts the members in sync, from
//! the members' own events mapped back to it.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::controller::{
    Action, ClusterScope, Controller, Request, Watch, filters, map,
};
use multicluster_runtime::{Cluster, ClusterName, Manager};
use serde_json::json;

const LABEL: &str = "example.com/propagate";
const IN_SYNC: &str = "example.com/members-in-sync";

fn propagated(object: &ConfigMap) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL))
        .is_some_and(|value| value == "true")
}

/// Propagates labelled hub ConfigMaps and counts, on each, the members
/// whose copy has its data.
fn propagation(hub: Cluster) -> Controller {
    let this: Arc<OnceLock<Controller>> = Arc::new(OnceLock::new());
    let handle = this.clone();
    let controller = Controller::builder("propagation")
        .watches(
            Watch::<ConfigMap>::new()
                .clusters(ClusterScope::Local)
                .filter(filters::labels(
                    [(LABEL.to_string(), "true".to_string())].into(),
                )),
            map::to_every_member(),
        )
        // A copy changed (or was deleted) in a member: fix it, and recount
        // on the hub.
        .for_resource(Watch::<ConfigMap>::new())
        .watches(Watch::<ConfigMap>::new(), map::to_owner())
        .owed_on_engage(map::local_objects::<ConfigMap>(propagated))
        .max_concurrent_reconciles(4)
        .build(move |request: Request, cluster: Cluster| {
            let hub = hub.clone();
            let controller = handle.get().cloned();
            async move {
                let namespace = request.namespace.clone().unwrap_or_default();
                // Waits for the hub's first list: a member's copy is never
                // judged against a hub cache that has not been read yet.
                let source = hub
                    .cache()
                    .get::<ConfigMap>(Some(&namespace), &request.name)
                    .await?
                    .filter(|source| propagated(source));
                if request.cluster.is_local() {
                    let (Some(source), Some(controller)) = (source, controller) else {
                        return Ok(Action::await_change());
                    };
                    count_in_sync(&hub, &controller, &source, &request).await?;
                    return Ok(Action::await_change());
                }
                let copies = Api::<ConfigMap>::namespaced(cluster.client(), &namespace);
                match source {
                    Some(source) => {
                        let owner = Request::new(
                            ClusterName::local(),
                            Some(&namespace),
                            request.name.as_str(),
                        );
                        let copy = json!({
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {
                                "name": request.name,
                                "annotations": owner.owner_annotations(),
                            },
                            "data": source.data,
                        });
                        copies
                            .patch(
                                &request.name,
                                &PatchParams::apply("propagation").force(),
                                &Patch::Apply(copy),
                            )
                            .await?;
                    }
                    None => {
                        let ours = cluster
                            .cache()
                            .informer::<ConfigMap>()
                            .get(Some(&namespace), &request.name)
                            .and_then(|copy| Request::owner_of(copy.as_ref()))
                            .is_some();
                        if ours {
                            copies
                                .delete(&request.name, &DeleteParams::default())
                                .await?;
                        }
                    }
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Action::await_change())
            }
        })
        .expect("controller");
    let _ = this.set(controller.clone());
    controller
}

/// Writes on the hub object how many engaged members hold a copy with its
/// data.
async fn count_in_sync(
    hub: &Cluster,
    controller: &Controller,
    source: &ConfigMap,
    request: &Request,
) -> Result<(), kube::Error> {
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let in_sync = controller
        .engaged_clusters()
        .into_iter()
        .filter(|name| !name.is_local())
        .filter_map(|name| controller.cluster(&name))
        .filter(|member| {
            member
                .cache()
                .informer::<ConfigMap>()
                .get(Some(namespace), &request.name)
                .is_some_and(|copy| copy.data == source.data)
        })
        .count();
    let patch = json!({"metadata": {"annotations": {IN_SYNC: in_sync.to_string()}}});
    Api::<ConfigMap>::namespaced(hub.client(), namespace)
        .patch(&request.name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

async fn copy_data(member: &ControlPlane, name: &str) -> Option<BTreeMap<String, String>> {
    Api::<ConfigMap>::namespaced(member.client().await.ok()?, "default")
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|copy| copy.data.unwrap_or_default())
}

/// Waits, watching it, until the member's copy `name` holds `v` = `value`
/// (`None`: until it is gone).
async fn until_copy(member: &ControlPlane, name: &str, value: Option<&str>, what: &str) {
    let copies = Api::<ConfigMap>::namespaced(member.client().await.expect("client"), "default");
    let wanted = value.and_then(data);
    multicluster_runtime::testing::wait_for_object(&copies, name, what, |copy| {
        copy.map(|copy| copy.data.clone().unwrap_or_default()) == wanted
    })
    .await;
}

/// Waits, watching it, until the hub object `name` counts `members` in sync.
async fn until_in_sync(hub: &kube::Client, name: &str, members: &str, what: &str) {
    let objects = Api::<ConfigMap>::namespaced(hub.clone(), "default");
    multicluster_runtime::testing::wait_for_object(&objects, name, what, |object| {
        object
            .and_then(|object| object.metadata.annotations.as_ref()?.get(IN_SYNC))
            .is_some_and(|counted| counted == members)
    })
    .await;
}

fn data(value: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([("v".to_string(), value.to_string())]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_object_reaches_every_member_including_one_that_joins_later() {
    let (hub_cp, m1, m2) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub_cp, m1, m2) = (hub_cp.expect("hub"), m1.expect("m1"), m2.expect("m2"));
    let hub = cluster_for("hub", &hub_cp).await;
    let hub_client = hub.client();
    let provider = TestProvider::default();
    provider
        .clusters
        .add("m1", cluster_for("m1", &m1).await)
        .expect("add");
    let manager = Manager::builder(hub.clone())
        .provider(Arc::new(provider.clone()))
        .build();
    manager.add_controller(propagation(hub)).expect("add");
    let (stop, task) = run_manager(&manager);

    let hub_configmaps = Api::<ConfigMap>::namespaced(hub_client.clone(), "default");
    let mut source = config_map("shared", &[("v", "1")]);
    source.metadata.labels = Some([(LABEL.to_string(), "true".to_string())].into());
    hub_configmaps
        .create(&PostParams::default(), &source)
        .await
        .expect("hub object");
    // Not labelled: stays on the hub.
    hub_configmaps
        .create(
            &PostParams::default(),
            &config_map("private", &[("v", "1")]),
        )
        .await
        .expect("hub object");

    until_copy(&m1, "shared", Some("1"), "the copy in m1").await;
    until_in_sync(&hub_client, "shared", "1", "the hub to count m1").await;

    let update = json!({"data": {"v": "2"}});
    hub_configmaps
        .patch("shared", &PatchParams::default(), &Patch::Merge(update))
        .await
        .expect("update");
    until_copy(&m1, "shared", Some("2"), "m1 to follow the update").await;

    // m2 joins; nothing changes on the hub.
    provider
        .clusters
        .add("m2", cluster_for("m2", &m2).await)
        .expect("add");
    until_copy(&m2, "shared", Some("2"), "the copy in m2").await;
    until_in_sync(&hub_client, "shared", "2", "the hub to count both members").await;
    assert_eq!(
        copy_data(&m2, "private").await,
        None,
        "an unlabelled hub object was propagated"
    );

    // A copy deleted in a member comes back.
    Api::<ConfigMap>::namespaced(m1.client().await.expect("client"), "default")
        .delete("shared", &DeleteParams::default())
        .await
        .expect("delete copy");
    until_copy(&m1, "shared", Some("2"), "the copy in m1 to be restored").await;

    // Deleted on the hub: gone from every member.
    hub_configmaps
        .delete("shared", &DeleteParams::default())
        .await
        .expect("delete");
    until_copy(&m1, "shared", None, "m1's copy to be removed").await;
    until_copy(&m2, "shared", None, "m2's copy to be removed").await;

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
