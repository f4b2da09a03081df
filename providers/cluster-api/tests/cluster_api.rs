//! The Cluster API provider against a management control plane with the
//! Cluster CRD and real workload control planes behind kubeconfig Secrets.

use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, Patch,
    PatchParams, PostParams,
};
use multicluster_envtest::traps::Traps;
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_provider_cluster_api::{
    CLUSTER_NAME_LABEL, ClusterApiOptions, ClusterApiProvider, ClusterApiVersion,
    PAUSED_ANNOTATION, TOPOLOGY_CLASS_PROPERTY, WATCH_FILTER_LABEL,
};
use multicluster_runtime::client::{AllowedPlugin, Allowlist, ExecPolicy, KubeconfigPolicy};
use multicluster_runtime::controller::{Backoff, Request};
use multicluster_runtime::provider::member::Members;
use multicluster_runtime::testing::{
    Recorder, eventually, recording_manager, run_manager, serve_health, wait_for_fleet, wait_on,
    wait_until_left, wait_until_unreachable, wait_until_unusable,
};
use multicluster_runtime::{Cluster, ClusterName, Manager, ManagerOptions};

struct Management {
    cp: ControlPlane,
    client: kube::Client,
}

impl Management {
    async fn start(namespaces: &[&str]) -> Self {
        let cp = ControlPlane::start().await.expect("management");
        let crd = multicluster_envtest::upstream::cluster_api_cluster_crd()
            .await
            .expect("upstream CRD");
        cp.install_crds(&crd).await.expect("CRD");
        let client = cp.client().await.expect("client");
        for ns in namespaces {
            cp.create_namespace(ns).await.expect("namespace");
        }
        Self { cp, client }
    }

    fn clusters(&self, namespace: &str, version: &str) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.x-k8s.io",
            version,
            "Cluster",
        ));
        Api::namespaced_with(self.client.clone(), namespace, &resource)
    }

    async fn create_cluster(
        &self,
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.x-k8s.io",
            "v1beta2",
            "Cluster",
        ));
        let mut object = DynamicObject::new(name, &resource).within(namespace);
        object.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        object.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        // As a user writes it: a control plane and an infrastructure.
        object.data = serde_json::json!({"spec": {
            "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": name},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerCluster", "name": name},
        }});
        self.clusters(namespace, "v1beta2")
            .create(&PostParams::default(), &object)
            .await
            .expect("Cluster");
    }

    async fn set_status(
        &self,
        namespace: &str,
        name: &str,
        version: &str,
        status: serde_json::Value,
    ) {
        self.clusters(namespace, version)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": status})),
            )
            .await
            .expect("status");
    }

    /// Provisioned, as Cluster API's controllers leave it.
    async fn set_ready(&self, namespace: &str, name: &str) {
        self.set_status(
            namespace,
            name,
            "v1beta2",
            serde_json::json!({
                "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
                "phase": "Provisioned",
                "conditions": [
                    condition("InfrastructureReady", "Ready"),
                    condition("ControlPlaneInitialized", "Initialized"),
                    condition("ControlPlaneAvailable", "Available"),
                    condition("Available", "Available"),
                ],
            }),
        )
        .await;
    }

    /// Creates or replaces `<cluster>-kubeconfig` pointing at `workload`.
    async fn put_kubeconfig(&self, namespace: &str, cluster: &str, workload: &ControlPlane) {
        self.put_kubeconfig_of(namespace, cluster, workload.kubeconfig())
            .await;
    }

    /// A ready Cluster `namespace/name` whose Secret holds `kubeconfig`.
    async fn add_ready(&self, namespace: &str, name: &str, kubeconfig: &kube::config::Kubeconfig) {
        self.create_cluster(namespace, name, &[], &[]).await;
        self.set_ready(namespace, name).await;
        self.put_kubeconfig_of(namespace, name, kubeconfig).await;
    }

    /// Creates or replaces `<cluster>-kubeconfig` holding `kubeconfig`.
    async fn put_kubeconfig_of(
        &self,
        namespace: &str,
        cluster: &str,
        kubeconfig: &kube::config::Kubeconfig,
    ) {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(format!("{cluster}-kubeconfig")),
                namespace: Some(namespace.into()),
                labels: Some([(CLUSTER_NAME_LABEL.to_string(), cluster.to_string())].into()),
                ..ObjectMeta::default()
            },
            type_: Some("cluster.x-k8s.io/secret".into()),
            data: Some(BTreeMap::from([(
                "value".to_string(),
                ByteString(
                    multicluster_envtest::to_yaml(kubeconfig)
                        .expect("yaml")
                        .into_bytes(),
                ),
            )])),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(self.client.clone(), namespace)
            .patch(
                &format!("{cluster}-kubeconfig"),
                &PatchParams::apply("test").force(),
                &Patch::Apply(secret),
            )
            .await
            .expect("kubeconfig Secret");
    }
}

