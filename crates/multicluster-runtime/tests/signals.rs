//! SIGTERM in the middle of a burst of work: no reconcile starts once the
//! process has received it. A test binary of its own: the signal goes to
//! the whole process.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::controller::{Action, Controller, Watch};

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// Requests queued by hand at once, far more than run before the signal.
const BURST: usize = 50_000;
/// The reconcile of the burst after which the signal is sent.
const SIGNAL_AT: usize = 1_000;

// One runtime thread, so that the signal comes while most of the burst's
// reconciles are queued as tasks the runtime has not run yet (a reconcile
// starts when its task first runs: the reconciler is called then). Until
// the runtime runs the task the signal wakes, only what the signal handler
// itself did can keep them from starting.
#[tokio::test]
async fn no_reconcile_starts_once_sigterm_is_received() {
    let cp = ControlPlane::start().await.expect("control plane");
    create_config_map(&cp, "seen", &[]).await;
    let manager = fleet_manager("local", &cp, &[("member", &cp)]).await;
    let started = Arc::new(AtomicUsize::new(0));
    let (reached, signal_now) = std::sync::mpsc::sync_channel(1);
    let recorder = Recorder::default();
    let controller = {
        let (started, recorder) = (started.clone(), recorder.clone());
        Controller::builder("burst")
            .for_resource(Watch::<ConfigMap>::new())
            .max_concurrent_reconciles(BURST)
            .build(move |request, _| {
                // Counted when the reconciler is called: the reconcile
                // starts.
                if request.name.starts_with("burst-") {
                    if started.fetch_add(1, Ordering::SeqCst) + 1 == SIGNAL_AT {
                        let _ = reached.try_send(());
                    }
                } else {
                    recorder.record(&request);
                }
                async { Ok::<_, Never>(Action::await_change()) }
            })
            .expect("controller")
    };
    manager.add_controller(controller.clone()).expect("add");
    let run = tokio::spawn({
        let manager = manager.clone();
        async move { manager.run_until_signal().await }
    });
    recorder.wait_for_more(&req("member", "seen"), 0).await;

    let signaller = std::thread::spawn({
        let started = started.clone();
        move || {
            signal_now
                .recv_timeout(DEADLINE)
                .expect("the burst reached the reconcile the signal follows");
            // The handler has run when raise returns on this thread.
            signal_hook::low_level::raise(signal_hook::consts::SIGTERM).expect("raise SIGTERM");
            started.load(Ordering::SeqCst)
        }
    });
    for i in 0..BURST {
        controller.enqueue(req("member", &format!("burst-{i:05}")));
    }
    run.await.expect("task").expect("clean stop");
    let before = signaller.join().expect("signalling thread");
    let total = started.load(Ordering::SeqCst);
    assert!(
        before < BURST,
        "the whole burst had started before the signal: the test cannot tell"
    );
    // One reconcile may have passed the check as the handler ran.
    assert!(
        total - before <= 1,
        "{} reconciles started after SIGTERM was received ({before} before it)",
        total - before
    );
}
