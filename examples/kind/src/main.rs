//! The ConfigMap-copy controller over local kind clusters: label a ConfigMap
//! `multicluster.example/sync=true` in any kind cluster and a `<name>-copy`
//! appears beside it and follows it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use multicluster_example_configmap_sync::{ClientArgs, MainError, ManagerArgs};
use multicluster_provider_kind::{KindOptions, KindProvider};
use multicluster_runtime::Cluster;

/// Copy labelled ConfigMaps in every kind cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Only kind clusters whose name starts with this prefix.
    #[arg(long)]
    prefix: Option<String>,
    /// Seconds between `kind get clusters` polls.
    #[arg(long, default_value_t = 2)]
    poll_seconds: u64,
    /// The kind CLI.
    #[arg(long, default_value = "kind")]
    kind: PathBuf,
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
    let provider = Arc::new(KindProvider::new(KindOptions {
        prefix: args.prefix,
        poll_interval: Duration::from_secs(args.poll_seconds),
        kind_command: args.kind,
        client: args.client.options(),
        ..KindOptions::default()
    }));
    let local = Cluster::new("local", kube::Client::try_default().await?);
    multicluster_example_configmap_sync::run(local, provider, &args.manager, None).await?;
    Ok(())
}
