//! Kubeconfig Secrets in a management control plane pointing at three member
//! control planes: engagement, rotation with a revoked old token, repointing,
//! removal, bad Secrets ignored while the rest of the fleet works.

use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::Polled;
use multicluster_runtime::testing::wait_for_fleet;
use multicluster_runtime::testing::wait_for_fleet_async;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_provider_kubeconfig::{
    DEFAULT_LABEL, KubeconfigOptions, KubeconfigProvider, WATCH_FILTER_LABEL,
};
use multicluster_runtime::client::{AllowedPlugin, Allowlist, ExecPolicy, KubeconfigPolicy};
use multicluster_runtime::controller::{Backoff, Request, Watch};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::testing::{
    Recorder, eventually, recording_controller, recording_manager, run_manager, wait_until_left,
    wait_until_unreachable,
};
use multicluster_runtime::{Cluster, ClusterName, Manager, ManagerOptions, Provider};

const NAMESPACE: &str = "fleet";

/// The provider's options with the test plugin allowed, as an operator
/// allows their cloud's credential plugin (`--allow-exec-plugin`), with
/// the one variable its kubeconfigs set (`--allow-exec-env STATE_DIR`).
fn with_test_plugin_allowed() -> KubeconfigOptions {
    KubeconfigOptions::default().kubeconfig_policy(
        KubeconfigPolicy::untrusted().exec(ExecPolicy::Allowlist(
            Allowlist::of([AllowedPlugin::new(plugins::TOKEN)
                .expect("an absolute path")
                .env(["STATE_DIR"])
                .expect("a plain variable")])
            .expect("one plugin"),
        )),
    )
}

fn secret(name: &str, data: Option<&str>, labels: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        data: data.map(|text| {
            BTreeMap::from([(
                "kubeconfig".to_string(),
                ByteString(text.as_bytes().to_vec()),
            )])
        }),
        ..Secret::default()
    }
}

async fn create(cp: &ControlPlane, name: &str) {
    cp.create_config_map(name, &[]).await.expect("create");
}

/// A kubeconfig for a new service account bound to cluster-admin.
async fn admin_service_account(cp: &ControlPlane, name: &str) -> String {
    let token = cp
        .cluster_admin_token("robots", name)
        .await
        .expect("service account");
    multicluster_envtest::to_yaml(&cp.token_kubeconfig(&format!("robots-{name}"), token))
        .expect("yaml")
}

fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_secrets_engage_rotate_and_remove_member_clusters() {
    let (management, a, b, c) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (management, a, b, c) = (
        management.expect("m"),
        a.expect("a"),
        b.expect("b"),
        c.expect("c"),
    );
    for (cp, name) in [(&a, "in-a"), (&b, "in-b"), (&c, "in-c")] {
        create(cp, name).await;
    }
    let admin = management.client().await.expect("client");
    management
        .create_namespace(NAMESPACE)
        .await
        .expect("namespace");
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    let labelled = [(DEFAULT_LABEL, "true")];
    let yaml = |cp: &ControlPlane| multicluster_envtest::to_yaml(cp.kubeconfig()).expect("yaml");
    let c_first_token = admin_service_account(&c, "first").await;
    for (name, kubeconfig) in [("a", yaml(&a)), ("b", yaml(&b)), ("c", c_first_token)] {
        secrets
            .create(
                &PostParams::default(),
                &secret(name, Some(&kubeconfig), &labelled),
            )
            .await
            .expect("secret");
    }
    // Not labelled: never a cluster.
    secrets
        .create(
            &PostParams::default(),
            &secret("unlabelled", Some(&yaml(&a)), &[]),
        )
        .await
        .expect("secret");

    let metrics = Metrics::default();
    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        KubeconfigOptions::default().namespace(NAMESPACE.to_string()),
    ));
    let manager = Manager::builder(Cluster::new("local", admin.clone()))
        .provider(provider.clone())
        .metrics(metrics.clone())
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(
            recording_controller("kubeconfig", Watch::<ConfigMap>::new(), &recorder)
                .expect("controller"),
        )
        .expect("add");
    let (shutdown, task) = run_manager(&manager);

    for (cluster, object) in [("a", "in-a"), ("b", "in-b"), ("c", "in-c")] {
        recorder.wait_for_more(&req(cluster, object), 0).await;
    }
    assert_eq!(
        provider.names(),
        [
            ClusterName::from("a"),
            ClusterName::from("b"),
            ClusterName::from("c")
        ]
    );

    // New and updated objects in a member.
    create(&a, "new-in-a").await;
    recorder.wait_for_more(&req("a", "new-in-a"), 0).await;
    Api::<ConfigMap>::namespaced(a.client().await.expect("client"), "default")
        .patch(
            "new-in-a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
        )
        .await
        .expect("update");
    recorder.wait_for_more(&req("a", "new-in-a"), 1).await;

    // An index registered on the provider answers per cluster.
    provider
        .index_field(multicluster_runtime::cache::FieldIndex::new::<ConfigMap>(
            "name-prefix",
            |cm: &ConfigMap| {
                cm.metadata
                    .name
                    .iter()
                    .filter_map(|n| n.split('-').next().map(str::to_string))
                    .collect()
            },
        ))
        .await
        .expect("index");
    let in_a = manager
        .get_cluster(&ClusterName::from("a"))
        .await
        .expect("a")
        .cache()
        .by_index::<ConfigMap>("name-prefix", "new", Some("default"))
        .await
        .expect("query");
    assert_eq!(
        in_a.iter()
            .filter_map(|cm| cm.metadata.name.clone())
            .collect::<Vec<_>>(),
        ["new-in-a"]
    );

    // Labelled Secrets without the key, with an empty key, or with garbage
    // are ignored (and counted); a good Secret created after them is the
    // synchronisation point.
    secrets
        .create(&PostParams::default(), &secret("no-key", None, &labelled))
        .await
        .expect("secret");
    secrets
        .create(
            &PostParams::default(),
            &secret("empty-key", Some(""), &labelled),
        )
        .await
        .expect("secret");
    secrets
        .create(
            &PostParams::default(),
            &secret("garbage", Some("token: [very-secret"), &labelled),
        )
        .await
        .expect("secret");
    secrets
        .create(
            &PostParams::default(),
            &secret("b-again", Some(&yaml(&b)), &labelled),
        )
        .await
        .expect("secret");
    recorder.wait_for_more(&req("b-again", "in-b"), 0).await;
    for ignored in ["no-key", "empty-key", "garbage", "unlabelled"] {
        assert!(
            !provider.names().contains(&ClusterName::from(ignored)),
            "{ignored} ignored"
        );
    }
    let exported = metrics.encode();
    assert!(exported.contains(r#"reason="missing-key""#), "{exported}");
    assert!(
        exported.contains(r#"reason="invalid-kubeconfig""#),
        "{exported}"
    );
    assert!(!exported.contains("very-secret"));
    // The provider's own controller reports in the manager's registry too.
    assert!(
        exported.contains(r#"controller="kubeconfig-provider""#),
        "{exported}"
    );

    // Metadata-only change: nothing is re-engaged.
    let before = provider.names();
    let instance = manager
        .get_cluster(&ClusterName::from("a"))
        .await
        .expect("a");
    secrets
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await
        .expect("annotate");
    create(&a, "after-annotation").await;
    recorder
        .wait_for_more(&req("a", "after-annotation"), 0)
        .await;
    assert!(
        manager
            .get_cluster(&ClusterName::from("a"))
            .await
            .expect("a")
            .same_instance(&instance)
    );
    assert_eq!(provider.names(), before);

    // Rotation: c gets a new service-account token, the old account is
    // deleted (its tokens revoked), and c keeps reconciling.
    let c_first = manager
        .get_cluster(&ClusterName::from("c"))
        .await
        .expect("c");
    let c_second_token = admin_service_account(&c, "second").await;
    secrets
        .replace(
            "c",
            &PostParams::default(),
            &secret("c", Some(&c_second_token), &labelled),
        )
        .await
        .expect("rotate");
    wait_for_fleet_async(&manager, "c to be replaced by a new instance", || async {
        manager
            .get_cluster(&ClusterName::from("c"))
            .await
            .is_ok_and(|cluster| !cluster.same_instance(&c_first))
    })
    .await;
    Api::<ServiceAccount>::namespaced(c.client().await.expect("client"), "robots")
        .delete("first", &DeleteParams::default())
        .await
        .expect("revoke the old token");
    create(&c, "after-rotation").await;
    recorder.wait_for_more(&req("c", "after-rotation"), 0).await;

    // Repointing b at another API server re-engages it there.
    secrets
        .replace(
            "b",
            &PostParams::default(),
            &secret("b", Some(&yaml(&a)), &labelled),
        )
        .await
        .expect("repoint");
    recorder.wait_for_more(&req("b", "in-a"), 0).await;

    // Deleting a Secret removes its cluster.
    secrets
        .delete("b-again", &DeleteParams::default())
        .await
        .expect("delete");
    wait_until_left(&manager, "b-again").await;
    assert!(!provider.names().contains(&ClusterName::from("b-again")));

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_namespace_is_watched_when_none_is_given_and_a_watch_filter_splits_instances() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("m"), member.expect("member"));
    let admin = management.client().await.expect("client");
    let kubeconfig = multicluster_envtest::to_yaml(member.kubeconfig()).expect("yaml");
    for ns in ["east", "west"] {
        management.create_namespace(ns).await.expect("namespace");
        let mut s = secret("prod", Some(&kubeconfig), &[(DEFAULT_LABEL, "true")]);
        s.metadata.namespace = Some(ns.into());
        Api::<Secret>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &s)
            .await
            .expect("secret");
    }
    // A Secret for another instance, by watch filter.
    let mut filtered = secret(
        "staging",
        Some(&kubeconfig),
        &[(DEFAULT_LABEL, "true"), (WATCH_FILTER_LABEL, "other")],
    );
    filtered.metadata.namespace = Some("east".into());
    Api::<Secret>::namespaced(admin.clone(), "east")
        .create(&PostParams::default(), &filtered)
        .await
        .expect("secret");

    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        KubeconfigOptions::default(),
    ));
    let other = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        KubeconfigOptions::default().watch_filter("other".to_string()),
    ));
    let manager = Manager::builder(Cluster::new("local", admin.clone()))
        .provider(provider.clone())
        .build();
    let other_manager = Manager::builder(Cluster::new("local", admin))
        .provider(other.clone())
        .build();
    let (shutdown, task) = run_manager(&manager);
    let (other_shutdown, other_task) = run_manager(&other_manager);
    // Without a filter every labelled Secret counts; with one, only its own.
    wait_for_fleet(&manager, "all three namespaced clusters", || {
        provider.names()
            == [
                ClusterName::from("east/prod"),
                ClusterName::from("east/staging"),
                ClusterName::from("west/prod"),
            ]
    })
    .await;
    wait_for_fleet(&other_manager, "the filtered instance's cluster", || {
        other.names() == [ClusterName::from("east/staging")]
    })
    .await;
    other_shutdown.cancel();
    other_task.await.expect("task").expect("clean stop");
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Each broken kubeconfig is either skipped (cannot be built) or engaged and
/// reported unreachable (cannot be reached); a healthy cluster added after
/// all of them is engaged and reconciled regardless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_kubeconfigs_affect_only_their_own_secret() {
    let (management, member, stranger) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (management, member, stranger) = (
        management.expect("m"),
        member.expect("member"),
        stranger.expect("stranger"),
    );
    create(&member, "hello").await;
    let admin = management.client().await.expect("client");
    management
        .create_namespace(NAMESPACE)
        .await
        .expect("namespace");
    let good = member.kubeconfig().clone();
    let edited = |edit: &dyn Fn(&mut kube::config::Kubeconfig)| {
        let mut kubeconfig = good.clone();
        edit(&mut kubeconfig);
        multicluster_envtest::to_yaml(&kubeconfig).expect("yaml")
    };
    enum Outcome {
        Skipped,
        Unreachable,
    }
    let cases: Vec<(&str, String, Outcome)> = vec![
        ("not-yaml", "{{{ not yaml".into(), Outcome::Skipped),
        (
            "not-a-kubeconfig",
            "apiVersion: v1\nkind: ConfigMap\ndata: {}\n".into(),
            Outcome::Skipped,
        ),
        (
            "no-current-context",
            edited(&|k| k.current_context = None),
            Outcome::Skipped,
        ),
        (
            "missing-cluster",
            edited(&|k| k.clusters.clear()),
            Outcome::Skipped,
        ),
        (
            "missing-user",
            edited(&|k| k.auth_infos.clear()),
            Outcome::Skipped,
        ),
        (
            "refused",
            edited(&|k| {
                if let Some(cluster) = k.clusters[0].cluster.as_mut() {
                    cluster.server = Some("https://127.0.0.1:1".into());
                }
            }),
            Outcome::Unreachable,
        ),
        (
            "wrong-ca",
            multicluster_envtest::to_yaml(&member.kubeconfig_trusting(&stranger)).expect("yaml"),
            Outcome::Unreachable,
        ),
    ];
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    for (name, text, _) in &cases {
        secrets
            .create(
                &PostParams::default(),
                &secret(name, Some(text), &[(DEFAULT_LABEL, "true")]),
            )
            .await
            .expect("secret");
    }
    secrets
        .create(
            &PostParams::default(),
            &secret(
                "healthy",
                Some(&multicluster_envtest::to_yaml(&good).expect("yaml")),
                &[(DEFAULT_LABEL, "true")],
            ),
        )
        .await
        .expect("secret");

    let options = ManagerOptions::default().sync_timeout(Duration::from_secs(3));
    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        KubeconfigOptions::default().namespace(NAMESPACE.to_string()),
    ));
    let (manager, recorder) =
        recording_manager(Cluster::new("local", admin), provider.clone(), options);
    let (shutdown, task) = run_manager(&manager);
    recorder.wait_for_more(&req("healthy", "hello"), 0).await;

    // Unreachable ones first: the provider handles Secrets in order, so once
    // these are engaged every Secret before them has been looked at.
    for (name, _, outcome) in &cases {
        if let Outcome::Unreachable = outcome {
            wait_until_unreachable(&manager, name).await;
        }
    }
    for (name, _, outcome) in &cases {
        if let Outcome::Skipped = outcome {
            assert!(
                !provider.names().contains(&ClusterName::from(*name)),
                "{name} skipped"
            );
        }
    }
    assert_eq!(
        recorder.for_cluster("refused") + recorder.for_cluster("wrong-ca"),
        0
    );

    // The Secrets that could not become clusters are part of the fleet's
    // view, each with the reason naming its Secret, and in the metrics.
    let skipped: Vec<&str> = cases
        .iter()
        .filter(|(_, _, outcome)| matches!(outcome, Outcome::Skipped))
        .map(|(name, _, _)| *name)
        .collect();
    for name in &skipped {
        wait_for_fleet(&manager, &format!("{name} to be listed unusable"), || {
            matches!(
                manager.cluster_state(&ClusterName::from(*name)),
                Some(ClusterState::Unusable(_))
            )
        })
        .await;
        match manager.cluster_state(&ClusterName::from(*name)) {
            Some(ClusterState::Unusable(reason)) => assert!(
                reason.contains(&format!("Secret {NAMESPACE}/{name}")),
                "{name}: {reason}"
            ),
            other => panic!("{name}: {other:?}"),
        }
    }
    let mut fleet = manager.watch_fleet();
    assert_eq!(fleet.borrow().unusable, skipped.len());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    manager.serve_health(listener, shutdown.clone());
    let (_, clusters) = multicluster_runtime::testing::http_get(address, "/clusters")
        .await
        .expect("/clusters");
    for name in &skipped {
        assert!(
            clusters
                .lines()
                .any(|line| line.starts_with(&format!("{name}\tunusable: "))),
            "{clusters}"
        );
    }
    let metric = format!(
        "mcr_inventory_failures{{provider=\"{}\"}} {}",
        "kubeconfig",
        skipped.len()
    );
    assert!(
        manager
            .metrics()
            .encode()
            .lines()
            .any(|line| line == metric),
        "{metric} in:\n{}",
        manager.metrics().encode()
    );
    // Fixed, one leaves the unusable inventory; a subscriber is told.
    secrets
        .replace(
            "not-yaml",
            &PostParams::default(),
            &secret(
                "not-yaml",
                Some(&multicluster_envtest::to_yaml(&good).expect("yaml")),
                &[(DEFAULT_LABEL, "true")],
            ),
        )
        .await
        .expect("fix");
    tokio::time::timeout(
        multicluster_runtime::testing::DEFAULT_DEADLINE,
        fleet.wait_for(|summary| summary.unusable == skipped.len() - 1),
    )
    .await
    .expect("told within the deadline")
    .expect("the manager is there");
    recorder.wait_for_more(&req("not-yaml", "hello"), 0).await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A kubeconfig whose credential plugin fails at first (no token yet) is
