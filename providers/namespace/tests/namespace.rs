//! Namespaces of a real host cluster as virtual clusters: reconciles, writes
//! and every patch type through the scoped client, watches, index queries,
//! namespaces created and deleted while running, and refusals.

use multicluster_runtime::testing::Polled;
use multicluster_runtime::testing::wait_for_fleet_async;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use multicluster_envtest::ControlPlane;
use multicluster_provider_namespace::{
    NamespaceOptions, NamespaceProvider, SYSTEM_NAMESPACES, WATCH_FILTER_LABEL,
    without_system_namespaces,
};
use multicluster_runtime::cache::{CacheOptions, FieldIndex};
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::testing::wait_for_fleet;
use multicluster_runtime::testing::{
    Recorder, eventually, recording_manager_from, run_manager, wait_until_left,
};
use multicluster_runtime::{Cluster, ClusterName, Manager, Provider};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ReconcileError(String);

async fn create_namespace(client: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    labels: Some(
                        labels
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .expect("namespace");
}

async fn create_config_map(client: &kube::Client, namespace: &str, name: &str, color: &str) {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some([("color".to_string(), color.to_string())].into());
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .expect("config map");
}

fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

fn color(cm: &ConfigMap) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get("color").cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_clusters_with_scoped_clients_and_caches() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    for ns in ["team-a", "team-b", "team-c"] {
        create_namespace(&admin, ns, &[]).await;
        create_config_map(&admin, ns, "existing", "blue").await;
    }

    let provider = Arc::new(NamespaceProvider::new(
        admin.clone(),
        NamespaceOptions::default(),
    ));
    let host = provider.host().clone();
    provider
        .index_field(FieldIndex::new::<ConfigMap>(
            "data.color",
            |cm: &ConfigMap| color(cm).into_iter().collect(),
        ))
        .await
        .expect("index");
    let manager = Manager::builder(host.clone())
        .provider(provider.clone())
        .build();
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("copy")
            .for_resource(Watch::<ConfigMap>::new())
            .max_concurrent_reconciles(2)
            .build(move |request, cluster: Cluster| {
                let recorder = recorder.clone();
                async move {
                    if request.name.starts_with("copy-") {
                        return Ok(Action::await_change());
                    }
                    recorder.record(&request);
                    let namespace = request.namespace.clone().unwrap_or_default();
                    let Some(source) = cluster
                        .cache()
                        .get::<ConfigMap>(Some(&namespace), &request.name)
                        .await
                        .map_err(|err| ReconcileError(err.to_string()))?
                    else {
                        return Ok(Action::await_change());
                    };
                    // Through the virtual client: server-side apply in "default".
                    let copy = serde_json::json!({
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": format!("copy-{}", request.name), "namespace": "default"},
                        "data": source.data,
                    });
                    Api::<ConfigMap>::namespaced(cluster.client(), "default")
                        .patch(
                            &format!("copy-{}", request.name),
                            &PatchParams::apply("namespace-test").force(),
                            &Patch::Apply(copy),
                        )
                        .await
                        .map_err(|err| ReconcileError(err.to_string()))?;
                    Ok::<_, ReconcileError>(Action::await_change())
                }
            })
            .expect("controller")
    };
    manager.add_controller(controller).expect("add");
    let (shutdown, task) = run_manager(&manager);

    // Existing objects in every namespace, written back into the right one.
    for ns in ["team-a", "team-b", "team-c"] {
        recorder.wait_for_more(&req(ns, "existing"), 0).await;
        let copies = Api::<ConfigMap>::namespaced(admin.clone(), ns);
        eventually(Polled::ApiServer, &format!("the copy in {ns}"), || {
            let copies = copies.clone();
            async move {
                copies
                    .get_opt("copy-existing")
                    .await
                    .ok()
                    .flatten()
                    .is_some()
            }
        })
        .await;
    }
    assert_eq!(
        recorder.for_cluster("host"),
        0,
        "the host itself is not a virtual cluster"
    );

    // A namespace created later joins; a deleted one leaves.
    create_namespace(&admin, "team-d", &[]).await;
    create_config_map(&admin, "team-d", "late", "red").await;
    recorder.wait_for_more(&req("team-d", "late"), 0).await;
    Api::<Namespace>::all(admin.clone())
        .delete("team-b", &DeleteParams::default())
        .await
        .expect("delete namespace");
    wait_until_left(&manager, "team-b").await;
    assert!(!provider.names().contains(&ClusterName::from("team-b")));

    // Reads, writes and every patch type through a virtual client.
    let team_a = provider
        .get(&ClusterName::from("team-a"))
        .await
        .expect("team-a");
    let virtual_api = Api::<ConfigMap>::namespaced(team_a.client(), "default");
    let host_api = Api::<ConfigMap>::namespaced(admin.clone(), "team-a");
    let read = virtual_api.get("existing").await.expect("get");
    assert_eq!(read.metadata.namespace.as_deref(), Some("default"));
    let listed = virtual_api.list(&Default::default()).await.expect("list");
    assert!(
        listed
            .items
            .iter()
            .all(|cm| cm.metadata.namespace.as_deref() == Some("default"))
    );
    assert!(
        listed
            .items
            .iter()
            .any(|cm| cm.metadata.name.as_deref() == Some("existing"))
    );
    let mut created = ConfigMap::default();
    created.metadata.name = Some("written".into());
    created.metadata.namespace = Some("default".into());
    let created = virtual_api
        .create(&PostParams::default(), &created)
        .await
        .expect("create");
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    assert!(
        host_api
            .get_opt("written")
            .await
            .expect("host get")
            .is_some(),
        "landed in team-a"
    );

    let patches = [
        (
            "merge",
            Patch::Merge(serde_json::json!({"data": {"merge": "yes"}})),
        ),
        (
            "json",
            Patch::Json(
                serde_json::from_value(
                    serde_json::json!([{"op": "add", "path": "/data/json", "value": "yes"}]),
                )
                .expect("json patch"),
            ),
        ),
        (
            "strategic",
            Patch::Strategic(serde_json::json!({"data": {"strategic": "yes"}})),
        ),
    ];
    for (key, patch) in &patches {
        let patched = virtual_api
            .patch("written", &PatchParams::default(), patch)
            .await
            .expect(key);
        assert_eq!(
            patched.metadata.namespace.as_deref(),
            Some("default"),
            "{key}"
        );
    }
    let applied = virtual_api
        .patch(
            "written",
            &PatchParams::apply("namespace-test"),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "written", "namespace": "default"},
                "data": {"apply": "yes"}
            })),
        )
        .await
        .expect("apply");
    assert_eq!(applied.metadata.namespace.as_deref(), Some("default"));
    let on_host = host_api.get("written").await.expect("host get");
    for key in ["merge", "json", "strategic", "apply"] {
        assert_eq!(
            on_host
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(String::as_str),
            Some("yes"),
            "{key} patch landed in the host namespace"
        );
    }

    // Watches through the virtual client come back in "default".
    let mut events = watcher(
        virtual_api.clone(),
        watcher::Config::default().fields("metadata.name=watched"),
    )
    .applied_objects()
    .boxed();
    create_config_map(&admin, "team-a", "watched", "green").await;
    let seen = tokio::time::timeout(Duration::from_secs(30), events.try_next())
        .await
        .expect("event in time")
        .expect("healthy stream")
        .expect("an object");
    assert_eq!(seen.metadata.namespace.as_deref(), Some("default"));

    // Other namespaces and cluster-scoped resources are refused, clearly.
    let other = Api::<ConfigMap>::namespaced(team_a.client(), "kube-system")
        .list(&Default::default())
        .await;
    assert!(
        matches!(&other, Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains("kube-system")),
        "{other:?}"
    );
    let namespaces = Api::<Namespace>::all(team_a.client())
        .list(&Default::default())
        .await;
    assert!(
        matches!(&namespaces, Err(kube::Error::Api(status)) if status.code == 403),
        "{namespaces:?}"
    );
    let smuggled = {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("smuggled".into());
        cm.metadata.namespace = Some("team-c".into());
        virtual_api.create(&PostParams::default(), &cm).await
    };
    assert!(
        matches!(&smuggled, Err(kube::Error::Api(status)) if status.code == 403),
        "{smuggled:?}"
    );

    // Index queries on a virtual cluster: only its objects, in "default";
    // the host cache sees all of them with their real namespaces.
    let blue_in_a = team_a
        .cache()
        .by_index::<ConfigMap>("data.color", "blue", None)
        .await
        .expect("query");
    let blue_in_a: Vec<_> = blue_in_a
        .iter()
        .map(|cm| {
            (
                cm.metadata.namespace.clone().unwrap_or_default(),
                cm.metadata.name.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        blue_in_a
            .iter()
            .all(|(ns, name)| ns == "default" && (name == "existing" || name == "copy-existing")),
        "{blue_in_a:?}"
    );
    assert!(blue_in_a.iter().any(|(_, name)| name == "existing"));
    let host_blue = host.cache().informer::<ConfigMap>().list(None);
    let host_namespaces: std::collections::BTreeSet<_> = host_blue
        .iter()
        .filter(|cm| {
            color(cm).as_deref() == Some("blue") && cm.metadata.name.as_deref() == Some("existing")
        })
        .filter_map(|cm| cm.metadata.namespace.clone())
        .collect();
    assert!(
        host_namespaces.contains("team-a") && host_namespaces.contains("team-c"),
        "{host_namespaces:?}"
    );

    // One host watch per type, however many virtual clusters.
    assert_eq!(
        host.cache().informer_count(),
        2,
        "Namespace and ConfigMap watches only"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_filter_splits_namespaces_between_instances() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    create_namespace(&admin, "mine", &[(WATCH_FILTER_LABEL, "one")]).await;
    create_namespace(&admin, "theirs", &[(WATCH_FILTER_LABEL, "two")]).await;
    create_namespace(&admin, "nobodys", &[]).await;

    let host = Cluster::new("host", admin.clone());
    let one = Arc::new(NamespaceProvider::new(
        host.client(),
        NamespaceOptions::default().watch_filter("one".to_string()),
    ));
    let manager = Manager::builder(host).provider(one.clone()).build();
    let (shutdown, task) = run_manager(&manager);
    wait_for_fleet(&manager, "the labelled namespace", || {
        one.names() == [ClusterName::from("mine")]
    })
    .await;
    // A namespace labelled later for this instance joins too.
    Api::<Namespace>::all(admin)
        .patch(
            "nobodys",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {WATCH_FILTER_LABEL: "one"}}})),
        )
        .await
        .expect("label");
    wait_for_fleet(&manager, "the newly labelled namespace", || {
        one.names() == [ClusterName::from("mine"), ClusterName::from("nobodys")]
    })
    .await;
    assert!(!one.names().contains(&ClusterName::from("theirs")));

    // An empty filter, as an empty WATCH_FILTER variable gives, takes every
    // namespace.
    let host = Cluster::new("host", cp.client().await.expect("client"));
    let all = Arc::new(NamespaceProvider::new(
        host.client(),
        NamespaceOptions::default().watch_filter(Some(String::new())),
    ));
    let everything = Manager::builder(host).provider(all.clone()).build();
    let (everything_shutdown, everything_task) = run_manager(&everything);
    wait_for_fleet(&everything, "every namespace under an empty filter", || {
        ["mine", "theirs", "nobodys", "default"]
            .iter()
            .all(|name| all.names().contains(&ClusterName::from(*name)))
    })
    .await;
    everything_shutdown.cancel();
    everything_task.await.expect("task").expect("clean stop");

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A namespace selector narrows the fleet: without the system namespaces
/// (kube-system, kube-public, kube-node-lease), and with a label of one's
/// own; a namespace relabelled out of it leaves, one relabelled into it
/// joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_selector_keeps_out_the_system_namespaces_and_others() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    create_namespace(&admin, "team-a", &[("fleet", "yes")]).await;
    create_namespace(&admin, "team-b", &[]).await;

    let host = Cluster::new("host", admin.clone());
    let mut selector = without_system_namespaces();
    let provider = Arc::new(NamespaceProvider::new(
        host.client(),
        NamespaceOptions::default().namespace_selector(selector.clone()),
    ));
    let manager = Manager::builder(host).provider(provider.clone()).build();
    let (shutdown, task) = run_manager(&manager);
    wait_for_fleet(&manager, "every namespace but the system ones", || {
        provider.names()
            == ["default", "team-a", "team-b"]
                .map(ClusterName::from)
                .to_vec()
    })
    .await;
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
    for system in SYSTEM_NAMESPACES {
        assert!(!provider.names().contains(&ClusterName::from(system)));
    }

    selector.extend([kube::core::Expression::Equal("fleet".into(), "yes".into())]);
    let host = Cluster::new("host", admin.clone());
    let labelled = Arc::new(NamespaceProvider::new(
        host.client(),
        NamespaceOptions::default().namespace_selector(selector),
    ));
    let manager = Manager::builder(host).provider(labelled.clone()).build();
    let (shutdown, task) = run_manager(&manager);
    wait_for_fleet(&manager, "the labelled namespace", || {
        labelled.names() == [ClusterName::from("team-a")]
    })
    .await;
    let relabel = |name: &'static str, value: Option<&'static str>| {
        let admin = admin.clone();
        async move {
            Api::<Namespace>::all(admin)
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"labels": {"fleet": value}}})),
                )
                .await
                .expect("label");
        }
    };
    relabel("team-a", None).await;
    relabel("team-b", Some("yes")).await;
    wait_for_fleet(&manager, "team-a to leave and team-b to join", || {
        labelled.names() == [ClusterName::from("team-b")]
    })
    .await;
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The host cache's options are every virtual cluster's: a label selector on
/// ConfigMaps keeps the unlabelled ones from every virtual cluster. A
/// namespace restriction in them is dropped (the host must see them all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_cache_options_apply_to_every_virtual_cluster() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    for ns in ["team-a", "team-b"] {
        create_namespace(&admin, ns, &[]).await;
        create_config_map(&admin, ns, "ignored", "grey").await;
    }
    let provider = Arc::new(NamespaceProvider::new(
        admin.clone(),
        NamespaceOptions::default().cache(
            CacheOptions::default()
                .namespace("team-a".to_string())
                .watcher_for::<ConfigMap>(watcher::Config::default().labels("fleet=yes")),
        ),
    ));
    let host = provider.host().clone();
    assert_eq!(host.cache().options().expect("own cache").namespace, None);
    let (manager, recorder) =
        recording_manager_from(Manager::builder(host).provider(provider.clone()));
    let (shutdown, task) = run_manager(&manager);

    for ns in ["team-a", "team-b"] {
        let mut labelled = ConfigMap::default();
        labelled.metadata.name = Some("wanted".into());
        labelled.metadata.labels = Some([("fleet".to_string(), "yes".to_string())].into());
        Api::<ConfigMap>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &labelled)
            .await
            .expect("config map");
        recorder.wait_for_more(&req(ns, "wanted"), 0).await;
    }
    // Had the selector not applied, "ignored" (created first) would be in
    // the host cache by the time "wanted" is.
    let config_maps = provider.host().cache().informer::<ConfigMap>();
    for ns in ["team-a", "team-b"] {
        assert!(config_maps.get(Some(ns), "wanted").is_some(), "{ns}");
        assert!(config_maps.get(Some(ns), "ignored").is_none(), "{ns}");
        assert_eq!(recorder.count(&req(ns, "ignored")), 0, "{ns}");
    }

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Two CRDs of one group/version; the second is installed after the first
/// was used through a virtual cluster.
fn crd(plural: &str, kind: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.fleet.example.com
spec:
  group: fleet.example.com
  scope: Namespaced
  names:
    plural: {plural}
    singular: {singular}
    kind: {kind}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
",
        singular = kind.to_lowercase()
    )
}

