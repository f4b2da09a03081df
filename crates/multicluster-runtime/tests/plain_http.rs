//! A member served over plain HTTP, as `kubectl proxy` serves a real API
//! server: with the default options it is engaged and reconciled, found
//! unreachable when the proxy goes away and ready when it returns, and its
//! failed requests add no ERROR line of the HTTP layer (kube-rs's own
//! stack, which such members got before, logged one per failed request).
//!
//! Alone in its test binary on purpose, as `failure_logs.rs`: tracing
//! caches per call site whether anyone listens, and a test without a
//! subscriber running first would hide the events from the thread-local
//! subscriber used here.

mod common;

use multicluster_runtime::testing::Polled;
use std::sync::{Arc, Mutex};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_envtest::{ControlPlane, KubectlProxy};
use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::controller::Watch;
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::wait_for_fleet;
use multicluster_runtime::testing::{Recorder, recording_controller, wait_until_ready};
use multicluster_runtime::{ClusterName, Manager};

/// Every event at WARN or above: its level, target and message.
#[derive(Clone, Default)]
struct Loud(Arc<Mutex<Vec<(tracing::Level, String, String)>>>);

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Loud {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let level = *event.metadata().level();
        if level <= tracing::Level::WARN {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().expect("lock").push((
                level,
                event.metadata().target().to_string(),
                message.0,
            ));
        }
    }
}

impl Loud {
    fn errors(&self) -> Vec<String> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .filter(|(level, ..)| *level == tracing::Level::ERROR)
            .map(|(_, target, message)| format!("{target}: {message}"))
            .collect()
    }

    fn count(&self) -> usize {
        self.0.lock().expect("lock").len()
    }
}

#[tokio::test]
async fn a_plain_http_member_is_watched_and_its_outage_reported_without_error_lines() {
    use tracing_subscriber::layer::SubscriberExt;
    let loud = Loud::default();
    // The default runtime of #[tokio::test] runs every task on this thread,
    // so a thread-local subscriber sees the manager's and the clients'
    // events.
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(loud.clone()));

    let cp = ControlPlane::start().await.expect("control plane");
    let proxy = KubectlProxy::start(&cp).await.expect("kubectl proxy");
    let member = KubeconfigCluster {
        inventory: Default::default(),
        // Plain HTTP is the operator's choice to make: refused by default.
        policy: KubeconfigPolicy::default().plain_http(true),
        name: "plain".into(),
        text: multicluster_envtest::to_yaml(&proxy.kubeconfig()).expect("yaml"),
        source: "kubectl proxy's kubeconfig".into(),
        stable_id: None,
        member: MemberOptions::default(),
    }
    .build()
    .await
    .expect("a plain-HTTP kubeconfig gives a cluster");
    let provider = TestProvider::default();
    provider.clusters.add("plain", member).expect("add");
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(
            recording_controller("recorder", Watch::<ConfigMap>::new(), &recorder)
                .expect("controller"),
        )
        .expect("add");
    let (stop, task) = run_manager(&manager);
    wait_until_ready(&manager, "plain").await;
    create_config_map(&cp, "through-the-proxy", &[]).await;
    recorder
        .wait_until("the member's object to be reconciled", |recorder| {
            recorder.count(&req("plain", "through-the-proxy")) > 0
        })
        .await;
    let before = loud.count();

    proxy.stop();
    wait_for_fleet(&manager, "the member to be reported unreachable", || {
        matches!(
            manager.cluster_state(&ClusterName::from("plain")),
            Some(ClusterState::Unreachable(_))
        )
    })
    .await;
    // Its retries go on failing while it is down: each is told at debug
    // level only.
    // A failed attempt changes no state the fleet watch tells of (the
    // cluster stays unreachable): only the count grows.
    eventually(Polled::Unsignalled, "five failed attempts", || async {
        manager
            .cluster_states()
            .iter()
            .any(|(name, status)| name.as_str() == "plain" && status.failed_attempts >= 5)
    })
    .await;
    proxy.start_again().await.expect("kubectl proxy again");
    wait_until_ready(&manager, "plain").await;

    let errors = loud.errors();
    assert!(errors.is_empty(), "no ERROR line: {errors:?}");
    // The state changes, told once each; not a line per failed request or
    // per retry.
    let told = loud.count() - before;
    assert!(told <= 4, "{told} lines at WARN: {:?}", loud.0.lock());
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