/// tried again with backoff and engaged once the plugin works, with no
/// Secret event to prompt it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_whose_credential_plugin_fails_at_first_is_engaged_once_it_works() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    create(&member, "hello").await;
    management
        .create_namespace(NAMESPACE)
        .await
        .expect("namespace");
    let admin = management.client().await.expect("client");
    let state = tempfile::tempdir().expect("state");
    let kubeconfig = member.exec_kubeconfig("late", plugins::TOKEN, state.path());
    Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &secret(
                "late",
                Some(&multicluster_envtest::to_yaml(&kubeconfig).expect("yaml")),
                &[(DEFAULT_LABEL, "true")],
            ),
        )
        .await
        .expect("secret");

    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        with_test_plugin_allowed()
            .namespace(NAMESPACE.to_string())
            .retry(Backoff {
                base: Duration::from_millis(100),
                max: Duration::from_secs(1),
            }),
    ));
    let (manager, recorder) = recording_manager(
        Cluster::new("local", admin),
        provider.clone(),
        ManagerOptions::default(),
    );
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
    recorder.wait_for_more(&req("late", "hello"), 0).await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Starts a manager over a kubeconfig provider for the `fleet` namespace of
/// `management`, recording ConfigMap reconciles.
fn start_provider(
    admin: &kube::Client,
    options: KubeconfigOptions,
) -> (
    Arc<KubeconfigProvider>,
    Manager,
    Recorder,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), multicluster_runtime::Error>>,
) {
    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        options.namespace(NAMESPACE.to_string()),
    ));
    let (manager, recorder) = recording_manager(
        Cluster::new("local", admin.clone()),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    (provider, manager, recorder, shutdown, task)
}