/// A v1beta2 (metav1) condition that holds, as Cluster API writes them.
fn condition(type_: &str, reason: &str) -> serde_json::Value {
    serde_json::json!({
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": "",
        "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    })
}

async fn workload(object: &str) -> ControlPlane {
    let cp = ControlPlane::start().await.expect("workload");
    cp.create_config_map(object, &[]).await.expect("object");
    cp
}

/// The provider's options with the test plugin allowed, as an operator
/// allows their cloud's credential plugin (`--allow-exec-plugin`), with
/// the one variable its kubeconfigs set (`--allow-exec-env STATE_DIR`).
fn with_test_plugin_allowed() -> ClusterApiOptions {
    ClusterApiOptions::default().kubeconfig_policy(
        KubeconfigPolicy::untrusted().exec(ExecPolicy::Allowlist(
            Allowlist::of([AllowedPlugin::new(plugins::TOKEN)
                .expect("an absolute path")
                .env(["STATE_DIR"])
                .expect("a plain variable")])
            .expect("one plugin"),
        )),
    )
}

fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

/// A manager over `provider` with a recording ConfigMap controller.
fn manager_for(management: &Management, provider: Arc<ClusterApiProvider>) -> (Manager, Recorder) {
    recording_manager(
        Cluster::new("management", management.client.clone()),
        provider,
        ManagerOptions::default(),
    )
}

/// Member options that hold the member built from the object named `name`
/// to the namespace `default` (where the tests' ConfigMaps are) and leave
/// the others watching every namespace.
fn held_to_default_if_named(name: &'static str) -> Members<DynamicObject> {
    Members::default().per_member(move |object: &DynamicObject, options| {
        if object.metadata.name.as_deref() == Some(name) {
            let cache = options.cache.clone().namespace("default".to_string());
            options.cache(cache)
        } else {
            options
        }
    })
}

/// The namespace the cache of `cluster` is held to.
async fn cache_namespace(manager: &Manager, cluster: &str) -> Option<String> {
    let cluster = manager.get_cluster(&cluster.into()).await.expect("cluster");
    cluster
        .cache()
        .options()
        .expect("own cache")
        .namespace
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_clusters_are_engaged_and_follow_their_kubeconfig_secrets() {
    let (management, first, second) = tokio::join!(
        Management::start(&["team-a", "team-b"]),
        workload("in-first"),
        workload("in-second")
    );

    // Ready with a Secret; not ready yet; ready without a Secret yet.
    management.create_cluster("team-a", "one", &[], &[]).await;
    management.set_ready("team-a", "one").await;
    management.put_kubeconfig("team-a", "one", &first).await;
    management.create_cluster("team-b", "two", &[], &[]).await;
    management.put_kubeconfig("team-b", "two", &second).await;
    management.create_cluster("team-a", "three", &[], &[]).await;
    management.set_ready("team-a", "three").await;

    let provider = Arc::new(ClusterApiProvider::new(
        management.client.clone(),
        ClusterApiOptions::default().members(held_to_default_if_named("one")),
    ));
    let (manager, recorder) = manager_for(&management, provider.clone());
    let (shutdown, task) = run_manager(&manager);

    recorder
        .wait_for_more(&req("team-a/one", "in-first"), 0)
        .await;
    assert_eq!(
        cache_namespace(&manager, "team-a/one").await,
        Some("default".to_string()),
        "the member options chosen from its Cluster"
    );
    assert_eq!(
        provider.names(),
        [ClusterName::from("team-a/one")],
        "two not ready, three has no Secret"
    );

    // Becoming ready later, and a Secret created later, both engage.
    management.set_ready("team-b", "two").await;
    recorder
        .wait_for_more(&req("team-b/two", "in-second"), 0)
        .await;
    assert_eq!(cache_namespace(&manager, "team-b/two").await, None);

    // A label and a managed topology given to "two" reach its cluster's
    // labels and properties, without building it again.
    let two = manager
        .get_cluster(&ClusterName::from("team-b/two"))
        .await
        .expect("two");
    management
        .clusters("team-b", "v1beta2")
        .patch(
            "two",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"labels": {"env": "production"}},
                "spec": {"topology": {"classRef": {"name": "quick-start"}, "version": "v1.35.0"}},
            })),
        )
        .await
        .expect("label and topology");
    wait_on(
        "two's label and topology class",
        &mut two.inventory_changes(),
        |inventory| {
            inventory.labels.get("env").map(String::as_str) == Some("production")
                && inventory
                    .properties
                    .get(TOPOLOGY_CLASS_PROPERTY)
                    .map(String::as_str)
                    == Some("quick-start")
        },
    )
    .await;
    assert!(
        manager
            .get_cluster(&ClusterName::from("team-b/two"))
            .await
            .expect("two")
            .same_instance(&two)
    );
    management.put_kubeconfig("team-a", "three", &second).await;
    recorder
        .wait_for_more(&req("team-a/three", "in-second"), 0)
        .await;

    // A rotated kubeconfig replaces the cluster at once: "one" now reaches
    // the second workload cluster.
    management.put_kubeconfig("team-a", "one", &second).await;
    recorder
        .wait_for_more(&req("team-a/one", "in-second"), 0)
        .await;

    // Paused: a kubeconfig change is not applied until unpaused.
    let before = manager
        .get_cluster(&ClusterName::from("team-a/three"))
        .await
        .expect("three");
    management
        .clusters("team-a", "v1beta2")
        .patch(
            "three",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {PAUSED_ANNOTATION: ""}}}),
            ),
        )
        .await
        .expect("pause");
    management.put_kubeconfig("team-a", "three", &first).await;
    // The rotated Secret of an unpaused cluster is the synchronisation point.
    management.put_kubeconfig("team-a", "one", &first).await;
    recorder
        .wait_until("one to move back to the first workload", |recorder| {
            recorder.count(&req("team-a/one", "in-first")) >= 2
        })
        .await;
    assert!(
        manager
            .get_cluster(&ClusterName::from("team-a/three"))
            .await
            .expect("three")
            .same_instance(&before),
        "a paused cluster is left as it is"
    );
    management
        .clusters("team-a", "v1beta2")
        .patch(
            "three",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {PAUSED_ANNOTATION: null}}}),
            ),
        )
        .await
        .expect("unpause");
    recorder
        .wait_for_more(&req("team-a/three", "in-first"), 0)
        .await;

    // Deleted → removed.
    management
        .clusters("team-b", "v1beta2")
        .delete("two", &DeleteParams::default())
        .await
        .expect("delete");
    wait_until_left(&manager, "team-b/two").await;
    assert!(!provider.names().contains(&ClusterName::from("team-b/two")));

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
    drop(management.cp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_filters_split_clusters_between_instances_and_v1beta1_readiness_works() {
    let (management, workload) = tokio::join!(Management::start(&["fleet"]), workload("hello"));
    for (name, filter) in [
        ("x-one", "x"),
        ("x-two", "x"),
        ("y-one", "y"),
        ("unlabelled", ""),
    ] {
        let labels: Vec<(&str, &str)> = if filter.is_empty() {
            vec![]
        } else {
            vec![(WATCH_FILTER_LABEL, filter)]
        };
        management.create_cluster("fleet", name, &labels, &[]).await;
        management.put_kubeconfig("fleet", name, &workload).await;
    }
    for name in ["x-one", "x-two"] {
        management.set_ready("fleet", name).await;
    }
    // The "y" instance watches v1beta1. Its Cluster gets the status a
    // v1beta1 controller writes; without Cluster API's conversion webhook
    // (as here, and wherever only the CRD is installed) the API server
    // keeps only what v1beta2, the stored version, also has: the phase.
    management
        .set_status(
            "fleet",
            "y-one",
            "v1beta1",
            serde_json::json!({
                "phase": "Provisioned",
                "infrastructureReady": true,
                "controlPlaneReady": true,
            }),
        )
        .await;
    let stored = management
        .clusters("fleet", "v1beta1")
        .get("y-one")
        .await
        .expect("y-one");
    assert_eq!(stored.data["status"]["phase"], "Provisioned");
    assert!(
        stored.data["status"].get("controlPlaneReady").is_none(),
        "pruned without the webhook: {}",
        stored.data["status"]
    );

    let x = Arc::new(ClusterApiProvider::new(
        management.client.clone(),
        ClusterApiOptions::default()
            .namespace("fleet".to_string())
            .watch_filter("x".to_string()),
    ));
    let y = Arc::new(ClusterApiProvider::new(
        management.client.clone(),
        ClusterApiOptions::default()
            .namespace("fleet".to_string())
            .watch_filter("y".to_string())
            .version(ClusterApiVersion::V1Beta1),
    ));
    let ((x_manager, _), (y_manager, _)) = (
        manager_for(&management, x.clone()),
        manager_for(&management, y.clone()),
    );
    let (x_stop, x_task) = run_manager(&x_manager);
    let (y_stop, y_task) = run_manager(&y_manager);
    wait_for_fleet(&x_manager, "x's clusters", || {
        x.names()
            == [
                ClusterName::from("fleet/x-one"),
                ClusterName::from("fleet/x-two"),
            ]
    })
    .await;
    wait_for_fleet(&y_manager, "y's clusters", || {
        y.names() == [ClusterName::from("fleet/y-one")]
    })
    .await;
    assert!(
        !x.names()
            .iter()
            .chain(y.names().iter())
            .any(|name| name.as_str() == "fleet/unlabelled")
    );

    x_stop.cancel();
    y_stop.cancel();
    x_task.await.expect("task").expect("clean stop");
    y_task.await.expect("task").expect("clean stop");
}

/// A Secret without the `value` key or with a broken kubeconfig skips only
/// its Cluster; a server that cannot be trusted is engaged and reported
/// unreachable; a healthy Cluster created last is engaged regardless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_kubeconfig_secrets_affect_only_their_own_cluster() {
    let (management, healthy, stranger) = tokio::join!(
        Management::start(&["fleet"]),
        workload("hello"),
        workload("other")
    );
    let secrets = Api::<Secret>::namespaced(management.client.clone(), "fleet");
    let bad = |cluster: &str, data: Option<&str>| Secret {
        metadata: ObjectMeta {
            name: Some(format!("{cluster}-kubeconfig")),
            namespace: Some("fleet".into()),
            labels: Some([(CLUSTER_NAME_LABEL.to_string(), cluster.to_string())].into()),
            ..ObjectMeta::default()
        },
        data: data.map(|text| {
            BTreeMap::from([("value".to_string(), ByteString(text.as_bytes().to_vec()))])
        }),
        ..Secret::default()
    };
    for (cluster, data) in [
        ("no-value", None),
        ("garbage", Some("{{{ not a kubeconfig")),
    ] {
        management.create_cluster("fleet", cluster, &[], &[]).await;
        management.set_ready("fleet", cluster).await;
        secrets
            .create(&PostParams::default(), &bad(cluster, data))
            .await
            .expect("secret");
    }
    let untrusted = healthy.kubeconfig_trusting(&stranger);
    management
        .create_cluster("fleet", "untrusted", &[], &[])
        .await;
    management.set_ready("fleet", "untrusted").await;
    secrets
        .create(
            &PostParams::default(),
            &bad(
                "untrusted",
                Some(&multicluster_envtest::to_yaml(&untrusted).expect("yaml")),
            ),
        )
        .await
        .expect("secret");

    let provider = Arc::new(ClusterApiProvider::new(
        management.client.clone(),
        ClusterApiOptions::default(),
    ));
    let (manager, recorder) = recording_manager(
        Cluster::new("management", management.client.clone()),
        provider.clone(),
        ManagerOptions::default().sync_timeout(std::time::Duration::from_secs(3)),
    );
    let (shutdown, task) = run_manager(&manager);
    wait_until_unreachable(&manager, "fleet/untrusted").await;

    management
        .add_ready("fleet", "healthy", healthy.kubeconfig())
        .await;
    recorder
        .wait_for_more(&req("fleet/healthy", "hello"), 0)
        .await;
    assert_eq!(
        provider.names(),
        [
            ClusterName::from("fleet/healthy"),
            ClusterName::from("fleet/untrusted")
        ]
    );
    assert_eq!(recorder.for_cluster("fleet/untrusted"), 0);
    let failures = provider.failures();
    for (cluster, expected) in [
        (
            "fleet/no-value",
            "Secret fleet/no-value-kubeconfig key \"value\" is missing",
        ),
        (
            "fleet/garbage",
            "Secret fleet/garbage-kubeconfig key \"value\"",
        ),
    ] {
        let reason = failures
            .get(&ClusterName::from(cluster))
            .unwrap_or_else(|| panic!("no failure for {cluster}: {failures:?}"));
        assert!(reason.contains(expected), "{cluster}: {reason}");
    }

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A kubeconfig whose credential plugin fails at first (no token yet) is
/// tried again with backoff, and engaged once the plugin works — with no
/// Cluster or Secret event to prompt it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_credential_plugin_fails_at_first_is_engaged_once_it_works() {
    let (management, member) = tokio::join!(Management::start(&["fleet"]), workload("hello"));
    let state = tempfile::tempdir().expect("state");
    management.create_cluster("fleet", "late", &[], &[]).await;
    management.set_ready("fleet", "late").await;
    management
        .put_kubeconfig_of(
            "fleet",
            "late",
            &member.exec_kubeconfig("late", plugins::TOKEN, state.path()),
        )
        .await;

    let provider = Arc::new(ClusterApiProvider::new(
        management.client.clone(),
        with_test_plugin_allowed().retry(Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        }),
    ));
    let (manager, recorder) = manager_for(&management, provider.clone());
    let (shutdown, task) = run_manager(&manager);
    eventually(
        Polled::OtherProcess,
        "the failing plugin to be tried again",
        || async { plugins::calls(state.path()).len() >= 3 },
    )
    .await;
    assert!(provider.names().is_empty());

    let token = member
        .cluster_admin_token("robots", "late")
        .await
        .expect("token");
    plugins::set_token(state.path(), &token).expect("token");
    recorder.wait_for_more(&req("fleet/late", "hello"), 0).await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A custom readiness replaces the version's default: here an annotation
