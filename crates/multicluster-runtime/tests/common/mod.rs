//! Helpers shared by the integration tests: a minimal provider over a
//! cluster set, a reconcile recorder, and polling with a deadline.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::controller::Request;
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, Provider, RunnableProvider};
use tokio_util::sync::CancellationToken;

pub mod gateway;
pub mod relay;

pub const DEADLINE: Duration = multicluster_runtime::testing::DEFAULT_DEADLINE;

pub use multicluster_runtime::testing::TestProvider;

/// A manager whose local cluster is `local` (named `local_name`) and whose
/// fleet is `members`, each a control plane under its name, added up front.
pub async fn fleet_manager(
    local_name: &str,
    local: &ControlPlane,
    members: &[(&str, &ControlPlane)],
) -> multicluster_runtime::Manager {
    let provider = TestProvider::default();
    for (name, cp) in members {
        provider
            .clusters
            .add(*name, cluster_for(name, cp).await)
            .expect("add");
    }
    multicluster_runtime::Manager::builder(cluster_for(local_name, local).await)
        .provider(Arc::new(provider))
        .build()
}

/// A cluster built from a control plane's admin kubeconfig.
pub async fn cluster_for(name: &str, cp: &ControlPlane) -> Cluster {
    Cluster::new(name, cp.client().await.expect("client"))
}

pub fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..ConfigMap::default()
    }
}

pub async fn create_config_map(cp: &ControlPlane, name: &str, data: &[(&str, &str)]) {
    cp.create_config_map(name, data)
        .await
        .expect("create config map");
}

pub use multicluster_runtime::testing::{
    Recorder, eventually, run_manager, wait_until_left, wait_until_ready,
};

pub fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

/// The value of one series (name and labels as the text format writes
/// them) of `manager`'s metrics, if it has one.
pub fn series(manager: &multicluster_runtime::Manager, series: &str) -> Option<f64> {
    manager
        .metrics()
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// How many times a cluster of `manager`'s fleet entered `state`, as
/// `mcr_cluster_state_changes_total` counts it (a cluster that was ready for
/// a moment is counted, however briefly).
pub fn times_entered(manager: &multicluster_runtime::Manager, state: &str) -> u64 {
    let name = format!("mcr_cluster_state_changes_total{{state=\"{state}\"}}");
    series(manager, &name).map_or(0, |count| count as u64)
}

/// Everything the process logs, for tests that install a subscriber writing
/// into it (`tracing_subscriber::fmt().with_writer(move || logs.clone())`).
#[derive(Clone, Default)]
pub struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// The member `name` built from `kubeconfig` as the kubeconfig providers
/// build members (default member options), under `policy`.
pub async fn from_kubeconfig(
    name: &str,
    kubeconfig: &kube::config::Kubeconfig,
    policy: multicluster_runtime::client::KubeconfigPolicy,
) -> Cluster {
    multicluster_runtime::provider::kubeconfig::KubeconfigCluster {
        inventory: Default::default(),
        policy,
        name: name.into(),
        text: multicluster_envtest::to_yaml(kubeconfig).expect("yaml"),
        source: "test kubeconfig".into(),
        stable_id: None,
        member: multicluster_runtime::provider::member::MemberOptions::default(),
    }
    .build()
    .await
    .expect("cluster")
}
