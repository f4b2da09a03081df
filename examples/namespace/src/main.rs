//! Every namespace of a cluster as a cluster, running the ConfigMap-copy
//! controller in each: label a ConfigMap `multicluster.example/sync=true` in
//! any namespace and a `<name>-copy` appears beside it and follows it.

use std::sync::Arc;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_example_configmap_sync::{
    CopyContext, MainError, ManagerArgs, NamespaceArgs, TraceArgs, reconcile, sync_filter,
};
use multicluster_provider_namespace::{NamespaceOptions, NamespaceProvider};
use multicluster_runtime::controller::{Controller, Watch};

/// Copy labelled ConfigMaps in every namespace, treating each namespace as a cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Only namespaces labelled cluster.x-k8s.io/watch-filter=<value> become clusters.
    #[arg(long, env = "WATCH_FILTER")]
    watch_filter: Option<String>,
    #[command(flatten)]
    namespaces: NamespaceArgs,
    #[command(flatten)]
    manager: ManagerArgs,
    #[command(flatten)]
    traces: TraceArgs,
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    let _traces =
        multicluster_example_configmap_sync::init_logging(&args.traces, env!("CARGO_PKG_NAME"))?;
    run(args).await
}

async fn run(args: Args) -> Result<(), MainError> {
    // The host cluster comes from $KUBECONFIG / ~/.kube/config / in-cluster.
    let provider = Arc::new(NamespaceProvider::new(
        kube::Client::try_default().await?,
        NamespaceOptions::default()
            .watch_filter(args.watch_filter)
            .namespace_selector(args.namespaces.selector()?),
    ));
    // The manager: the local cluster (the host, so both share its cache),
    // the fleet's provider, and (with --leader-elect) the Lease that
    // decides which replica works.
    let (manager, replica) = args.manager.builder(provider.host().clone())?;
    let manager = manager.provider(provider).build();
    // The controller: labelled ConfigMaps in every cluster, and the copies
    // they own; `reconcile` (shared by the examples) writes the copies.
    let controller = Controller::builder("configmap-copy")
        .for_resource(Watch::<ConfigMap>::new().filter(sync_filter()))
        .owns(Watch::<ConfigMap>::new())
        .max_concurrent_reconciles(4)
        .build_with_context(CopyContext::new(replica.as_deref()), reconcile)?;
    manager.add_controller(controller)?;
    tracing::info!("running; Ctrl-C stops");
    manager.run_until_signal().await?;
    Ok(())
}