/// engages a Cluster whose control plane is not initialized, and an
/// initialized one without it stays out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_readiness_replaces_the_default() {
    let (management, member) = tokio::join!(Management::start(&["fleet"]), workload("hello"));
    management
        .create_cluster("fleet", "initialized", &[], &[])
        .await;
    management.set_ready("fleet", "initialized").await;
    management
        .put_kubeconfig("fleet", "initialized", &member)
        .await;
    management
        .create_cluster("fleet", "annotated", &[], &[("example.com/ready", "yes")])
        .await;
    management
        .put_kubeconfig("fleet", "annotated", &member)
        .await;

    let provider = Arc::new(ClusterApiProvider::new(
        management.client.clone(),
        ClusterApiOptions::default().readiness(|cluster: &DynamicObject| {
            cluster
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("example.com/ready"))
        }),
    ));
    let (manager, recorder) = manager_for(&management, provider.clone());
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("fleet/annotated", "hello"), 0)
        .await;
    assert_eq!(provider.names(), [ClusterName::from("fleet/annotated")]);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A Cluster whose kubeconfig's credential plugin never answers holds up
/// only itself: Clusters made ready after it are engaged, a deleted one is
/// removed, and stopping the provider stops the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_plugin_hangs_holds_up_only_itself() {
    let (management, member) = tokio::join!(Management::start(&["fleet"]), workload("hello"));
    let state = tempfile::tempdir().expect("state");
    plugins::set_token(state.path(), "never-handed-out").expect("token");
    plugins::hold(state.path()).expect("hold");
    for name in ["stuck", "before"] {
        management.create_cluster("fleet", name, &[], &[]).await;
        management.set_ready("fleet", name).await;
    }
    management
        .put_kubeconfig_of(
            "fleet",
            "stuck",
            &member.exec_kubeconfig("stuck", plugins::TOKEN, state.path()),
        )
        .await;
    management.put_kubeconfig("fleet", "before", &member).await;

    let provider = Arc::new(ClusterApiProvider::new(
        management.client.clone(),
        with_test_plugin_allowed(),
    ));
    let (manager, recorder) = manager_for(&management, provider.clone());
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("fleet/before", "hello"), 0)
        .await;
    let plugin = plugins::first_call_running(state.path()).await;

    management.create_cluster("fleet", "after", &[], &[]).await;
    management.put_kubeconfig("fleet", "after", &member).await;
    management.set_ready("fleet", "after").await;
    recorder
        .wait_for_more(&req("fleet/after", "hello"), 0)
        .await;
    management
        .clusters("fleet", "v1beta2")
        .delete("before", &DeleteParams::default())
        .await
        .expect("delete");
    wait_until_left(&manager, "fleet/before").await;
    assert_eq!(provider.names(), [ClusterName::from("fleet/after")]);
    assert!(plugins::is_running(plugin), "still waiting for its login");
    assert_eq!(plugins::pids(state.path()), [plugin], "run once");

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
    plugins::wait_until_stopped(plugin, "the plugin").await;
}

