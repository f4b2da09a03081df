//! A validating admission webhook for a whole fleet: every member cluster
//! (one per kubeconfig Secret on the hub, the cluster `$KUBECONFIG` points
//! at) refuses ConfigMaps without the `fleet.example/owner` label, and a
//! member that joins later is registered (its
//! `ValidatingWebhookConfiguration` points at its own path on this server)
//! as soon as it is engaged; one that leaves is unregistered.
//!
//! One server answers every member: each request is handled with the
//! cluster it came from. The certificate (`tls.crt`, `tls.key`, and the
//! `ca.crt` that signed it, as cert-manager writes them) is read from
//! `--cert-dir` and read again when it is replaced.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use multicluster_example_configmap_sync::{
    ClientArgs, MainError, ManagerArgs, PolicyArgs, TraceArgs,
};
use multicluster_provider_kubeconfig::{KubeconfigOptions, KubeconfigProvider};
use multicluster_runtime::{Cluster, Manager};
use multicluster_webhook::{
    Registration, RegistrationOptions, Webhook, WebhookServer, WebhookServerOptions,
};
use tokio_util::sync::CancellationToken;

/// The label every ConfigMap in a member must carry.
const OWNER_LABEL: &str = "fleet.example/owner";

/// Refuse ConfigMaps without an owner label in every member cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Namespace of the members' kubeconfig Secrets on the hub; every namespace when unset.
    #[arg(long, env = "NAMESPACE")]
    namespace: Option<String>,
    /// Where the webhook server listens.
    #[arg(long, env = "WEBHOOK_ADDRESS", default_value = "0.0.0.0:9443")]
    webhook_address: SocketAddr,
    /// How the members' API servers reach this server (https://host:port).
    #[arg(long, env = "WEBHOOK_URL")]
    webhook_url: String,
    /// Directory holding tls.crt, tls.key and ca.crt.
    #[arg(
        long,
        env = "CERT_DIR",
        default_value = "/tmp/k8s-webhook-server/serving-certs"
    )]
    cert_dir: PathBuf,
    /// What a member's API server does when this server cannot answer:
    /// Fail (refuse the write: the policy holds during an outage) or Ignore.
    #[arg(long, default_value = "Fail")]
    failure_policy: String,
    /// Namespaces whose writes are never sent to this server, so an outage
    /// cannot block them (repeat the flag for several). The namespace in
    /// POD_NAMESPACE, this server's own when it runs in a member, is added.
    #[arg(long = "exempt-namespace", default_value = "kube-system")]
    exempt_namespaces: Vec<String>,
    #[command(flatten)]
    manager: ManagerArgs,
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    #[command(flatten)]
    traces: TraceArgs,
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// Admits ConfigMaps with an owner label, and those Kubernetes itself
/// writes (`kube-root-ca.crt`, the `kube-*` namespaces).
async fn owner_label(
    cluster: Cluster,
    request: AdmissionRequest<ConfigMap>,
) -> Result<AdmissionResponse, Never> {
    let response = AdmissionResponse::from(&request);
    let Some(object) = &request.object else {
        return Ok(response);
    };
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let kubernetes_own = namespace.starts_with("kube-") || object.name_any() == "kube-root-ca.crt";
    if kubernetes_own || object.labels().contains_key(OWNER_LABEL) {
        return Ok(response);
    }
    Ok(response.deny(format!(
        "ConfigMap {namespace}/{} in cluster {} has no {OWNER_LABEL} label",
        object.name_any(),
        cluster.name()
    )))
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    let _traces =
        multicluster_example_configmap_sync::init_logging(&args.traces, env!("CARGO_PKG_NAME"))?;

    let hub = Cluster::local(kube::Client::try_default().await?);
    let provider = Arc::new(KubeconfigProvider::new(
        hub.client(),
        KubeconfigOptions::default()
            .namespace(args.namespace)
            .members(args.client.options())
            .kubeconfig_policy(args.policy.policy()?),
    ));
    let (manager, _replica) = args.manager.builder(hub)?;
    let manager: Manager = manager.provider(provider).build();

    let server = WebhookServer::new(
        WebhookServerOptions::default()
            .certificate(args.cert_dir.join("tls.crt"), args.cert_dir.join("tls.key")),
    )?;
    // Bound before anything runs: an address in use stops the example.
    let listener = tokio::net::TcpListener::bind(args.webhook_address)
        .await
        .map_err(|err| format!("webhook server: binding {}: {err}", args.webhook_address))?;
    server.add(Webhook::validating("owner-label", owner_label))?;
    server.use_metrics(manager.metrics());
    let mut registration = RegistrationOptions::new(args.webhook_url, args.cert_dir.join("ca.crt"));
    registration.failure_policy = args.failure_policy;
    registration.exempt_namespaces = args.exempt_namespaces;
    if let Ok(own) = std::env::var("POD_NAMESPACE")
        && !own.is_empty()
        && !registration.exempt_namespaces.contains(&own)
    {
        registration.exempt_namespaces.push(own);
    }
    let registration = Registration::new(&manager, &server, registration)?;
    manager.add(Arc::new(server.clone()))?;
    manager.add(Arc::new(registration))?;

    // The server stops after the manager: requests under way are answered.
    let stop_serving = CancellationToken::new();
    let serving = tokio::spawn({
        let (server, stop) = (server.clone(), stop_serving.clone());
        async move { server.serve(listener, stop).await }
    });
    tracing::info!("serving webhooks; Ctrl-C stops");
    let result = manager.run_until_signal().await;
    stop_serving.cancel();
    serving.await?;
    result?;
    Ok(())
}
