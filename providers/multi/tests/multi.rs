//! Several providers under one fleet: prefixed names, providers added and
//! removed at runtime, indexes reaching providers added later.

use multicluster_runtime::testing::Polled;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_envtest::ControlPlane;
use multicluster_provider_clusters::ClustersProvider;
use multicluster_provider_multi::MultiProvider;
use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::controller::Request;
use multicluster_runtime::testing::{recording_manager, run_manager, wait_until_left};
use multicluster_runtime::{Cluster, ClusterName, Error, ManagerOptions, Provider};

async fn create(cp: &ControlPlane, name: &str, color: &str) {
    cp.create_config_map(name, &[("color", color)])
        .await
        .expect("create");
}

fn by_color() -> FieldIndex {
    FieldIndex::new::<ConfigMap>("data.color", |cm: &ConfigMap| {
        cm.data
            .as_ref()
            .and_then(|d| d.get("color").cloned())
            .into_iter()
            .collect()
    })
}

fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_share_a_fleet_under_prefixed_names() {
    let (east, west) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (east, west) = (east.expect("east"), west.expect("west"));
    create(&east, "in-east", "blue").await;
    create(&west, "in-west", "blue").await;

    let multi = Arc::new(MultiProvider::new());
    // Registered before any provider exists: must reach providers added later.
    multi.index_field(by_color()).await.expect("index");

    // The same inner name, "member", in two providers.
    let first = Arc::new(ClustersProvider::new());
    first
        .add(
            "member",
            Cluster::new("member", east.client().await.expect("client")),
        )
        .expect("add");
    multi
        .add_runnable("first", first.clone())
        .await
        .expect("add first");
    assert!(
        multi.add_runnable("first", first.clone()).await.is_err(),
        "duplicate provider name"
    );
    assert!(
        multi.add_runnable("bad#name", first.clone()).await.is_err(),
        "separator in name"
    );

    let (manager, recorder) = recording_manager(
        Cluster::new("local", east.client().await.expect("client")),
        multi.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("first#member", "in-east"), 0)
        .await;

    // A provider added after start is started.
    let second = Arc::new(ClustersProvider::new());
    second
        .add(
            "member",
            Cluster::new("member", west.client().await.expect("client")),
        )
        .expect("add");
    multi
        .add_runnable("second", second.clone())
        .await
        .expect("add second");
    recorder
        .wait_for_more(&req("second#member", "in-west"), 0)
        .await;
    assert_eq!(
        recorder.count(&req("second#member", "in-east")),
        0,
        "names stay distinct"
    );
    assert_eq!(
        recorder.count(&req("first#member", "in-west")),
        0,
        "names stay distinct"
    );
    assert_eq!(multi.provider_names(), ["first", "second"]);

    // Lookups split at the first separator; the index reached both.
    let west_member = multi
        .get(&ClusterName::from("second#member"))
        .await
        .expect("get");
    let blue = west_member
        .cache()
        .by_index::<ConfigMap>("data.color", "blue", None)
        .await
        .expect("query");
    assert_eq!(
        blue.iter()
            .filter_map(|cm| cm.metadata.name.clone())
            .collect::<Vec<_>>(),
        ["in-west"]
    );
    for missing in ["nobody#member", "second#nobody", "no-separator"] {
        assert!(
            matches!(multi.get(&ClusterName::from(missing)).await, Err(Error::ClusterNotFound(name)) if name.as_str() == missing),
            "{missing}"
        );
    }

    // Removing a provider stops it and disengages its clusters.
    assert!(multi.remove("first"));
    wait_until_left(&manager, "first#member").await;
    assert!(matches!(
        multi.get(&ClusterName::from("first#member")).await,
        Err(Error::ClusterNotFound(_))
    ));
    create(&east, "after-removal", "red").await;
    create(&west, "marker", "red").await;
    recorder
        .wait_for_more(&req("second#member", "marker"), 0)
        .await;
    assert_eq!(recorder.count(&req("first#member", "after-removal")), 0);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test]
async fn the_separator_is_configurable() {
    let multi = MultiProvider::with_separator("/");
    let inner = Arc::new(ClustersProvider::new());
    let cluster = multicluster_runtime::testing::offline_cluster("c");
    inner.add("c", cluster.clone()).expect("add");
    multi.add_runnable("p", inner).await.expect("add");
    assert!(
        multi
            .get(&ClusterName::from("p/c"))
            .await
            .expect("get")
            .same_instance(&cluster)
    );
    assert!(matches!(
        multi.get(&ClusterName::from("p#c")).await,
        Err(Error::ClusterNotFound(_))
    ));
}

#[tokio::test]
async fn bad_and_duplicate_provider_names_are_typed_errors() {
    let multi = MultiProvider::with_separator("/");
    let inner = Arc::new(ClustersProvider::new());
    multi.add_runnable("p", inner.clone()).await.expect("add");
    assert!(matches!(
        multi.add_runnable("p", inner.clone()).await,
        Err(Error::ProviderExists(name)) if name == "p"
    ));
    assert!(matches!(
        multi.add_runnable("a/b", inner).await,
        Err(Error::InvalidOptions { reason, .. }) if reason.contains("separator")
    ));
}

