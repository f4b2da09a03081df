//! Several replicas of one controller sharing a fleet: every namespace
//! labelled with the watch filter is a cluster, and the replicas divide the
//! clusters among themselves through Leases (see
//! `multicluster_coordinator::sharding`). Each copy a replica writes names it in
//! the `multicluster.example/copied-by` annotation, so who works where shows
//! in the cluster.

mod ledger;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use multicluster_coordinator::sharding::{FenceHold, ShardedCoordinator, ShardingOptions};
use multicluster_example_configmap_sync::{
    MainError, ManagerArgs, NamespaceArgs, TraceArgs, controller_on_replica, serve,
};
use multicluster_provider_namespace::{NamespaceOptions, NamespaceProvider};
use multicluster_runtime::Manager;
use multicluster_runtime::metrics::Metrics;

/// Copy labelled ConfigMaps in namespace-backed clusters, sharded over replicas.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// This replica's ID (default: the host name).
    #[arg(long, env = "PEER_ID")]
    peer_id: Option<String>,
    /// Where the peer and fence Leases live.
    #[arg(long, default_value = "kube-system")]
    lease_namespace: String,
    /// Only namespaces labelled cluster.x-k8s.io/watch-filter=<value> become clusters.
    #[arg(long, env = "WATCH_FILTER")]
    watch_filter: Option<String>,
    #[command(flatten)]
    namespaces: NamespaceArgs,
    #[command(flatten)]
    manager: ManagerArgs,
    /// How often ownership is re-examined.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    probe_interval: Duration,
    /// How long a replica counts as alive after renewing its peer Lease.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    peer_lease_duration: Duration,
    /// How often the peer Lease is renewed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    peer_renew_interval: Duration,
    /// How long a cluster's fence holds after its last renewal.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    fence_lease_duration: Duration,
    /// How often a held fence is renewed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    fence_renew_interval: Duration,
    /// How held fences are kept: `renewed` each on its own (Go's way), or
    /// `with-peer`, held while this replica's peer Lease lives (a fleet of
    /// any size costs one renewal per replica).
    #[arg(long, value_parser = ["renewed", "with-peer"], default_value = "renewed")]
    fence_hold: String,
    /// Append to this file, as it happens, when this replica starts and
    /// stops working on each cluster (see `ledger.rs`): the record tests
    /// and benchmarks check for clusters worked on twice or by nobody.
    #[arg(long)]
    ownership_ledger: Option<std::path::PathBuf>,
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
    if args.manager.leader_elect {
        return Err("--leader-elect: this example shares the fleet among its replicas; run examples/namespace for one active replica with warm standbys".into());
    }
    // The host cluster comes from $KUBECONFIG / ~/.kube/config / in-cluster.
    let provider = Arc::new(NamespaceProvider::new(
        kube::Client::try_default().await?,
        NamespaceOptions::default()
            .watch_filter(args.watch_filter)
            .namespace_selector(args.namespaces.selector()?),
    ));
    // The host is the local cluster too: the Leases live there.
    let host = provider.host().clone();
    let coordinator = ShardedCoordinator::new(
        host.client(),
        ShardingOptions::default()
            .namespace(args.lease_namespace)
            .peer_id(args.peer_id)
            .probe_interval(args.probe_interval)
            .peer_lease_duration(args.peer_lease_duration)
            .peer_renew_interval(args.peer_renew_interval)
            .fence_lease_duration(args.fence_lease_duration)
            .fence_renew_interval(args.fence_renew_interval)
            .fence_hold(match args.fence_hold.as_str() {
                "with-peer" => FenceHold::WithPeer,
                _ => FenceHold::Renewed,
            }),
    )?;
    let options = args.manager.options();
    let peer = coordinator.peer_id().to_string();
    tracing::info!(%peer, "sharding the fleet with the other replicas");
    // Reconciles counted per cluster, so each replica's share shows in /metrics.
    let manager = Manager::builder(host)
        .provider(provider)
        .options(options)
        .metrics(Metrics::new(true))
        .coordinator(Arc::new(coordinator))
        .build();
    if let Some(path) = &args.ownership_ledger {
        manager.add(Arc::new(ledger::Ledger::create(path)?))?;
    }
    serve(manager, controller_on_replica("configmap-copy", &peer)?).await?;
    Ok(())
}