/// A CRD installed while the provider runs, in a group/version the virtual
/// clusters already used, is found without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_added_to_a_known_group_version_is_found() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let cp = ControlPlane::start().await.expect("control plane");
    cp.install_crds(&crd("widgets", "Widget"))
        .await
        .expect("widgets");
    let admin = cp.client().await.expect("client");
    create_namespace(&admin, "team-a", &[]).await;
    let provider = Arc::new(NamespaceProvider::new(
        admin.clone(),
        NamespaceOptions::default(),
    ));
    let manager = Manager::builder(Cluster::new("host", admin.clone()))
        .provider(provider.clone())
        .build();
    let (shutdown, task) = run_manager(&manager);
    let team_a = {
        let provider = provider.clone();
        let name = ClusterName::from("team-a");
        wait_for_fleet_async(&manager, "team-a to be a cluster", || async {
            provider.get(&name).await.is_ok()
        })
        .await;
        provider.get(&name).await.expect("team-a")
    };
    let resource =
        |kind: &str| ApiResource::from_gvk(&GroupVersionKind::gvk("fleet.example.com", "v1", kind));
    // Listing across the virtual cluster asks the host which resources of
    // the group/version are namespaced.
    Api::<DynamicObject>::all_with(team_a.client(), &resource("Widget"))
        .list(&Default::default())
        .await
        .expect("widgets are known");

    cp.install_crds(&crd("gadgets", "Gadget"))
        .await
        .expect("gadgets");
    eventually(
        Polled::ApiServer,
        "gadgets to be known to the virtual cluster",
        || async {
            Api::<DynamicObject>::all_with(team_a.client(), &resource("Gadget"))
                .list(&Default::default())
                .await
                .is_ok()
        },
    )
    .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Virtual clusters of one host share its connections: engaging hundreds of