/// A Secret labelled for the kubeconfig provider in `namespace`, holding
/// `text` as its kubeconfig.
fn kubeconfig_secret(
    namespace: &str,
    name: &str,
    text: &str,
) -> k8s_openapi::api::core::v1::Secret {
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some(name.into());
    secret.metadata.namespace = Some(namespace.into());
    secret.metadata.labels = Some(
        [(
            multicluster_provider_kubeconfig::DEFAULT_LABEL.to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    secret.data = Some(
        [(
            multicluster_provider_kubeconfig::DEFAULT_DATA_KEY.to_string(),
            k8s_openapi::ByteString(text.as_bytes().to_vec()),
        )]
        .into(),
    );
    secret
}

/// Two kubeconfig providers (one namespace each) in one multi provider,
/// with one metrics registry: named apart, their controllers, reconciles
/// and failures are counted apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_of_one_provider_keep_their_figures_apart() {
    use multicluster_provider_kubeconfig::{KubeconfigOptions, KubeconfigProvider};
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    create(&member, "hello", "blue").await;
    let admin = management.client().await.expect("client");
    let good = multicluster_envtest::to_yaml(member.kubeconfig()).expect("yaml");
    for team in ["team-a", "team-b"] {
        management.create_namespace(team).await.expect("namespace");
        kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), team)
            .create(
                &kube::api::PostParams::default(),
                &kubeconfig_secret(team, "good", &good),
            )
            .await
            .expect("secret");
    }
    kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), "team-a")
        .create(
            &kube::api::PostParams::default(),
            &kubeconfig_secret("team-a", "broken", "{{{ not yaml"),
        )
        .await
        .expect("secret");

    let multi = Arc::new(MultiProvider::new());
    for team in ["team-a", "team-b"] {
        let provider = Arc::new(KubeconfigProvider::new(
            admin.clone(),
            KubeconfigOptions::default()
                .name(team)
                .namespace(team.to_string()),
        ));
        multi.add_runnable(team, provider).await.expect("add");
    }
    let (manager, recorder) = recording_manager(
        Cluster::local(admin),
        multi.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("team-a#good", "hello"), 0)
        .await;
    recorder
        .wait_for_more(&req("team-b#good", "hello"), 0)
        .await;
    // The metrics registry tells no one of a change.
    multicluster_runtime::testing::eventually(Polled::Unsignalled, "team-a's broken Secret to be counted", || async {
        manager.metrics().encode().lines().any(|line| {
            line == "mcr_cluster_engagement_failures_total{provider=\"team-a\",reason=\"invalid-kubeconfig\"} 1"
        })
    })
    .await;
    let metrics = manager.metrics().encode();
    assert!(
        !metrics
            .lines()
            .any(|line| line
                .starts_with("mcr_cluster_engagement_failures_total{provider=\"team-b\"")),
        "{metrics}"
    );
    for team in ["team-a", "team-b"] {
        assert!(
            metrics.lines().any(|line| line.starts_with(&format!(
                "controller_runtime_reconcile_total{{controller=\"{team}-provider\""
            ))),
            "{team}'s reconciles in:\n{metrics}"
        );
    }
    assert!(
        metrics
            .lines()
            .any(|line| line == "mcr_inventory_failures{provider=\"team-a\"} 1"),
        "{metrics}"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A provider with no clusters that says its inventory is engaged when the
/// test lets it (`release`), then fires `said`.
#[derive(Debug, Default)]
struct Held {
    clusters: multicluster_runtime::provider::clusters::Clusters,
    release: tokio_util::sync::CancellationToken,
    said: tokio_util::sync::CancellationToken,
}

impl multicluster_runtime::provider::clusters::ClusterSetProvider for Held {
    fn cluster_set(&self) -> &multicluster_runtime::provider::clusters::Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl multicluster_runtime::RunnableProvider for Held {
    async fn start(
        &self,
        context: multicluster_runtime::ProviderContext,
    ) -> Result<multicluster_runtime::InventoryEngaged, Error> {
        let engaged = tokio::select! {
            () = self.release.cancelled() => context.inventory_engaged(),
            () = context.shutdown.cancelled() => return Ok(context.stopped_before_engaged()),
        };
        self.said.cancel();
        context.shutdown.cancelled().await;
        Ok(engaged)
    }
}

/// The multi provider's inventory is engaged once that of every provider
/// it started with is, not at the first one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_is_engaged_once_every_provider_says_so() {
    let multi = Arc::new(MultiProvider::new());
    let (first, second) = (Arc::new(Held::default()), Arc::new(Held::default()));
    multi
        .add_runnable("first", first.clone())
        .await
        .expect("add");
    multi
        .add_runnable("second", second.clone())
        .await
        .expect("add");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let context = multicluster_runtime::ProviderContext::new(
        shutdown.clone(),
        Arc::new(multicluster_runtime::testing::EngagedNames::default()),
        multicluster_runtime::metrics::Metrics::default(),
    );
    let started = tokio::spawn({
        let (multi, context) = (multi.clone(), context.clone());
        async move {
            use multicluster_runtime::RunnableProvider;
            multi.start(context).await
        }
    });
    first.release.cancel();
    first.said.cancelled().await;
    assert!(
        !context.is_inventory_engaged(),
        "engaged when only the first provider said so"
    );
    second.release.cancel();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        context.when_inventory_engaged(),
    )
    .await
    .expect("never engaged after both said so");
    shutdown.cancel();
    started.await.expect("task").expect("clean stop");
}
