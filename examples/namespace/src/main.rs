//! Every namespace of a cluster as a cluster, running the ConfigMap-copy
//! controller in each: label a ConfigMap `multicluster.example/sync=true` in
//! any namespace and a `<name>-copy` appears beside it and follows it.

use std::sync::Arc;

use clap::Parser;
use multicluster_example_configmap_sync::{MainError, ManagerArgs};
use multicluster_provider_namespace::{NamespaceOptions, NamespaceProvider};
use multicluster_runtime::Cluster;

/// Copy labelled ConfigMaps in every namespace, treating each namespace as a cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Only namespaces labelled cluster.x-k8s.io/watch-filter=<value> become clusters.
    #[arg(long, env = "WATCH_FILTER")]
    watch_filter: Option<String>,
    #[command(flatten)]
    manager: ManagerArgs,
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    multicluster_example_configmap_sync::init_logging();
    run(args).await
}

async fn run(args: Args) -> Result<(), MainError> {
    // The host cluster comes from $KUBECONFIG / ~/.kube/config / in-cluster.
    let host = Cluster::new("host", kube::Client::try_default().await?);
    let provider = Arc::new(NamespaceProvider::new(
        host.clone(),
        NamespaceOptions {
            watch_filter: args.watch_filter,
        },
    ));
    multicluster_example_configmap_sync::run(host, provider, &args.manager, None).await?;
    Ok(())
}