/// A Secret whose credential plugin never answers (it waits for a login,
/// say) holds up only itself: Secrets created after it are engaged, one
/// deleted is removed; deleting its own Secret stops the plugin and its
/// process group at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_whose_plugin_hangs_holds_up_only_itself() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    create(&member, "hello").await;
    management
        .create_namespace(NAMESPACE)
        .await
        .expect("namespace");
    let admin = management.client().await.expect("client");
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    let labelled = [(DEFAULT_LABEL, "true")];
    let member_yaml = multicluster_envtest::to_yaml(member.kubeconfig()).expect("yaml");
    let state = tempfile::tempdir().expect("state");
    plugins::set_token(state.path(), "never-handed-out").expect("token");
    plugins::hold(state.path()).expect("hold");
    let stuck = member.exec_kubeconfig("stuck", plugins::TOKEN, state.path());
    for (name, text) in [
        (
            "stuck",
            multicluster_envtest::to_yaml(&stuck).expect("yaml"),
        ),
        ("before", member_yaml.clone()),
    ] {
        secrets
            .create(
                &PostParams::default(),
                &secret(name, Some(&text), &labelled),
            )
            .await
            .expect("secret");
    }

    let (provider, manager, recorder, shutdown, task) =
        start_provider(&admin, with_test_plugin_allowed());
    recorder.wait_for_more(&req("before", "hello"), 0).await;
    let plugin = plugins::first_call_running(state.path()).await;
    // Shown from the start, syncing, saying what it waits for, while its
    // plugin still runs (not only once the plugin's time is up).
    wait_for_fleet(&manager, "the stuck cluster shown syncing", || {
        manager.cluster_state(&ClusterName::from("stuck")) == Some(ClusterState::Syncing)
    })
    .await;
    let (_, stuck_status) = manager
        .cluster_states()
        .into_iter()
        .find(|(name, _)| name.as_str() == "stuck")
        .expect("listed");
    assert!(
        stuck_status
            .waiting_for
            .as_ref()
            .is_some_and(|what| what.contains("building its client from")),
        "{stuck_status:?}"
    );
    assert!(plugins::is_running(plugin), "shown while its plugin runs");

    secrets
        .create(
            &PostParams::default(),
            &secret("after", Some(&member_yaml), &labelled),
        )
        .await
        .expect("secret");
    recorder.wait_for_more(&req("after", "hello"), 0).await;
    secrets
        .delete("before", &DeleteParams::default())
        .await
        .expect("delete");
    wait_until_left(&manager, "before").await;
    assert_eq!(provider.names(), [ClusterName::from("after")]);
    assert!(plugins::is_running(plugin), "still waiting for its login");
    assert_eq!(
        manager.cluster_state(&ClusterName::from("stuck")),
        Some(ClusterState::Syncing),
        "still shown while it waits"
    );
    assert_eq!(plugins::pids(state.path()), [plugin], "run once");

    // Its Secret deleted: the plugin, and what it started, stop at once
    // (they ran until the plugin's deadline, 60 s); nothing is engaged.
    assert!(
        !plugins::group_members(plugin).is_empty(),
        "it leads its group"
    );
    secrets
        .delete("stuck", &DeleteParams::default())
        .await
        .expect("delete");
    plugins::wait_until_group_stopped(
        plugin,
        Duration::from_secs(5),
        "the deleted Secret's plugin",
    )
    .await;
    wait_for_fleet(&manager, "the stuck cluster to go from the list", || {
        manager.cluster_state(&ClusterName::from("stuck")).is_none()
    })
    .await;
    assert_eq!(provider.names(), [ClusterName::from("after")]);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The plugin runs once per client build: engaging the cluster, probing it