/// Cluster API's kubeconfig Secrets are objects anyone with write access to
/// Secrets in the namespace can write. With `ClusterApiOptions::default()`,
/// ready Clusters whose Secrets' kubeconfigs would run a plugin (one that
/// leaves a mark), read a token file, a client certificate and key or a CA
/// file, use an auth provider, skip TLS verification or pick a proxy are
/// refused before any of it happens: no mark, no file opened, their server
/// (a listener) never reached; each is shown unusable with the Secret, the
/// field and the policy field that would allow it; a healthy Cluster is
/// engaged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_secrets_that_would_run_read_or_dial_are_refused_with_the_default_options() {
    let (management, healthy) = tokio::join!(Management::start(&["fleet"]), workload("hello"));
    let traps = Traps::set().await.expect("traps");
    let panics = multicluster_envtest::panics::Panics::count();
    let kubeconfigs = [
        traps.kubeconfigs(healthy.ca_pem()),
        traps.broken_credentials(healthy.ca_pem()),
        traps.broken_servers(healthy.ca_pem()),
    ]
    .concat();
    for trap in &kubeconfigs {
        management
            .add_ready("fleet", trap.name, &trap.kubeconfig)
            .await;
    }
    management
        .add_ready("fleet", "healthy", healthy.kubeconfig())
        .await;

    let provider = Arc::new(ClusterApiProvider::new(
        management.client.clone(),
        ClusterApiOptions::default(),
    ));
    let (manager, recorder) = manager_for(&management, provider.clone());
    let (shutdown, task) = run_manager(&manager);
    let address = serve_health(&manager, shutdown.clone()).await;
    recorder
        .wait_for_more(&req("fleet/healthy", "hello"), 0)
        .await;
    let names: Vec<_> = kubeconfigs
        .iter()
        .map(|trap| ClusterName::from(format!("fleet/{}", trap.name)))
        .collect();
    let reasons = wait_until_unusable(&manager, address, &names).await;
    for (trap, name) in kubeconfigs.iter().zip(&names) {
        let origin = format!("Secret fleet/{}-kubeconfig key \"value\"", trap.name);
        trap.assert_refused(&reasons[name], &origin, &traps);
    }
    assert_eq!(provider.names(), [ClusterName::from("fleet/healthy")]);
    traps.assert_untouched().await;
    assert_eq!(panics.since(), 0, "panicked: {:?}", panics.messages());

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
