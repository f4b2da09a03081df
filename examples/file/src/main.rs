//! The ConfigMap-copy controller over every context of kubeconfig files and
//! directories.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_example_configmap_sync::{
    ClientArgs, CopyContext, MainError, ManagerArgs, TraceArgs, reconcile, sync_filter,
};
use multicluster_provider_file::{DEFAULT_SEPARATOR, FileOptions, FileProvider};
use multicluster_runtime::Cluster;
use multicluster_runtime::controller::{Controller, Watch};

/// Copy labelled ConfigMaps in every context of the given kubeconfigs.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// A kubeconfig file (repeatable).
    #[arg(long = "file")]
    files: Vec<PathBuf>,
    /// A directory searched for kubeconfig files (repeatable).
    #[arg(long = "directory")]
    directories: Vec<PathBuf>,
    /// Separator between path and context in cluster names.
    #[arg(long, default_value = DEFAULT_SEPARATOR)]
    separator: String,
    #[command(flatten)]
    manager: ManagerArgs,
    #[command(flatten)]
    client: ClientArgs,
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
    let provider = Arc::new(FileProvider::new(
        FileOptions::default()
            .files(args.files)
            .directories(args.directories)
            .separator(args.separator)
            .members(args.client.options()),
    ));
    // The local cluster is the current context of $KUBECONFIG / ~/.kube/config.
    let local = Cluster::local(kube::Client::try_default().await?);
    // The manager: the local cluster, the fleet's provider, and (with
    // --leader-elect) the Lease that decides which replica works.
    let (manager, replica) = args.manager.builder(local)?;
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