/// and reconciling in it use the token it handed out; a change to the
/// Secret's metadata builds nothing; new data builds (and runs) once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credential_plugin_runs_once_per_client_build() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    create(&member, "hello").await;
    management
        .create_namespace(NAMESPACE)
        .await
        .expect("namespace");
    let admin = management.client().await.expect("client");
    let state = tempfile::tempdir().expect("state");
    let token = member
        .cluster_admin_token("robots", "plugged")
        .await
        .expect("token");
    plugins::set_token(state.path(), &token).expect("token");
    let kubeconfig = member.exec_kubeconfig("plugged", plugins::TOKEN, state.path());
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    secrets
        .create(
            &PostParams::default(),
            &secret(
                "plugged",
                Some(&multicluster_envtest::to_yaml(&kubeconfig).expect("yaml")),
                &[(DEFAULT_LABEL, "true")],
            ),
        )
        .await
        .expect("secret");

    let (_provider, _manager, recorder, shutdown, task) =
        start_provider(&admin, with_test_plugin_allowed());
    recorder.wait_for_more(&req("plugged", "hello"), 0).await;
    assert_eq!(plugins::calls(state.path()).len(), 1);

    // Metadata only: no new client.
    let labelled = serde_json::json!({"metadata": {"labels": {"team": "a"}}});
    secrets
        .patch("plugged", &PatchParams::default(), &Patch::Merge(&labelled))
        .await
        .expect("label");
    // New data: one new client, one more plugin run.
    let before = recorder.count(&req("plugged", "hello"));
    let mut changed = kubeconfig.clone();
    changed.contexts[0].name = "renamed".into();
    changed.current_context = Some("renamed".into());
    let data = secret(
        "plugged",
        Some(&multicluster_envtest::to_yaml(&changed).expect("yaml")),
        &[(DEFAULT_LABEL, "true")],
    );
    secrets
        .patch("plugged", &PatchParams::default(), &Patch::Merge(&data))
        .await
        .expect("new data");
    eventually(
        Polled::OtherProcess,
        "the new kubeconfig to be built",
        || async { plugins::calls(state.path()).len() == 2 },
    )
    .await;
    recorder
        .wait_for_more(&req("plugged", "hello"), before)
        .await;
    assert_eq!(plugins::calls(state.path()).len(), 2);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// After an outage of the management API server, discovery resumes at once:
