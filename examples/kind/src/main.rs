//! The ConfigMap-copy controller over local kind clusters: label a ConfigMap
//! `multicluster.example/sync=true` in any kind cluster and a `<name>-copy`
//! appears beside it and follows it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_example_configmap_sync::{
    ClientArgs, CopyContext, MainError, ManagerArgs, TraceArgs, reconcile, sync_filter,
};
use multicluster_provider_kind::{KindOptions, KindProvider};
use multicluster_runtime::Cluster;
use multicluster_runtime::controller::{Controller, Watch};

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
    let provider = Arc::new(KindProvider::new(
        KindOptions::default()
            .prefix(args.prefix)
            .poll_interval(Duration::from_secs(args.poll_seconds))
            .kind_command(args.kind)
            .members(args.client.options()),
    ));
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
