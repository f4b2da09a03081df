//! How a cache fills: by default from a streaming list (one watch that
//! starts with the current objects, as client-go does since Kubernetes
//! 1.35), with a list and a watch on servers that refuse it, and with a
//! list and a watch on request. The API server's own request counts say
//! which one happened: a streaming list is a watch, never a LIST.

mod common;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplate, PodTemplateSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::cache::{Cache, CacheEvent, CacheOptions};

/// PodTemplates: a type nothing in a bare control plane lists or watches,
/// so every LIST of it the API server counts is the test's.
fn template(name: &str) -> PodTemplate {
    PodTemplate {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        template: Some(PodTemplateSpec {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".to_string(),
                    image: Some("example.invalid/main".to_string()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..PodTemplateSpec::default()
        }),
    }
}

async fn create_template(cp: &ControlPlane, name: &str) {
    Api::<PodTemplate>::namespaced(cp.client().await.expect("client"), "default")
        .create(&PostParams::default(), &template(name))
        .await
        .expect("create PodTemplate");
}

/// LIST requests for PodTemplates the API server has answered so far.
async fn template_lists(cp: &ControlPlane) -> u64 {
    let client = cp.client().await.expect("client");
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let metrics = client
        .request_text(request)
        .await
        .expect("API server metrics");
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_request_total{")
                && line.contains("resource=\"podtemplates\"")
                && line.contains("verb=\"LIST\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Fills a cache of PodTemplates with `options`, checks it
/// holds what exists, then that a later object reaches it through the
/// watch; returns how many LISTs the API server answered meanwhile.
async fn fill_and_follow(cp: &ControlPlane, options: CacheOptions, suffix: &str) -> u64 {
    let existing = format!("existing-{suffix}");
    create_template(cp, &existing).await;
    let lists_before = template_lists(cp).await;
    let cache = Cache::with_options("test", cp.client().await.expect("client"), options);
    let informer = cache.informer::<PodTemplate>();
    cache
        .wait_for_sync(DEADLINE)
        .await
        .expect("the cache syncs");
    assert!(
        informer.get(Some("default"), &existing).is_some(),
        "{existing} is in the cache once it has synced"
    );
    let lists = template_lists(cp).await - lists_before;

    let mut changes = informer.subscribe();
    let later = format!("later-{suffix}");
    create_template(cp, &later).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let event = tokio::time::timeout_at(deadline, changes.next())
            .await
            .unwrap_or_else(|_| panic!("{later} reaches the cache before the deadline"))
            .expect("subscription open");
        if let CacheEvent::Applied { new, .. } = &event
            && new.metadata.name.as_deref() == Some(later.as_str())
        {
            break;
        }
    }
    cache.stop();
    lists
}

#[tokio::test]
async fn a_cache_fills_from_a_streaming_list_by_default_and_lists_on_request() {
    let cp = ControlPlane::start().await.expect("control plane");

    let streamed = fill_and_follow(&cp, CacheOptions::default(), "streamed").await;
    assert_eq!(
        streamed, 0,
        "with the default options the cache filled from its watch, without a LIST"
    );

    let listed = fill_and_follow(
        &cp,
        CacheOptions::default().streaming_lists(false),
        "listed",
    )
    .await;
    assert!(
        listed >= 1,
        "with streaming lists turned off the cache lists first ({listed} LISTs)"
    );
}

#[tokio::test]
async fn a_server_that_refuses_streaming_lists_is_listed_instead() {
    // Kubernetes 1.27 to 1.31 ship with WatchList off; such a server
    // refuses a watch that asks for the initial objects.
    let cp = ControlPlane::builder()
        .api_server_arg("--feature-gates=WatchList=false")
        .start()
        .await
        .expect("control plane without WatchList");

    let lists = fill_and_follow(&cp, CacheOptions::default(), "fallback").await;
    assert!(
        lists >= 1,
        "the cache fell back to a LIST and a watch ({lists} LISTs)"
    );
}
