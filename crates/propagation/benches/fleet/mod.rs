//! What the propagation benches share: members built as the kubeconfig
//! providers build them, each a namespace of one real control plane, and
//! waiting with a deadline.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::cache::CacheOptions;
use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::TestProvider;
use multicluster_runtime::{Cluster, Manager};

pub(crate) type Error = Box<dyn std::error::Error>;

/// Waits until `done` holds, for at most `within` (the bench's own
/// bookkeeping, filled by watches: polled every 10 ms).
pub(crate) async fn until(
    within: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Result<(), Error> {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("not within {within:?}: {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The namespace of the `m`th member.
pub(crate) fn member_name(m: usize) -> String {
    format!("member-{m}")
}

/// `members` members of `cp` (and `hub_namespace`), each built from a
/// kubeconfig as the kubeconfig providers build members (HTTP/2, default
/// options), its cache held to a namespace of its own.
pub(crate) async fn members(
    cp: &ControlPlane,
    hub_namespace: &str,
    members: usize,
) -> Result<TestProvider, Error> {
    let admin = cp.client().await?;
    let namespaces = Api::<Namespace>::all(admin.clone());
    for name in std::iter::once(hub_namespace.to_string()).chain((0..members).map(member_name)) {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => return Err(err.into()),
        }
    }
    let provider = TestProvider::default();
    let kubeconfig = multicluster_envtest::to_yaml(cp.kubeconfig())?;
    for m in 0..members {
        let name = member_name(m);
        let member = KubeconfigCluster {
            inventory: Default::default(),
            policy: KubeconfigPolicy::default(),
            name: name.as_str().into(),
            text: kubeconfig.clone(),
            source: format!("bench member {name}"),
            stable_id: None,
            member: MemberOptions::default()
                .cache(CacheOptions::default().namespace(Some(name.clone()))),
        }
        .build()
        .await?;
        provider.clusters.add(name.as_str(), member)?;
    }
    Ok(provider)
}

/// Waits until every member of `manager` is ready.
pub(crate) async fn all_ready(manager: &Manager, members: usize) -> Result<(), Error> {
    let ready = || {
        manager
            .cluster_states()
            .iter()
            .filter(|(name, status)| !name.is_local() && status.state == ClusterState::Ready)
            .count()
    };
    until(Duration::from_secs(600), "every member ready", || {
        ready() == members
    })
    .await
}

/// A manager of `cp` (as the hub) over `provider`'s members.
pub(crate) async fn manager(cp: &ControlPlane, provider: TestProvider) -> Result<Manager, Error> {
    Ok(Manager::builder(Cluster::local(cp.client().await?))
        .provider(std::sync::Arc::new(provider))
        .build())
}

/// Runs `run` once for each fleet size the environment variable `sizes`
/// lists (comma-separated; 1,000 members when unset), each on a control
/// plane of its own: the previous size's namespaces and copies would be
/// in the way.
pub(crate) async fn each_size<F, R>(sizes: &str, mut run: F) -> Result<(), Error>
where
    F: FnMut(ControlPlane, usize) -> R,
    R: std::future::Future<Output = Result<(), Error>>,
{
    let sizes: Vec<usize> = std::env::var(sizes)
        .unwrap_or_else(|_| "1000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    for members in sizes {
        run(ControlPlane::start().await?, members).await?;
    }
    Ok(())
}