/// a Secret created as soon as the server is back is engaged within
/// seconds, not after a watch backoff that grew during the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_resumes_at_once_when_the_management_api_server_is_back() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    create(&member, "hello").await;
    management
        .create_namespace(NAMESPACE)
        .await
        .expect("namespace");
    let admin = management.client().await.expect("client");
    let member_yaml = multicluster_envtest::to_yaml(member.kubeconfig()).expect("yaml");
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    let labelled = [(DEFAULT_LABEL, "true")];
    secrets
        .create(
            &PostParams::default(),
            &secret("first", Some(&member_yaml), &labelled),
        )
        .await
        .expect("secret");
    let (_provider, _manager, recorder, shutdown, task) =
        start_provider(&admin, KubeconfigOptions::default());
    recorder.wait_for_more(&req("first", "hello"), 0).await;

    // The outage itself, not a wait for something.
    management.stop_api_server();
    tokio::time::sleep(Duration::from_secs(15)).await;
    management.start_api_server().await.expect("back");
    secrets
        .create(
            &PostParams::default(),
            &secret("second", Some(&member_yaml), &labelled),
        )
        .await
        .expect("secret");
    recorder
        .wait_until_within(
            Duration::from_secs(5),
            "the new Secret's cluster to be reconciled",
            |recorder| recorder.count(&req("second", "hello")) > 0,
        )
        .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The provider says its inventory is engaged (what a sharded replica
/// waits for before it joins its peers) once every Secret listed at the
/// start was looked at: the usable ones engaged, a broken one recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_is_engaged_once_every_listed_secret_was_looked_at() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_namespace(NAMESPACE).await.expect("namespace");
    let admin = cp.client().await.expect("client");
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    let yaml = multicluster_envtest::to_yaml(cp.kubeconfig()).expect("yaml");
    let labelled = [(DEFAULT_LABEL, "true")];
    let usable: Vec<String> = (0..40).map(|i| format!("member-{i}")).collect();
    for name in &usable {
        secrets
            .create(
                &PostParams::default(),
                &secret(name, Some(&yaml), &labelled),
            )
            .await
            .expect("secret");
    }
    secrets
        .create(&PostParams::default(), &secret("broken", None, &labelled))
        .await
        .expect("secret");
    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        KubeconfigOptions::default().namespace(NAMESPACE.to_string()),
    ));
    let (engaged, started) =
        multicluster_runtime::testing::engaged_when_inventory_is(provider).await;
    let mut expected: Vec<ClusterName> = usable
        .iter()
        .map(|name| ClusterName::from(name.as_str()))
        .collect();
    expected.sort();
    assert_eq!(
        engaged, expected,
        "said before every listed Secret was looked at"
    );
    started.stop().await.expect("clean stop");
}
