//! Helpers shared by the integration tests: a minimal provider over a
//! cluster set, a reconcile recorder, and polling with a deadline.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::clusters::Clusters;
use multicluster_runtime::controller::Request;
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, Provider, RunnableProvider};
use tokio_util::sync::CancellationToken;

pub const DEADLINE: Duration = Duration::from_secs(60);

/// The smallest runnable provider: clusters added and removed by the test.
#[derive(Clone, Default)]
pub struct TestProvider {
    pub clusters: Clusters,
}

#[async_trait::async_trait]
impl Provider for TestProvider {
    async fn get(&self, name: &ClusterName) -> Result<Cluster, Error> {
        self.clusters.get(name)
    }

    async fn index_field(&self, index: FieldIndex) -> Result<(), Error> {
        self.clusters.index_field(index);
        Ok(())
    }
}

#[async_trait::async_trait]
impl RunnableProvider for TestProvider {
    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        self.clusters.start(shutdown.clone(), aware)?;
        shutdown.cancelled().await;
        Ok(())
    }
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
    Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default")
        .create(&PostParams::default(), &config_map(name, data))
        .await
        .expect("create config map");
}

/// Every reconcile a test's reconciler saw, in order.
#[derive(Clone, Default)]
pub struct Recorder {
    seen: Arc<Mutex<Vec<(Request, Instant)>>>,
}

impl Recorder {
    pub fn record(&self, request: &Request) {
        self.seen
            .lock()
            .expect("lock")
            .push((request.clone(), Instant::now()));
    }

    pub fn count(&self, request: &Request) -> usize {
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .filter(|(r, _)| r == request)
            .count()
    }

    pub fn times(&self, request: &Request) -> Vec<Instant> {
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .filter(|(r, _)| r == request)
            .map(|(_, t)| *t)
            .collect()
    }

    pub fn for_cluster(&self, cluster: &str) -> usize {
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .filter(|(r, _)| r.cluster.as_str() == cluster)
            .count()
    }

    pub fn total(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    /// Waits until `request` has been reconciled more than `before` times.
    pub async fn wait_for_more(&self, request: &Request, before: usize) {
        eventually(&format!("a reconcile of {request}"), || async {
            self.count(request) > before
        })
        .await;
    }
}

/// Polls `check` until true, failing after [`DEADLINE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

/// Runs the manager in the background; cancel the token to stop it.
pub fn run_manager(
    manager: &multicluster_runtime::Manager,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), Error>>,
) {
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let manager = manager.clone();
    let task = tokio::spawn(async move { manager.run(stop).await });
    (shutdown, task)
}
