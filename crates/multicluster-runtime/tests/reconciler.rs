//! What a reconciler can say about its errors, against a real member: a
//! context argument, any error convertible into a boxed one, an error
//! policy that replaces the backoff, and terminal errors that are counted
//! but not retried until the object changes.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Manager;
use multicluster_runtime::controller::{Action, Backoff, Controller, Request, Terminal, Watch};
use multicluster_runtime::testing::Recorder;

/// Shared with every reconcile through the context argument.
#[derive(Default)]
struct Context {
    recorder: Recorder,
    policy_calls: AtomicUsize,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn reconcile(request: Request, context: Arc<Context>) -> Result<Action, BoxError> {
    context.recorder.record(&request);
    let runs = context.recorder.count(&request);
    match request.name.as_str() {
        "invalid" => Err(Terminal::new("the spec names no target").into()),
        "flaky" if runs == 1 => Err("not yet".into()),
        "hopeless" => Err("never works".into()),
        "clock" => Ok(Action::requeue(Duration::from_millis(5))),
        _ => Ok(Action::await_change()),
    }
}

fn counted(metrics: &str, result: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with("controller_runtime_reconcile_total{"))
        .filter(|line| line.contains("controller=\"reconciler\""))
        .filter(|line| line.contains(&format!("result=\"{result}\"")))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_errors_wait_for_a_change_and_the_error_policy_replaces_the_backoff() {
    let cp = ControlPlane::start().await.expect("control plane");
    for name in ["invalid", "flaky", "hopeless", "clock"] {
        create_config_map(&cp, name, &[("v", "1")]).await;
    }
    let provider = TestProvider::default();
    provider
        .clusters
        .add("m", cluster_for("m", &cp).await)
        .expect("add");
    let context = Arc::new(Context::default());
    let policy_context = context.clone();
    let controller = Controller::builder("reconciler")
        .for_resource(Watch::<ConfigMap>::new())
        .max_concurrent_reconciles(4)
        // A retried error would run again within milliseconds.
        .backoff(Backoff {
            base: Duration::from_millis(1),
            max: Duration::from_millis(2),
        })
        .error_policy(move |request, error| {
            policy_context.policy_calls.fetch_add(1, Ordering::SeqCst);
            assert!(!error.to_string().is_empty());
            match request.name.as_str() {
                "flaky" => Some(Action::requeue(Duration::from_millis(20))),
                "hopeless" => Some(Action::await_change()),
                _ => None,
            }
        })
        .build_with_context(context.clone(), |request, _cluster, context| {
            reconcile(request, context)
        })
        .expect("controller");
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    manager.add_controller(controller).expect("add");
    let (stop, task) = run_manager(&manager);

    let recorder = &context.recorder;
    // The policy asked for a retry after 20 ms: it runs again and succeeds.
    recorder.wait_for_more(&req("m", "flaky"), 1).await;
    // Let the clock tick 100 times (at least half a second): errors that
    // were retried would have run dozens of times by then.
    recorder.wait_for_more(&req("m", "clock"), 99).await;
    assert_eq!(
        recorder.count(&req("m", "invalid")),
        1,
        "a terminal error was retried"
    );
    assert_eq!(
        recorder.count(&req("m", "hopeless")),
        1,
        "the policy said to wait for a change"
    );
    assert_eq!(recorder.count(&req("m", "flaky")), 2);
    // The policy saw flaky's and hopeless's errors, never the terminal one.
    assert_eq!(context.policy_calls.load(Ordering::SeqCst), 2);
    let metrics = manager.metrics().encode();
    assert_eq!(counted(&metrics, "terminal"), 1.0, "{metrics}");
    assert_eq!(counted(&metrics, "error"), 2.0, "{metrics}");

    // A change runs the terminal one again.
    let data: BTreeMap<&str, &str> = [("v", "2")].into();
    Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default")
        .patch(
            "invalid",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": data })),
        )
        .await
        .expect("patch");
    recorder.wait_for_more(&req("m", "invalid"), 1).await;

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
