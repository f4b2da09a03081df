//! The per-cluster cache against a real API server: shared informers,
//! dynamic and metadata-only watches, late subscribers, managed fields, and a
//! namespace restriction that works with RBAC for that namespace only.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, GroupVersionKind, PartialObjectMeta, PostParams};
use multicluster_envtest::{ControlPlane, config_map_rules};
use multicluster_runtime::Error;
use multicluster_runtime::cache::{Cache, CacheEvent, CacheOptions};

async fn next_event<K>(
    subscription: &mut multicluster_runtime::cache::Subscription<K>,
) -> CacheEvent<K> {
    tokio::time::timeout(DEADLINE, subscription.next())
        .await
        .expect("an event before the deadline")
        .expect("subscription open")
}

fn name_of<K: kube::Resource>(event: &CacheEvent<K>) -> String {
    event.object().meta().name.clone().unwrap_or_default()
}

#[tokio::test]
async fn informers_are_shared_and_late_subscribers_see_current_contents_first() {
    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "first", &[("k", "v")]).await;
    // Limited to `default`, where only the test's objects live.
    let cache = Cache::with_options(
        "test",
        cp.client().await.expect("client"),
        CacheOptions::default().namespace("default".to_string()),
    );

    let informer = cache.informer::<ConfigMap>();
    assert!(
        Arc::ptr_eq(&informer, &cache.informer::<ConfigMap>()),
        "one watch per type"
    );
    let dynamic = cache.dynamic(&ApiResource::from_gvk(&GroupVersionKind::gvk(
        "",
        "v1",
        "ConfigMap",
    )));
    let metadata = cache.metadata::<ConfigMap>();
    assert!(
        Arc::ptr_eq(&metadata, &cache.informer::<PartialObjectMeta<ConfigMap>>()),
        "one metadata-only watch, however it is asked for"
    );
    assert_eq!(cache.informer_count(), 3);
    cache.wait_for_sync(DEADLINE).await.expect("sync");
    assert!(informer.is_ready() && dynamic.is_ready() && metadata.is_ready());

    // Managed fields are stripped by default; metadata-only objects carry
    // no data.
    let first = informer.get(Some("default"), "first").expect("cached");
    assert!(
        first
            .metadata
            .managed_fields
            .as_ref()
            .is_none_or(Vec::is_empty)
    );
    assert_eq!(
        first
            .data
            .as_ref()
            .and_then(|d| d.get("k"))
            .map(String::as_str),
        Some("v")
    );
    let meta = metadata
        .get(Some("default"), "first")
        .expect("cached metadata");
    assert_eq!(meta.metadata.name.as_deref(), Some("first"));
    // The server sent metadata only (a full object would say ConfigMap).
    assert_eq!(
        meta.types.as_ref().map(|types| types.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    let dynamic_first = dynamic
        .get(Some("default"), "first")
        .expect("cached dynamic");
    assert_eq!(dynamic_first.data["data"]["k"], "v");

    // A subscriber joining now gets "first" at once, then later changes.
    let mut late = informer.subscribe();
    let initial = next_event(&mut late).await;
    assert!(matches!(&initial, CacheEvent::Applied { old: None, .. }));
    assert_eq!(name_of(&initial), "first");
    create_config_map(&cp, "second", &[]).await;
    let created = next_event(&mut late).await;
    assert_eq!(name_of(&created), "second");
    Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default")
        .delete("second", &Default::default())
        .await
        .expect("delete");
    let deleted = next_event(&mut late).await;
    assert!(matches!(&deleted, CacheEvent::Deleted(_)));
    assert_eq!(name_of(&deleted), "second");

    // Stopping the cache ends subscriptions.
    cache.stop();
    let ended = tokio::time::timeout(DEADLINE, late.next())
        .await
        .expect("ends");
    assert!(ended.is_none());
}

#[tokio::test]
async fn a_namespace_restricted_cache_needs_rbac_for_that_namespace_only() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client().await.expect("client");
    for ns in ["tenant-a", "tenant-b"] {
        cp.create_namespace(ns).await.expect("namespace");
        Api::<ConfigMap>::namespaced(admin.clone(), ns)
            .create(
                &PostParams::default(),
                &config_map(&format!("in-{ns}"), &[]),
            )
            .await
            .expect("config map");
    }
    cp.grant_in_namespace(
        "tenant-a",
        "tenant",
        config_map_rules(&["get", "list", "watch"]),
    )
    .await
    .expect("role");
    let tenant =
        multicluster_envtest::client_for(&cp.user_kubeconfig("tenant", None).expect("kubeconfig"))
            .await
            .expect("client");

    let restricted = Cache::with_options(
        "tenant",
        tenant.clone(),
        CacheOptions::default().namespace("tenant-a".to_string()),
    );
    let objects = restricted.list::<ConfigMap>(None).await.expect("list");
    let names: Vec<_> = objects
        .iter()
        .filter_map(|cm| cm.metadata.name.clone())
        .collect();
    assert_eq!(names, ["in-tenant-a"]);

    // Without the restriction the same identity cannot watch, and the error
    // says why.
    let unrestricted = Cache::new("tenant-everywhere", tenant);
    unrestricted.informer::<ConfigMap>();
    let err = unrestricted
        .wait_for_sync(Duration::from_secs(5))
        .await
        .expect_err("forbidden cluster-wide");
    assert!(matches!(&err, Error::NotReady { .. }), "{err}");
    assert!(err.to_string().contains("tenant-everywhere"), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("forbidden"),
        "{err}"
    );
}

