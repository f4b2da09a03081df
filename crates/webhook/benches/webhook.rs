//! Admission webhook latency: WEBHOOK_REQUESTS (default 1,000) dry-run
//! ConfigMap creates, one after another, in a member whose API server
//! calls our webhook server (a validating webhook that admits everything)
//! over HTTPS on loopback; then as many without the webhook registered.
//! Reports the creates' latency with and without it (p50 / p99, as the
//! caller sees them), the server's own time per request (from
//! `mcr_webhook_request_duration_seconds`) and the API server's time per
//! webhook call (`apiserver_admission_webhook_admission_duration_seconds`),
//! both as the histogram bucket holding the percentile.
//!
//! Run with `make bench` or `cargo bench -p multicluster-runtime --bench webhook`.

use multicluster_runtime::testing::Polled;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use multicluster_envtest::{ControlPlane, ServingFiles};
use multicluster_runtime::testing::{TestProvider, eventually, run_manager};
use multicluster_runtime::{Cluster, Manager};
use multicluster_webhook::{
    Registration, RegistrationOptions, Webhook, WebhookServer, WebhookServerOptions,
};

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

async fn creates(client: &kube::Client, count: usize) -> Vec<Duration> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut took = Vec::with_capacity(count);
    for i in 0..count {
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("bench-{i}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let started = Instant::now();
        api.create(&dry_run, &object).await.expect("create");
        took.push(started.elapsed());
    }
    took.sort();
    took
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// The upper bound of the bucket holding percentile `p` of histogram
/// `metric`, over its bucket lines (cumulative) carrying every one of
/// `labels`.
fn bucket_percentile(text: &str, metric: &str, labels: &[&str], p: f64) -> Option<String> {
    let buckets: Vec<(String, f64)> = text
        .lines()
        .filter(|line| line.starts_with(&format!("{metric}_bucket{{")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| {
            let le = line.split("le=\"").nth(1)?.split('"').next()?.to_string();
            let count = line.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    let total = buckets.last()?.1;
    buckets
        .iter()
        .find(|(_, count)| *count >= total * p)
        .map(|(le, _)| format!("≤ {le} s"))
}

#[tokio::main]
async fn main() {
    let count: usize = std::env::var("WEBHOOK_REQUESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let member = ControlPlane::start().await.expect("member");
    let client = member.client().await.expect("client");
    let certificates = tempfile::tempdir().expect("dir");
    let files = ServingFiles::generate(certificates.path()).expect("certificates");

    let provider = Arc::new(TestProvider::default());
    provider
        .clusters
        .add("member", Cluster::new("member", client.clone()))
        .expect("add");
    let manager = Manager::builder(Cluster::local(client.clone()))
        .provider(provider)
        .build();
    let server =
        WebhookServer::new(WebhookServerOptions::default().certificate(&files.cert, &files.key))
            .expect("server");
    server
        .add(Webhook::validating(
            "allow",
            |_: Cluster, request: AdmissionRequest<ConfigMap>| async move {
                Ok::<_, Never>(AdmissionResponse::from(&request))
            },
        ))
        .expect("webhook");
    server.use_metrics(manager.metrics());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let registration = Registration::new(
        &manager,
        &server,
        RegistrationOptions::new(format!("https://127.0.0.1:{port}"), &files.ca),
    )
    .expect("registration");
    manager.add(Arc::new(server.clone())).expect("add");
    manager.add(Arc::new(registration)).expect("add");
    let (shutdown, task) = run_manager(&manager);
    let serving = tokio::spawn({
        let (server, shutdown) = (server.clone(), shutdown.clone());
        async move { server.serve(listener, shutdown).await }
    });
    let configurations = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    eventually(
        Polled::ApiServer,
        "the webhook registered and answering",
        || async {
            configurations
                .get_opt("multicluster-runtime-webhooks")
                .await
                .ok()
                .flatten()
                .is_some()
                && manager
                    .metrics()
                    .encode()
                    .contains(r#"mcr_webhook_requests_total{webhook="allow",result="allowed"}"#)
                || {
                    let _ = creates(&client, 1).await;
                    false
                }
        },
    )
    .await;

    let with = creates(&client, count).await;
    let ours = manager.metrics().encode();
    let theirs = client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("API server metrics");
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
    serving.await.expect("server");
    configurations
        .delete("multicluster-runtime-webhooks", &DeleteParams::default())
        .await
        .expect("unregister");
    let without = creates(&client, count).await;

    println!("webhook latency, {count} dry-run creates one after another:");
    for (what, sorted) in [("with the webhook", &with), ("without", &without)] {
        println!(
            "  {what}: p50 {:.2} ms, p99 {:.2} ms",
            percentile(sorted, 0.5).as_secs_f64() * 1000.0,
            percentile(sorted, 0.99).as_secs_f64() * 1000.0
        );
    }
    let server_side = (
        "mcr_webhook_request_duration_seconds",
        &[r#"webhook="allow""#][..],
    );
    let api_side = (
        "apiserver_admission_webhook_admission_duration_seconds",
        &[
            r#"name="allow.webhooks.multicluster-runtime.io""#,
            r#"operation="CREATE""#,
            r#"type="validating""#,
        ][..],
    );
    for (what, text, (metric, labels)) in [
        ("our server, per request", &ours, server_side),
        ("the API server, per webhook call", &theirs, api_side),
    ] {
        println!(
            "  {what}: p50 {}, p99 {}",
            bucket_percentile(text, metric, labels, 0.5).unwrap_or_else(|| "?".into()),
            bucket_percentile(text, metric, labels, 0.99).unwrap_or_else(|| "?".into())
        );
    }
}
