//! The ConfigMap-copy controller over every context of kubeconfig files and
//! directories.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use multicluster_example_configmap_sync::{ClientArgs, MainError, ManagerArgs};
use multicluster_provider_file::{DEFAULT_SEPARATOR, FileOptions, FileProvider};
use multicluster_runtime::Cluster;

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
}

#[tokio::main]
async fn main() -> Result<(), MainError> {
    let args = Args::parse();
    multicluster_example_configmap_sync::init_logging();
    run(args).await
}

async fn run(args: Args) -> Result<(), MainError> {
    let provider = Arc::new(FileProvider::new(FileOptions {
        files: args.files,
        directories: args.directories,
        separator: args.separator,
        client: args.client.options(),
        ..FileOptions::default()
    }));
    // The local cluster is the current context of $KUBECONFIG / ~/.kube/config.
    let local = Cluster::new("local", kube::Client::try_default().await?);
    multicluster_example_configmap_sync::run(local, provider, &args.manager, None).await?;
    Ok(())
}
