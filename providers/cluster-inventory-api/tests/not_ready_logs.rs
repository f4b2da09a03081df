//! What an engaged cluster whose ClusterProfile stays not ready logs: a
//! warning once, not one per status update (a cluster manager's heartbeat
//! rewrites the status every few seconds).
//!
//! Alone in its test binary on purpose: tracing caches per call site
//! whether anyone listens, and a test without a subscriber running first
//! would hide the events from the thread-local subscriber used here.

mod common;

use std::sync::{Arc, Mutex};

use common::{NS, create_profile, req, set_health, set_status, workload};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_provider_cluster_inventory_api::{ClusterProfileOptions, ClusterProfileProvider};
use multicluster_runtime::ManagerOptions;
use multicluster_runtime::testing::{Changes, run_manager, wait_on};

/// The provider's "not ready" lines about one cluster, by level.
#[derive(Clone, Default)]
struct NotReadyLines {
    warnings: Arc<Mutex<Vec<String>>>,
    debug: Arc<Mutex<usize>>,
    caught: Changes,
}

impl NotReadyLines {
    fn warnings(&self) -> usize {
        self.warnings.lock().expect("lock").len()
    }

    fn total(&self) -> usize {
        self.warnings() + *self.debug.lock().expect("lock")
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    cluster: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "cluster" => self.cluster = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for NotReadyLines {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.cluster != "inventory/alpha"
            || !fields
                .message
                .starts_with("its ClusterProfile is not ready")
        {
            return;
        }
        match *event.metadata().level() {
            tracing::Level::WARN => self.warnings.lock().expect("lock").push(fields.message),
            tracing::Level::DEBUG => *self.debug.lock().expect("lock") += 1,
            _ => return,
        }
        self.caught.tell();
    }
}

#[tokio::test]
async fn a_cluster_kept_while_its_profile_is_not_ready_is_warned_about_once_until_ready_again() {
    use tracing_subscriber::layer::SubscriberExt;
    let lines = NotReadyLines::default();
    // The default runtime of #[tokio::test] runs every task on this thread,
    // so a thread-local subscriber sees the provider's events.
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(lines.clone()));

    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("in-member"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    create_profile(&hub, "alpha").await;
    set_health(&hub, "alpha", true, None).await;
    Api::<Secret>::namespaced(hub.clone(), NS)
        .create(
            &PostParams::default(),
            &common::credentials_secret("alpha-creds", "alpha", "me", member.kubeconfig()),
        )
        .await
        .expect("secret");
    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_secrets("me"),
    ));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("inventory/alpha", "in-member"), 0)
        .await;

    // Unhealthy, then five heartbeats of the cluster manager: each status
    // update is reconciled (and logged) again.
    set_health(&hub, "alpha", false, None).await;
    lines
        .caught
        .wait_until("the unready profile to be looked at", || lines.total() >= 1)
        .await;
    for beat in 0..5 {
        let before = lines.total();
        set_status(
            &hub,
            "alpha",
            serde_json::json!({"properties": [{"name": "heartbeat", "value": beat.to_string()}]}),
        )
        .await;
        lines
            .caught
            .wait_until("the heartbeat to be looked at", || lines.total() > before)
            .await;
    }
    assert!(lines.total() >= 6, "{} looks", lines.total());
    assert_eq!(
        lines.warnings.lock().expect("lock").clone(),
        vec!["its ClusterProfile is not ready; keeping the engaged cluster".to_string()],
        "one warning for the whole spell"
    );
    assert!(
        manager
            .get_cluster(&multicluster_runtime::ClusterName::from("inventory/alpha"))
            .await
            .is_ok(),
        "the cluster stays engaged"
    );

    // Ready again (seen once the cluster carries the status's new
    // property: only a ready profile's properties reach it), then not
    // ready again: a new spell, a new warning.
    let alpha = manager
        .get_cluster(&multicluster_runtime::ClusterName::from("inventory/alpha"))
        .await
        .expect("alpha");
    let mut ready = common::health(true);
    ready["properties"] = serde_json::json!([{"name": "heartbeat", "value": "ready"}]);
    set_status(&hub, "alpha", ready).await;
    wait_on(
        "the ready profile to be looked at",
        &mut alpha.inventory_changes(),
        |inventory| inventory.properties.get("heartbeat").map(String::as_str) == Some("ready"),
    )
    .await;
    assert_eq!(lines.warnings(), 1);
    set_health(&hub, "alpha", false, None).await;
    lines
        .caught
        .wait_until("the second spell to be warned about", || {
            lines.warnings() == 2
        })
        .await;
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
