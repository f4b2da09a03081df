//! Reconcile spans carry the cluster name.
//!
//! Alone in its test binary on purpose: tracing caches per call site whether
//! anyone listens, and a test running first without a subscriber would make
//! the `reconcile` span invisible to the thread-local subscriber used here.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Manager;
use multicluster_runtime::controller::{Action, Controller, Watch};

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

#[tokio::test]
async fn reconcile_spans_carry_the_cluster_name() {
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Clusters(Arc<Mutex<HashSet<String>>>);
    struct Visitor<'a>(&'a Clusters);
    impl tracing::field::Visit for Visitor<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "cluster" {
                self.0.0.lock().expect("lock").insert(format!("{value:?}"));
            }
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Clusters {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _id: &tracing::span::Id,
            _ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if attrs.metadata().name() == "reconcile" {
                attrs.record(&mut Visitor(self));
            }
        }
    }

    let seen = Clusters::default();
    // The default runtime of #[tokio::test] runs every task on this thread,
    // so a thread-local subscriber sees the controller's spans.
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));

    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "traced", &[]).await;
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("traced")
            .for_resource(Watch::<ConfigMap>::new())
            .build(move |request, _cluster| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    Ok::<_, Never>(Action::await_change())
                }
            })
            .expect("controller")
    };
    let provider = TestProvider::default();
    for name in ["east", "west"] {
        provider
            .clusters
            .add(name, cluster_for(name, &cp).await)
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    manager.add_controller(controller).expect("add controller");
    let (shutdown, task) = run_manager(&manager);
    recorder.wait_for_more(&req("east", "traced"), 0).await;
    recorder.wait_for_more(&req("west", "traced"), 0).await;

    let clusters = seen.0.lock().expect("lock").clone();
    assert!(
        clusters.contains("east") && clusters.contains("west"),
        "{clusters:?}"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