/// A read through a cache whose watch cannot list fails after the cache's
/// own `sync_wait`, naming it, rather than a fixed 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waits_for_its_first_list_as_long_as_the_cache_says() {
    let cp = ControlPlane::start().await.expect("control plane");
    // An identity without any grant: its watches are refused.
    let nobody =
        multicluster_envtest::client_for(&cp.user_kubeconfig("nobody", None).expect("kubeconfig"))
            .await
            .expect("client");
    let cache = Cache::with_options(
        "nobody",
        nobody,
        CacheOptions::default().sync_wait(Duration::from_secs(2)),
    );
    let err = cache
        .list::<ConfigMap>(None)
        .await
        .expect_err("refused watches never list");
    match &err {
        Error::NotReady { timeout, .. } => assert_eq!(*timeout, Duration::from_secs(2), "{err}"),
        other => panic!("not NotReady: {other}"),
    }
    assert!(err.to_string().contains("nobody"), "{err}");
}

/// A controller can reconcile a type it watches metadata-only: its source
/// shares the cache's metadata informer, and owned objects are found by
/// their owner references, which are metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_reconciles_a_type_watched_metadata_only() {
    use multicluster_runtime::controller::{ClusterScope, Request, Watch};
    use multicluster_runtime::testing::{Recorder, recording_controller, run_manager};
    use multicluster_runtime::{Cluster, Manager};

    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "seen", &[("big", "value")]).await;
    let local = Cluster::new("local", cp.client().await.expect("client"));
    let manager = Manager::builder(local.clone()).build();
    let recorder = Recorder::default();
    manager
        .add_controller(
            recording_controller(
                "metadata",
                Watch::<PartialObjectMeta<ConfigMap>>::new().clusters(ClusterScope::Local),
                &recorder,
            )
            .expect("controller"),
        )
        .expect("add");
    let (stop, task) = run_manager(&manager);
    let seen = Request::new(
        multicluster_runtime::ClusterName::local(),
        Some("default"),
        "seen",
    );
    recorder.wait_for_more(&seen, 0).await;
    let cached = local
        .cache()
        .metadata::<ConfigMap>()
        .get(Some("default"), "seen")
        .expect("cached");
    assert_eq!(
        cached.types.as_ref().map(|types| types.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    // Only the metadata watch runs: no full ConfigMap watch was started.
    assert_eq!(local.cache().informer_count(), 1);
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A watch left on an HTTP/1.1 connection that silently stopped carrying
/// anything (no pings) starts over because kube-runtime's watcher gives up
/// one silent for its `timeoutSeconds` and 5 s more. That is safe only if a
/// working watch is never that quiet: the API server ends every watch at
/// its `timeoutSeconds`, events or not (bookmarks need not come: a watch
/// served from etcd hears nothing for up to 10 minutes). Checked on a quiet
/// watch through a client built from a kubeconfig: it ends cleanly at its
/// timeout.
#[tokio::test]
async fn the_server_ends_a_quiet_watch_at_its_timeout() {
    use kube::api::WatchParams;
    let cp = ControlPlane::start().await.expect("control plane");
    let client = multicluster_runtime::client::build(
        cp.kubeconfig(),
        None,
        "the test's kubeconfig",
        &multicluster_runtime::client::KubeconfigPolicy::trusted(),
        &multicluster_runtime::client::ClientOptions::default(),
    )
    .await
    .expect("client");
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let version = api
        .list_metadata(&Default::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("a resource version");
    let started = tokio::time::Instant::now();
    let events = api
        .watch(&WatchParams::default().timeout(5), &version)
        .await
        .expect("watch");
    let events: Vec<_> = tokio::time::timeout(Duration::from_secs(30), events.collect())
        .await
        .expect("ended by the server within 30 s");
    let ended = started.elapsed();
    assert!(
        ended >= Duration::from_secs(4) && ended < Duration::from_secs(20),
        "ended after {ended:?}"
    );
    assert!(
        events.iter().all(Result::is_ok),
        "ended cleanly by the server: {events:?}"
    );
}