/// namespaces at once (each probed for health) leaves a handful of
/// connections to the host, not one per namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_namespaces_share_a_handful_of_connections_to_the_host() {
    const NAMESPACES: usize = 200;
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    for i in 0..NAMESPACES {
        create_namespace(&admin, &format!("many-{i}"), &[]).await;
    }
    let host_client = cp.client().await.expect("client");
    let provider = Arc::new(NamespaceProvider::new(
        host_client.clone(),
        NamespaceOptions::default(),
    ));
    let manager = Manager::builder(Cluster::new("host", host_client))
        .provider(provider)
        .build();
    let (shutdown, task) = run_manager(&manager);
    wait_for_fleet(&manager, "every namespace to be ready", || {
        manager
            .cluster_states()
            .iter()
            .filter(|(name, status)| {
                name.as_str().starts_with("many-")
                    && status.state == multicluster_runtime::manager::ClusterState::Ready
            })
            .count()
            == NAMESPACES
    })
    .await;
    let port: u16 = cp
        .server()
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("port");
    let connections = multicluster_runtime::testing::connections_to(port);
    assert!(
        (1..=10).contains(&connections),
        "{connections} connections to the host for {NAMESPACES} namespaces"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// An Event recorded in a virtual cluster about one of its objects lands in
/// the host namespace, about the host namespace's object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_a_virtual_cluster_land_in_its_namespace() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::Resource;
    use kube::runtime::events::{Event, EventType};
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    create_namespace(&admin, "team-a", &[]).await;
    create_config_map(&admin, "team-a", "noticed", "blue").await;
    let provider = Arc::new(NamespaceProvider::new(
        admin.clone(),
        NamespaceOptions::default(),
    ));
    let manager = Manager::builder(provider.host().clone())
        .provider(provider.clone())
        .build();
    let (shutdown, task) = run_manager(&manager);
    wait_for_fleet_async(&manager, "the namespace to be a cluster", || async {
        provider.get(&ClusterName::from("team-a")).await.is_ok()
    })
    .await;
    let cluster = provider
        .get(&ClusterName::from("team-a"))
        .await
        .expect("cluster");
    let cm = cluster
        .cache()
        .get::<ConfigMap>(Some("default"), "noticed")
        .await
        .expect("cache")
        .expect("the ConfigMap, seen in default");
    cluster
        .recorder("namespace-events-test")
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "Noticed".into(),
                note: None,
                action: "Notice".into(),
                secondary: None,
            },
            &cm.object_ref(&()),
        )
        .await
        .expect("published through the virtual client");
    let events = Api::<K8sEvent>::namespaced(admin, "team-a")
        .list(&Default::default())
        .await
        .expect("events")
        .items;
    let event = events
        .iter()
        .find(|event| event.reporting_controller.as_deref() == Some("namespace-events-test"))
        .unwrap_or_else(|| panic!("no Event in team-a: {events:?}"));
    let regarding = event.regarding.as_ref().expect("regarding");
    assert_eq!(regarding.namespace.as_deref(), Some("team-a"));
    assert_eq!(regarding.name.as_deref(), Some("noticed"));

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A namespace's labels are its virtual cluster's: a source selecting by
/// label watches the labelled namespace only, and one labelled later from
/// then on, the same virtual cluster as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_select_virtual_clusters_by_their_namespaces_labels() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    create_namespace(&admin, "gold", &[("tier", "gold")]).await;
    create_namespace(&admin, "plain", &[]).await;
    for ns in ["gold", "plain"] {
        create_config_map(&admin, ns, "existing", "blue").await;
    }
    let provider = Arc::new(NamespaceProvider::new(
        admin.clone(),
        NamespaceOptions::default(),
    ));
    let manager = Manager::builder(provider.host().clone())
        .provider(provider.clone())
        .build();
    let gold: kube::core::Selector =
        kube::core::Expression::Equal("tier".into(), "gold".into()).into();
    let recorder = Recorder::default();
    manager
        .add_controller(
            multicluster_runtime::testing::recording_controller(
                "gold-only",
                Watch::<ConfigMap>::new().cluster_labels(gold),
                &recorder,
            )
            .expect("controller"),
        )
        .expect("add");
    let (shutdown, task) = run_manager(&manager);

    recorder.wait_for_more(&req("gold", "existing"), 0).await;
    let plain = manager
        .get_cluster(&ClusterName::from("plain"))
        .await
        .expect("plain is engaged");
    // The gold namespace's later object is the synchronisation point: the
    // plain namespace's, created first, must not have been reconciled.
    create_config_map(&admin, "plain", "later", "red").await;
    create_config_map(&admin, "gold", "later", "red").await;
    recorder.wait_for_more(&req("gold", "later"), 0).await;
    assert_eq!(recorder.for_cluster("plain"), 0, "plain is not gold");

    Api::<Namespace>::all(admin.clone())
        .patch(
            "plain",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"tier": "gold"}}})),
        )
        .await
        .expect("label");
    recorder.wait_for_more(&req("plain", "existing"), 0).await;
    recorder.wait_for_more(&req("plain", "later"), 0).await;
    assert!(
        manager
            .get_cluster(&ClusterName::from("plain"))
            .await
            .expect("plain")
            .same_instance(&plain)
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The provider says its inventory is engaged (what a sharded replica
/// waits for before it joins its peers) only once every namespace of the
/// first list is: not before, and not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_is_engaged_once_every_listed_namespace_is() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    let wanted: Vec<String> = (0..200).map(|i| format!("listed-{i}")).collect();
    for name in &wanted {
        create_namespace(&admin, name, &[(WATCH_FILTER_LABEL, "listed")]).await;
    }
    create_namespace(&admin, "elsewhere", &[(WATCH_FILTER_LABEL, "other")]).await;
    let provider = Arc::new(NamespaceProvider::new(
        admin.clone(),
        NamespaceOptions::default().watch_filter("listed".to_string()),
    ));
    let (engaged, started) =
        multicluster_runtime::testing::engaged_when_inventory_is(provider).await;
    let mut expected: Vec<ClusterName> = wanted
        .iter()
        .map(|name| ClusterName::from(name.as_str()))
        .collect();
    expected.sort();
    assert_eq!(
        engaged, expected,
        "said before every listed namespace was engaged"
    );
    started.stop().await.expect("clean stop");
}
