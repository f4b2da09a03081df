//! The ConfigMap-copy controller over Cluster API workload clusters.

use std::sync::Arc;

use clap::{Parser, ValueEnum};
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_example_configmap_sync::{
    ClientArgs, CopyContext, MainError, ManagerArgs, PolicyArgs, TraceArgs, reconcile, sync_filter,
};
use multicluster_provider_cluster_api::{ClusterApiOptions, ClusterApiProvider, ClusterApiVersion};
use multicluster_runtime::Cluster;
use multicluster_runtime::controller::{Controller, Watch};

#[derive(Clone, Copy, ValueEnum)]
enum Version {
    V1beta2,
    V1beta1,
}

/// Copy labelled ConfigMaps in every ready Cluster API workload cluster.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Namespace of the Cluster objects in the management cluster; every namespace when unset.
    #[arg(long, env = "NAMESPACE")]
    namespace: Option<String>,
    /// Only Clusters labelled cluster.x-k8s.io/watch-filter=<value>.
    #[arg(long, env = "WATCH_FILTER")]
    watch_filter: Option<String>,
    /// The cluster.x-k8s.io version to watch.
    #[arg(long, value_enum, default_value = "v1beta2")]
    api_version: Version,
    #[command(flatten)]
    manager: ManagerArgs,
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    policy: PolicyArgs,
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
    // The management cluster comes from $KUBECONFIG / ~/.kube/config / in-cluster.
    let management = kube::Client::try_default().await?;
    let provider = Arc::new(ClusterApiProvider::new(
        management.clone(),
        ClusterApiOptions::default()
            .namespace(args.namespace)
            .watch_filter(args.watch_filter)
            .version(match args.api_version {
                Version::V1beta2 => ClusterApiVersion::V1Beta2,
                Version::V1beta1 => ClusterApiVersion::V1Beta1,
            })
            .members(args.client.options())
            .kubeconfig_policy(args.policy.policy()?),
    ));
    // The manager: the local cluster, the fleet's provider, and (with
    // --leader-elect) the Lease that decides which replica works.
    let (manager, replica) = args.manager.builder(Cluster::local(management))?;
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
