//! What a failed reconcile logs: the whole cause chain, redacted, so an
//! operator reads the member's answer rather than a wrapper's word.
//!
//! Alone in its test binary on purpose, as `tracing_spans.rs`: tracing
//! caches per call site whether anyone listens, and a test without a
//! subscriber running first would hide the events from the thread-local
//! subscriber used here.

mod common;

use multicluster_runtime::testing::{Changes, Polled};
use std::sync::{Arc, Mutex};

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use multicluster_envtest::{ControlPlane, config_map_rules};
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::controller::finalizer::{Event, finalizer};
use multicluster_runtime::controller::{Action, Controller, Watch};
use multicluster_runtime::{Cluster, Manager};

/// The `error` field of every "reconcile failed" warning, and how many
/// retries that failed again were told at debug level.
#[derive(Clone, Default)]
struct Failures(
    Arc<Mutex<Vec<String>>>,
    Arc<Mutex<usize>>,
    /// Warnings that a warning Event could not be published.
    Arc<Mutex<usize>>,
    /// Told of each line caught.
    Changes,
);

struct Fields {
    message: String,
    error: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" => self.error = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Failures {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields {
            message: String::new(),
            error: String::new(),
        };
        event.record(&mut fields);
        let level = *event.metadata().level();
        if level == tracing::Level::WARN && fields.message == "reconcile failed" {
            self.0.lock().expect("lock").push(fields.error);
        } else if level == tracing::Level::DEBUG && fields.message == "reconcile failed again" {
            *self.1.lock().expect("lock") += 1;
        } else if level == tracing::Level::WARN
            && fields
                .message
                .starts_with("cannot publish the warning Event")
        {
            *self.2.lock().expect("lock") += 1;
        } else {
            return;
        }
        self.3.tell();
    }
}

/// A reconciler inside `controller::finalizer` whose member write is
/// refused (403): the warning names the 403 and what was refused, not only
/// the finalizer helper's "reconcile failed"; retried with backoff for the
/// same reason, it is warned about once, its retries told at debug level
/// (each was a warning before). Its warning Events are refused too (the
/// identity may not write Events): told once at warn level for the
/// cluster, not per failure.
#[tokio::test]
async fn a_refused_write_inside_a_finalizer_is_logged_with_its_cause() {
    use tracing_subscriber::layer::SubscriberExt;
    let failures = Failures::default();
    // The default runtime of #[tokio::test] runs every task on this thread,
    // so a thread-local subscriber sees the controller's events.
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(failures.clone()));

    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "guarded", &[]).await;
    // The member's identity may read ConfigMaps in `default` and keep its
    // finalizer on them, and nothing else: its Secret write is refused.
    cp.grant_in_namespace(
        "default",
        "robot",
        config_map_rules(&["get", "list", "watch", "patch", "update"]),
    )
    .await
    .expect("grant");
    let robot =
        multicluster_envtest::client_for(&cp.user_kubeconfig("robot", None).expect("kubeconfig"))
            .await
            .expect("client");
    let controller = Controller::builder("guarded")
        .for_resource(Watch::<ConfigMap>::new())
        .warning_events("guarded")
        .build(|request, cluster: Cluster| async move {
            type Failure = Box<dyn std::error::Error + Send + Sync>;
            let object = cluster
                .cache()
                .get::<ConfigMap>(request.namespace.as_deref(), &request.name)
                .await?
                .ok_or_else(|| Failure::from("gone"))?;
            let writer = cluster.client();
            finalizer(&cluster, "example.com/guard", object, |event| async move {
                if let Event::Apply(object) = event {
                    let mut secret = Secret::default();
                    secret.metadata.name = object.metadata.name.clone();
                    Api::<Secret>::namespaced(writer, "default")
                        .create(&PostParams::default(), &secret)
                        .await?;
                }
                Ok::<_, kube::Error>(Action::await_change())
            })
            .await
            .map_err(Failure::from)
        })
        .expect("controller");
    let provider = TestProvider::default();
    provider
        .clusters
        .add(
            "member",
            Cluster::with_cache(
                "member",
                robot.clone(),
                Cache::with_options(
                    "member",
                    robot,
                    CacheOptions::default().namespace(Some("default".to_string())),
                ),
            ),
        )
        .expect("add");
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    manager.add_controller(controller).expect("add controller");
    let (shutdown, task) = run_manager(&manager);
    failures
        .3
        .wait_until("a refused reconcile to be logged", || {
            !failures.0.lock().expect("lock").is_empty()
        })
        .await;

    let logged = failures.0.lock().expect("lock")[0].clone();
    assert!(
        logged.starts_with("reconcile failed: 403 Forbidden")
            && logged.contains("User \"robot\" cannot create resource \"secrets\""),
        "{logged}"
    );
    // Retried after 5 ms doubling: eight failures within a couple of
    // seconds, one warning among them. The count is read from the metrics
    // registry, which tells no one of a change.
    eventually(
        Polled::Unsignalled,
        "the reconcile to fail eight times",
        || async {
            series(
                &manager,
                r#"controller_runtime_reconcile_errors_total{controller="guarded"}"#,
            ) >= Some(8.0)
        },
    )
    .await;
    assert_eq!(failures.0.lock().expect("lock").len(), 1);
    assert!(*failures.1.lock().expect("lock") >= 7);
    assert_eq!(
        *failures.2.lock().expect("lock"),
        1,
        "one warning about Events"
    );
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
