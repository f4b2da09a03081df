//! A controller over a fleet of three real control planes, engaged through a
//! minimal provider: reconciles for existing, new, updated and deleted objects
//! on each cluster, owner-reference triggers, per-cluster index queries,
//! clusters added after start, removal, and re-engagement with new
//! credentials.

mod common;

use multicluster_runtime::testing::Polled;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Resource;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::controller::{Action, Controller, Watch};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::testing::wait_for_fleet;
use multicluster_runtime::{Cluster, ClusterName, Manager, Provider};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TestError(String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_reconciles_across_a_changing_fleet() {
    let (a, b, c) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (a, b, c) = (a.expect("a"), b.expect("b"), c.expect("c"));
    for cp in [&a, &b, &c] {
        create_config_map(cp, "existing", &[("color", "blue")]).await;
    }

    let provider = Arc::new(TestProvider::default());
    provider
        .clusters
        .add("a", cluster_for("a", &a).await)
        .expect("add a");
    provider
        .clusters
        .add("b", cluster_for("b", &b).await)
        .expect("add b");
    provider
        .clusters
        .add("c", cluster_for("c", &c).await)
        .expect("add c");
    provider
        .index_field(FieldIndex::new::<ConfigMap>(
            "data.color",
            |cm: &ConfigMap| {
                cm.data
                    .as_ref()
                    .and_then(|d| d.get("color").cloned())
                    .into_iter()
                    .collect()
            },
        ))
        .await
        .expect("index");

    let local = cluster_for("local", &a).await;
    let manager = Manager::builder(local).provider(provider.clone()).build();
    let recorder = Recorder::default();
    let seen = recorder.clone();
    let controller = Controller::builder("config-maps")
        .for_resource(Watch::<ConfigMap>::new())
        .owns(Watch::<Secret>::new())
        .max_concurrent_reconciles(4)
        .build(move |request, cluster: Cluster| {
            let seen = seen.clone();
            async move {
                // The handle is for the request's cluster: its cache answers.
                cluster
                    .cache()
                    .get::<ConfigMap>(request.namespace.as_deref(), &request.name)
                    .await
                    .map_err(|err| TestError(err.to_string()))?;
                seen.record(&request);
                Ok::<_, TestError>(Action::await_change())
            }
        })
        .expect("controller");
    manager
        .add_controller(controller.clone())
        .expect("add controller");
    let (shutdown, task) = run_manager(&manager);

    // Existing objects, on every cluster.
    for cluster in ["a", "b", "c"] {
        recorder.wait_for_more(&req(cluster, "existing"), 0).await;
    }
    // The local cluster is not part of the fleet sources.
    assert_eq!(recorder.for_cluster(""), 0);

    // New, updated and deleted objects, on every cluster.
    for (name, cp) in [("a", &a), ("b", &b), ("c", &c)] {
        create_config_map(cp, "new", &[("color", "red")]).await;
        recorder.wait_for_more(&req(name, "new"), 0).await;

        let before = recorder.count(&req(name, "new"));
        let api = Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default");
        api.patch(
            "new",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"color": "green"}})),
        )
        .await
        .expect("update");
        recorder.wait_for_more(&req(name, "new"), before).await;

        let before = recorder.count(&req(name, "new"));
        api.delete("new", &DeleteParams::default())
            .await
            .expect("delete");
        recorder.wait_for_more(&req(name, "new"), before).await;
    }

    // Owner references: a change to an owned Secret reconciles its owner.
    let owner_api = Api::<ConfigMap>::namespaced(b.client().await.expect("client"), "default");
    let owner = owner_api.get("existing").await.expect("owner");
    let before = recorder.count(&req("b", "existing"));
    Api::<Secret>::namespaced(b.client().await.expect("client"), "default")
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("owned".into()),
                    owner_references: Some(vec![
                        owner.controller_owner_ref(&()).expect("owner ref"),
                    ]),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            },
        )
        .await
        .expect("owned secret");
    recorder.wait_for_more(&req("b", "existing"), before).await;
    assert_eq!(
        recorder.count(&req("b", "owned")),
        0,
        "the owned object itself is not a primary"
    );

    // Index queries answer per cluster.
    create_config_map(&a, "also-blue", &[("color", "blue")]).await;
    let cluster_a = provider.get(&ClusterName::from("a")).await.expect("a");
    let cluster_c = provider.get(&ClusterName::from("c")).await.expect("c");
    // A cache tells the controllers watching it of new objects, not a
    // reader of its index.
    eventually(
        Polled::Unsignalled,
        "both blue objects in a's index",
        || {
            let cluster_a = cluster_a.clone();
            async move {
                let blue = cluster_a
                    .cache()
                    .by_index::<ConfigMap>("data.color", "blue", Some("default"))
                    .await
                    .expect("query");
                blue.len() == 2
            }
        },
    )
    .await;
    let blue_in_c = cluster_c
        .cache()
        .by_index::<ConfigMap>("data.color", "blue", None)
        .await
        .expect("query");
    assert_eq!(
        blue_in_c
            .iter()
            .map(|cm| cm.metadata.name.clone().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["existing"]
    );

    // A cluster added after start is picked up, with the stored index.
    provider
        .clusters
        .add("late", cluster_for("late", &c).await)
        .expect("add late");
    recorder.wait_for_more(&req("late", "existing"), 0).await;
    let late = provider
        .get(&ClusterName::from("late"))
        .await
        .expect("late");
    assert_eq!(
        late.cache()
            .by_index::<ConfigMap>("data.color", "blue", None)
            .await
            .expect("query")
            .len(),
        1
    );

    // Removing a cluster stops its work: after removal an object created in
    // b is never reconciled, while one created later in a is.
    assert!(provider.clusters.remove(&ClusterName::from("b")));
    wait_until_left(&manager, "b").await;
    // The controller lets go of b after the fleet did, and tells no one.
    eventually(Polled::Unsignalled, "b to leave the controller", || async {
        !controller
            .engaged_clusters()
            .contains(&ClusterName::from("b"))
    })
    .await;
    create_config_map(&b, "after-removal", &[]).await;
    create_config_map(&a, "marker", &[]).await;
    recorder.wait_for_more(&req("a", "marker"), 0).await;
    assert_eq!(recorder.count(&req("b", "after-removal")), 0);

    // Re-engaging c with a new instance and new credentials (a service
    // account instead of the admin certificate) resumes its work.
    let token_kubeconfig = c
        .service_account_kubeconfig("fleet", "reconciler", Duration::from_secs(3600))
        .await
        .expect("service account");
    c.bind_cluster_role("cluster-admin", "fleet", "reconciler")
        .await
        .expect("binding");
    let rotated = Cluster::new(
        "c",
        multicluster_envtest::client_for(&token_kubeconfig)
            .await
            .expect("client"),
    );
    assert!(
        provider
            .clusters
            .add_or_replace("c", rotated.clone(), "service-account")
    );
    assert!(
        !provider
            .clusters
            .add_or_replace("c", rotated.clone(), "service-account")
    );
    wait_for_fleet(&manager, "c ready again", || {
        manager
            .cluster_states()
            .iter()
            .any(|(name, status)| name.as_str() == "c" && status.state == ClusterState::Ready)
    })
    .await;
    create_config_map(&c, "after-rotation", &[]).await;
    recorder.wait_for_more(&req("c", "after-rotation"), 0).await;
    assert!(
        provider
            .get(&ClusterName::from("c"))
            .await
            .expect("c")
            .same_instance(&rotated)
    );

    let metrics = manager.metrics().encode();
    assert!(metrics.contains("mcr_engaged_clusters"), "{metrics}");
    assert!(
        metrics.contains("controller_runtime_reconcile_total"),
        "{metrics}"
    );

    shutdown.cancel();
    task.await
        .expect("manager task")
        .expect("manager stops cleanly");
}
