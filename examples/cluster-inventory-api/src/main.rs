//! The ConfigMap-copy controller over the clusters of a ClusterProfile
//! inventory, with credentials from Secrets or from access providers.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{ArgGroup, Parser};
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_example_configmap_sync::{
    ClientArgs, CopyContext, MainError, ManagerArgs, PolicyArgs, TraceArgs, reconcile, sync_filter,
};
use multicluster_provider_cluster_inventory_api::access::ProviderFile;
use multicluster_provider_cluster_inventory_api::{ClusterProfileOptions, ClusterProfileProvider};
use multicluster_runtime::Cluster;
use multicluster_runtime::controller::{Controller, Watch};

/// Copy labelled ConfigMaps in every ready ClusterProfile's cluster.
#[derive(Parser)]
#[command(version, about)]
#[command(group(ArgGroup::new("credentials").required(true).args(["consumer", "clusterprofile_provider_file"])))]
struct Args {
    /// Credentials from Secrets labelled x-k8s.io/cluster-inventory-consumer=<CONSUMER>.
    #[arg(long, env = "CONSUMER")]
    consumer: Option<String>,
    /// Credentials from exec plugins listed in this provider file (KEP-5339 JSON).
    #[arg(long, env = "CLUSTERPROFILE_PROVIDER_FILE")]
    clusterprofile_provider_file: Option<PathBuf>,
    /// Let this access provider's plugin, which reads what profiles write, run for servers its
    /// servers do not name one by one (allowUnboundProfileInput): whoever may write a
    /// ClusterProfile's status can then choose whose credential it mints. Repeatable.
    #[arg(long, value_name = "PROVIDER")]
    allow_unbound_profile_input: Vec<String>,
    /// Namespace of the ClusterProfiles in the hub; every namespace when unset.
    #[arg(long, env = "NAMESPACE")]
    namespace: Option<String>,
    /// Only profiles labelled cluster.x-k8s.io/watch-filter=<value>.
    #[arg(long, env = "WATCH_FILTER")]
    watch_filter: Option<String>,
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
    let mut options = match (args.consumer, args.clusterprofile_provider_file) {
        (Some(_), None) if !args.allow_unbound_profile_input.is_empty() => {
            return Err("--allow-unbound-profile-input names access providers of --clusterprofile-provider-file".into());
        }
        (Some(consumer), None) => ClusterProfileOptions::with_secrets(consumer),
        (None, Some(path)) => {
            let mut providers = ProviderFile::from_path(path)?;
            for name in &args.allow_unbound_profile_input {
                providers.allow_unbound_profile_input(name)?;
            }
            ClusterProfileOptions::with_access_providers(providers)
        }
        _ => {
            return Err("give exactly one of --consumer and --clusterprofile-provider-file".into());
        }
    };
    options.namespace = args.namespace;
    options.watch_filter = args.watch_filter;
    options.members = args.client.options().into();
    options.kubeconfig_policy = args.policy.policy()?;
    // The hub comes from $KUBECONFIG / ~/.kube/config / in-cluster.
    let hub = kube::Client::try_default().await?;
    let provider = Arc::new(ClusterProfileProvider::new(hub.clone(), options));
    // The manager: the local cluster, the fleet's provider, and (with
    // --leader-elect) the Lease that decides which replica works.
    let (manager, replica) = args.manager.builder(Cluster::new("hub", hub))?;
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
