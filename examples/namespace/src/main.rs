//! Every namespace of a cluster as a cluster, running the ConfigMap-copy
//! controller in each: label a ConfigMap `multicluster.example/sync=true` in
//! any namespace and a `<name>-copy` appears beside it and follows it.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use multicluster_provider_namespace::{NamespaceOptions, NamespaceProvider};
use multicluster_runtime::Cluster;

/// Copy labelled ConfigMaps in every namespace, treating each namespace as a cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Only namespaces labelled cluster.x-k8s.io/watch-filter=<value> become clusters.
    #[arg(long, env = "WATCH_FILTER")]
    watch_filter: Option<String>,
    /// Serve /healthz, /readyz, /metrics and /clusters here.
    #[arg(long, default_value = "127.0.0.1:8081")]
    health_address: SocketAddr,
}

fn main() -> Result<(), multicluster_example_configmap_sync::MainError> {
    multicluster_example_configmap_sync::block_on(run())
}

async fn run() -> Result<(), multicluster_example_configmap_sync::MainError> {
    multicluster_example_configmap_sync::init_logging();
    let args = Args::parse();
    // The host cluster comes from $KUBECONFIG / ~/.kube/config / in-cluster.
    let host = Cluster::new("host", kube::Client::try_default().await?);
    let provider = Arc::new(NamespaceProvider::new(
        host.clone(),
        NamespaceOptions {
            watch_filter: args.watch_filter,
        },
    ));
    multicluster_example_configmap_sync::run(host, provider, args.health_address, None).await?;
    Ok(())
}
