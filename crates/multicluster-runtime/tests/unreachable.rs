//! Unreachable clusters are reported and retried, and never hold up the
//! rest of the fleet.

mod common;

use multicluster_runtime::testing::Polled;
use multicluster_runtime::testing::wait_for_fleet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::controller::{Action, Controller, Watch};
use multicluster_runtime::manager::{ClusterState, ClusterStatus};
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::{Manager, ManagerOptions};

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

fn recording_controller(recorder: &Recorder) -> Controller {
    let recorder = recorder.clone();
    Controller::builder("recording")
        .for_resource(Watch::<ConfigMap>::new())
        .max_concurrent_reconciles(2)
        .build(move |request, _cluster| {
            let recorder = recorder.clone();
            async move {
                recorder.record(&request);
                Ok::<_, Never>(Action::await_change())
            }
        })
        .expect("controller")
}

fn state_of(manager: &Manager, cluster: &str) -> Option<ClusterState> {
    manager.cluster_state(&cluster.into())
}

fn status_of(manager: &Manager, cluster: &str) -> ClusterStatus {
    manager
        .cluster_states()
        .into_iter()
        .find(|(name, _)| name.as_str() == cluster)
        .map(|(_, status)| status)
        .expect("the cluster is in the fleet")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_reported_retried_and_engaged_once_it_answers() {
    let (down, up) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (down, up) = (down.expect("down"), up.expect("up"));
    create_config_map(&down, "waiting", &[]).await;
    create_config_map(&up, "ready", &[]).await;
    down.stop_api_server();

    let provider = TestProvider::default();
    provider
        .clusters
        .add("down", cluster_for("down", &down).await)
        .expect("add");
    provider
        .clusters
        .add("up", cluster_for("up", &up).await)
        .expect("add");
    let options = ManagerOptions::default()
        .sync_timeout(Duration::from_secs(2))
        .retry_delay(Duration::from_millis(200))
        .max_retry_delay(Duration::from_secs(1));
    let manager = Manager::builder(cluster_for("local", &up).await)
        .provider(Arc::new(provider))
        .options(options)
        .metrics(Metrics::new(true))
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(recording_controller(&recorder))
        .expect("add");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (shutdown, task) = run_manager(&manager);
    manager.serve_health(listener, shutdown.clone());

    recorder.wait_for_more(&req("up", "ready"), 0).await;
    wait_for_fleet(
        &manager,
        "the down cluster to be reported unreachable",
        || {
            matches!(
                state_of(&manager, "down"),
                Some(ClusterState::Unreachable(_))
            )
        },
    )
    .await;
    assert_eq!(recorder.for_cluster("down"), 0);
    let metrics = manager.metrics().encode();
    assert!(
        metrics.contains(r#"mcr_clusters{state="unreachable"} 1"#),
        "{metrics}"
    );

    // Its history: since when, how many checks failed, when the next is.
    let first = status_of(&manager, "down");
    assert!(first.failed_attempts >= 1, "{first:?}");
    assert!(
        first.next_attempt.is_some_and(|next| next > first.since),
        "{first:?}"
    );
    // Attempts of a cluster that stays unreachable change no state the
    // fleet watch tells of, and the metrics registry tells no one.
    eventually(
        Polled::Unsignalled,
        "more failed attempts, the time in state growing",
        || async {
            let now = status_of(&manager, "down");
            now.failed_attempts >= first.failed_attempts + 2
                && series(
                    &manager,
                    r#"mcr_cluster_longest_in_state_seconds{state="unreachable"}"#,
                ) >= Some(1.0)
        },
    )
    .await;
    let later = status_of(&manager, "down");
    assert_eq!(later.since, first.since, "still in the state it entered");
    assert!(
        series(&manager, "mcr_cluster_most_failed_attempts")
            >= Some(f64::from(first.failed_attempts + 2))
    );
    assert!(
        series(&manager, r#"mcr_cluster_failed_attempts{cluster="down"}"#)
            >= Some(f64::from(first.failed_attempts + 2))
    );
    assert!(
        series(
            &manager,
            r#"mcr_cluster_in_state_seconds{cluster="down",state="unreachable"}"#
        ) >= Some(1.0)
    );
    let (_, json) = multicluster_runtime::testing::http_get(address, "/clusters?format=json")
        .await
        .expect("/clusters");
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let shown = report["clusters"]
        .as_array()
        .and_then(|clusters| clusters.iter().find(|cluster| cluster["name"] == "down"))
        .expect("down is shown");
    assert_eq!(shown["state"], "unreachable", "{json}");
    assert!(shown["failedAttempts"].as_u64() >= Some(u64::from(first.failed_attempts + 2)));
    for field in ["since", "nextAttempt"] {
        assert!(
            shown[field]
                .as_str()
                .is_some_and(|time| time.ends_with('Z')),
            "{field} in {json}"
        );
    }

    down.start_api_server().await.expect("restart");
    recorder.wait_for_more(&req("down", "waiting"), 0).await;
    wait_until_ready(&manager, "down").await;
    let ready = status_of(&manager, "down");
    assert_eq!(ready.failed_attempts, 0);
    assert_eq!(ready.next_attempt, None);
    assert!(ready.since > first.since, "{ready:?}");
    assert_eq!(
        series(
            &manager,
            r#"mcr_cluster_longest_in_state_seconds{state="unreachable"}"#
        ),
        Some(0.0)
    );
    // Found unreachable once, however often it was retried meanwhile.
    let metrics = manager.metrics().encode();
    assert!(
        metrics.contains(r#"mcr_cluster_state_changes_total{state="unreachable"} 1"#),
        "{metrics}"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_api_server_does_not_delay_the_other_clusters() {
    let (healthy, failing) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (healthy, failing) = (healthy.expect("healthy"), failing.expect("failing"));
    create_config_map(&failing, "before", &[]).await;

    let provider = TestProvider::default();
    provider
        .clusters
        .add("healthy", cluster_for("healthy", &healthy).await)
        .expect("add");
    provider
        .clusters
        .add("failing", cluster_for("failing", &failing).await)
        .expect("add");
    let manager = Manager::builder(cluster_for("local", &healthy).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(recording_controller(&recorder))
        .expect("add");
    let (shutdown, task) = run_manager(&manager);
    recorder.wait_for_more(&req("failing", "before"), 0).await;

    failing.stop_api_server();
    let mut latencies = Vec::new();
    for i in 0..20 {
        let name = format!("while-down-{i}");
        let created = Instant::now();
        create_config_map(&healthy, &name, &[]).await;
        recorder.wait_for_more(&req("healthy", &name), 0).await;
        latencies.push(recorder.times(&req("healthy", &name))[0] - created);
    }
    latencies.sort();
    // Reported, not asserted: timing targets belong to benchmarks.
    eprintln!(
        "event-to-reconcile latency on the healthy cluster while the other is down: p50 {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A member whose server refuses connections is reported unreachable with
/// a reason that names the server and the refusal (and no credential), on
/// `/clusters` too, with the default options.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_member_is_named_with_its_address_and_the_cause() {
    let cp = ControlPlane::start().await.expect("control plane");
    // A port that nothing listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let mut kubeconfig = cp.kubeconfig().clone();
    let server = format!("https://127.0.0.1:{port}");
    if let Some(cluster) = kubeconfig.clusters[0].cluster.as_mut() {
        cluster.server = Some(server.clone());
    }
    let down = from_kubeconfig("down", &kubeconfig, Default::default()).await;
    let provider = TestProvider::default();
    provider.clusters.add("down", down).expect("add");
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (shutdown, task) = run_manager(&manager);
    manager.serve_health(listener, shutdown.clone());
    wait_for_fleet(&manager, "the member to be reported unreachable", || {
        matches!(
            state_of(&manager, "down"),
            Some(ClusterState::Unreachable(_))
        )
    })
    .await;
    let Some(ClusterState::Unreachable(reason)) = state_of(&manager, "down") else {
        panic!("unreachable, then not");
    };
    assert!(
        reason.starts_with(&format!("{server} cannot be reached: ")),
        "{reason}"
    );
    assert!(reason.contains("Connection refused"), "{reason}");
    let (_, clusters) = multicluster_runtime::testing::http_get(address, "/clusters")
        .await
        .expect("/clusters");
    assert!(
        clusters
            .lines()
            .any(|line| line.starts_with(&format!("down\tunreachable: {reason}\tsince "))),
        "{clusters}"
    );
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A member behind a counting front door (its connections, when they
/// came), built with `member_options`, in a manager with
/// `manager_options` whose reconciles never call it, once it is ready.
struct Behind {
    member: ControlPlane,
    _hub: ControlPlane,
    front: common::relay::Relay,
    manager: Manager,
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), multicluster_runtime::Error>>,
}

async fn behind_a_front_door(
    member_options: multicluster_runtime::provider::member::MemberOptions,
    manager_options: ManagerOptions,
) -> Behind {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    let mut kubeconfig = member.kubeconfig().clone();
    let server = kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .and_then(|cluster| cluster.server.clone())
        .expect("server");
    let upstream: std::net::SocketAddr = server
        .trim_start_matches("https://")
        .parse()
        .expect("an address");
    let front = common::relay::Relay::start(upstream).await;
    if let Some(cluster) = kubeconfig.clusters[0].cluster.as_mut() {
        cluster.server = Some(format!("https://127.0.0.1:{}", front.port));
    }
    let cluster = multicluster_runtime::provider::kubeconfig::KubeconfigCluster {
        inventory: Default::default(),
        policy: Default::default(),
        name: "member".into(),
        text: multicluster_envtest::to_yaml(&kubeconfig).expect("yaml"),
        source: "test kubeconfig".into(),
        stable_id: None,
        member: member_options,
    }
    .build()
    .await
    .expect("cluster");
    let provider = TestProvider::default();
    provider.clusters.add("member", cluster).expect("add");
    let manager = Manager::builder(cluster_for("local", &hub).await)
        .options(manager_options)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    // Its reconciles never call the member: what reaches it are the
    // watch's attempts and the manager's probes.
    manager
        .add_controller(recording_controller(&recorder))
        .expect("add");
    let (shutdown, task) = run_manager(&manager);
    wait_for_fleet(&manager, "the member ready", || {
        state_of(&manager, "member") == Some(ClusterState::Ready)
    })
    .await;
    Behind {
        member,
        _hub: hub,
        front,
        manager,
        shutdown,
        task,
    }
}

/// Waits for the next connection after `asked` and asserts it came when
/// `/clusters` said it would (`next`), within a second or so.
async fn next_attempt_is_true(
    front: &common::relay::Relay,
    asked: Instant,
    next: std::time::SystemTime,
    within: Duration,
) -> f64 {
    front
        .connected
        .wait_until_within(within, "the next attempt", || {
            !front.connections_since(asked).is_empty()
        })
        .await;
    let came = front.connections_since(asked)[0].1;
    let off = match came.duration_since(next) {
        Ok(late) => late.as_secs_f64(),
        Err(early) => -early.duration().as_secs_f64(),
    };
    assert!(
        (-0.5..=1.5).contains(&off),
        "the next attempt came {off:.2} s after the one told"
    );
    off
}

/// A member whose API server stops for good is tried again less and less
/// often, up to a cap (counted at its front door over a minute, default
/// options), and `/clusters`' next attempt is when the next one comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_retried_less_and_less_and_its_next_attempt_is_told() {
    let Behind {
        member,
        _hub,
        front,
        manager,
        shutdown,
        task,
    } = behind_a_front_door(Default::default(), ManagerOptions::default()).await;
    member.stop_api_server();
    wait_for_fleet(&manager, "the member unreachable", || {
        matches!(
            state_of(&manager, "member"),
            Some(ClusterState::Unreachable(_))
        )
    })
    .await;
    let down = Instant::now();
    let half = Duration::from_secs(30);
    // Half a minute into the outage (a scenario clock: how long it has
    // lasted), the next attempt as `/clusters` tells it, against the next
    // connection that comes.
    tokio::time::sleep_until((down + half).into()).await;
    let asked = Instant::now();
    let next = status_of(&manager, "member")
        .next_attempt
        .expect("a next attempt is told");
    let off = next_attempt_is_true(&front, asked, next, Duration::from_secs(90)).await;

    // Less and less often: fewer attempts in the second half-minute than
    // in the first, and in the second no more than a cap of 8 s (16 s with
    // its random part) allows the watch, besides the probes.
    tokio::time::sleep_until((down + 2 * half).into()).await;
    let attempts = front.connections_since(down);
    let first = attempts.iter().filter(|(at, _)| *at < down + half).count();
    let second = attempts.len() - first;
    eprintln!(
        "attempts: {first} in the first half-minute, {second} in the second; next told {off:+.2} s"
    );
    assert!(
        second < first && second <= 8,
        "{first} attempts in the first half-minute, {second} in the second"
    );
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A member down for longer than its long-outage threshold (set to 5 s
/// here; 10 minutes by default, whose schedule the retry module's unit
/// test shows on a paused clock) is tried ever more rarely: its watch and
/// the manager's probes grow past their short-outage caps (2 s and 4 s
/// here) up to 30 s, so fewer attempts reach its front door from 25 s to
/// 45 s into the outage than in its first 10 s, and `/clusters`' next
/// attempt is still when the next one comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_dead_for_long_is_tried_ever_more_rarely() {
    use multicluster_runtime::cache::{CacheOptions, LongOutage, WatchBackoff};
    let long = LongOutage::default()
        .after(Duration::from_secs(5))
        .max(Duration::from_secs(30));
    let member_options = multicluster_runtime::provider::member::MemberOptions::default().cache(
        CacheOptions::default().backoff(
            WatchBackoff::default()
                .max(Duration::from_secs(2))
                .long_outage(long),
        ),
    );
    let manager_options = ManagerOptions::default()
        .max_retry_delay(Duration::from_secs(4))
        .long_outage(long);
    let Behind {
        member,
        _hub,
        front,
        manager,
        shutdown,
        task,
    } = behind_a_front_door(member_options, manager_options).await;

    member.stop_api_server();
    wait_for_fleet(&manager, "the member unreachable", || {
        matches!(
            state_of(&manager, "member"),
            Some(ClusterState::Unreachable(_))
        )
    })
    .await;
    let down = Instant::now();
    // Scenario clock: how long the outage has lasted.
    tokio::time::sleep_until((down + Duration::from_secs(25)).into()).await;
    let asked = Instant::now();
    let next = status_of(&manager, "member")
        .next_attempt
        .expect("a next attempt is told");
    let off = next_attempt_is_true(&front, asked, next, Duration::from_secs(70)).await;
    let window_end = (down + Duration::from_secs(45)).max(Instant::now());
    tokio::time::sleep_until(window_end.into()).await;
    let attempts = front.connections_since(down);
    let early = attempts
        .iter()
        .filter(|(at, _)| *at < down + Duration::from_secs(10))
        .count();
    let late = attempts
        .iter()
        .filter(|(at, _)| {
            *at >= down + Duration::from_secs(25) && *at < down + Duration::from_secs(45)
        })
        .count();
    eprintln!(
        "attempts: {early} in the first 10 s, {late} from 25 s to 45 s; next told {off:+.2} s"
    );
    // Short caps would make at least one attempt every 4 s (10 in 20 s).
    assert!(
        late < early && late <= 6,
        "{early} attempts in the first 10 s, {late} from 25 s to 45 s"
    );
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
