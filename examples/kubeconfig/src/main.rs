//! The ConfigMap-copy controller over clusters from kubeconfig Secrets
//! (create them with `hack/create-kubeconfig-secret.sh`).

use std::sync::Arc;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, GroupVersionKind};
use multicluster_example_configmap_sync::{
    ClientArgs, CopyContext, MainError, ManagerArgs, PolicyArgs, TraceArgs, reconcile, sync_filter,
};
use multicluster_provider_kubeconfig::{
    DEFAULT_DATA_KEY, DEFAULT_LABEL, KubeconfigOptions, KubeconfigProvider,
};
use multicluster_runtime::Cluster;
use multicluster_runtime::controller::{Controller, Watch};

/// Copy labelled ConfigMaps in every cluster named by a kubeconfig Secret.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Namespace of the kubeconfig Secrets in the management cluster; every namespace when unset.
    #[arg(long, env = "NAMESPACE")]
    namespace: Option<String>,
    /// Only Secrets labelled cluster.x-k8s.io/watch-filter=<value>.
    #[arg(long, env = "WATCH_FILTER")]
    watch_filter: Option<String>,
    /// Label (value "true") marking kubeconfig Secrets.
    #[arg(long, default_value = DEFAULT_LABEL)]
    label: String,
    /// Data key holding the kubeconfig.
    #[arg(long, default_value = DEFAULT_DATA_KEY)]
    key: String,
    /// Also watch this resource in every member, as group/version/Kind[/plural] (an empty
    /// group for the core one; the plural when kube-rs's guess from the Kind is wrong);
    /// repeatable. A member that does not serve it is degraded, naming it, while the copy
    /// goes on there; it is ready once it serves it.
    #[arg(long, value_name = "GROUP/VERSION/KIND", value_parser = resource)]
    also_watch: Vec<ApiResource>,
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
    let provider = Arc::new(KubeconfigProvider::new(
        management.clone(),
        KubeconfigOptions::default()
            .namespace(args.namespace)
            .label(args.label)
            .data_key(args.key)
            .watch_filter(args.watch_filter)
            .members(args.client.options())
            .kubeconfig_policy(args.policy.policy()?),
    ));
    // The manager: the local cluster, the fleet's provider, and (with
    // --leader-elect) the Lease that decides which replica works.
    let (manager, replica) = args.manager.builder(Cluster::local(management))?;
    let manager = manager.provider(provider).build();
    // The controller: labelled ConfigMaps in every cluster, and the copies
    // they own; `reconcile` (shared by the examples) writes the copies.
    let mut controller = Controller::builder("configmap-copy")
        .for_resource(Watch::<ConfigMap>::new().filter(sync_filter()))
        .owns(Watch::<ConfigMap>::new())
        .max_concurrent_reconciles(4);
    // Watched for the member's readiness only: nothing is reconciled for
    // them.
    for resource in args.also_watch {
        controller = controller.watches_dynamic(resource, Watch::new(), |_, _| Vec::new());
    }
    let controller =
        controller.build_with_context(CopyContext::new(replica.as_deref()), reconcile)?;
    manager.add_controller(controller)?;
    tracing::info!("running; Ctrl-C stops");
    manager.run_until_signal().await?;
    Ok(())
}

/// `group/version/Kind[/plural]` as a resource to watch.
fn resource(text: &str) -> Result<ApiResource, String> {
    let parts: Vec<&str> = text.split('/').collect();
    let (group, version, kind, plural) = match parts.as_slice() {
        [group, version, kind] => (*group, *version, *kind, None),
        [group, version, kind, plural] => (*group, *version, *kind, Some(*plural)),
        _ => {
            return Err(format!(
                "{text:?} is not group/version/Kind (e.g. example.com/v1/Widget)"
            ));
        }
    };
    if version.is_empty() || kind.is_empty() || plural.is_some_and(str::is_empty) {
        return Err(format!("{text:?} lacks a version, a Kind or a plural"));
    }
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Ok(match plural {
        Some(plural) => ApiResource::from_gvk_with_plural(&gvk, plural),
        None => ApiResource::from_gvk(&gvk),
    })
}

#[cfg(test)]
mod tests {
    use super::resource;

    #[test]
    fn also_watch_takes_group_version_kind_and_an_optional_plural() {
        let widgets = resource("example.com/v1/Widget").expect("a resource");
        assert_eq!(
            (widgets.api_version.as_str(), widgets.plural.as_str()),
            ("example.com/v1", "widgets")
        );
        let pods = resource("/v1/Pod").expect("the core group");
        assert_eq!(
            (pods.api_version.as_str(), pods.plural.as_str()),
            ("v1", "pods")
        );
        let odd = resource("example.com/v1/Octopus/octopodes").expect("a plural");
        assert_eq!(odd.plural, "octopodes");
        for bad in [
            "Widget",
            "example.com/Widget",
            "example.com//Widget",
            "a/v1/K/",
        ] {
            let err = resource(bad).expect_err(bad);
            assert!(err.contains(bad), "{err}");
        }
    }
}
