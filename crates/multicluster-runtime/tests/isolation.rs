//! One member's trouble stays its own: a member whose API server hangs
//! (SIGSTOP) while reconciles of it run does not stall the others, and the
//! state of every member says what is going on, back to ready by itself.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use multicluster_envtest::{ControlPlane, config_map_rules};
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::client::ClientOptions;
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::{Polled, wait_for_fleet, wait_for_state, wait_on};
use multicluster_runtime::{Cluster, ClusterName, Manager, ManagerOptions};

/// The copy a reconcile writes of a source ConfigMap.
fn copy_of(name: &str) -> String {
    format!("{name}-copy")
}

/// Holds reconciles of sources named `burst-*` before their write until it
/// opens, counting those waiting: the test decides when they reach the
/// server.
#[derive(Clone)]
struct Gate {
    open: Arc<tokio::sync::watch::Sender<bool>>,
    /// How many reconciles wait at the gate.
    waiting: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Gate {
    fn new() -> Self {
        Self {
            open: Arc::new(tokio::sync::watch::channel(false).0),
            waiting: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    async fn pass(&self, request: &Request) {
        if !request.name.starts_with("burst-") {
            return;
        }
        self.waiting.send_modify(|waiting| *waiting += 1);
        let _ = self.open.subscribe().wait_for(|open| *open).await;
        self.waiting.send_modify(|waiting| *waiting -= 1);
    }

    /// Waits until at least `count` reconciles wait at the gate.
    async fn until_waiting(&self, count: usize) {
        wait_on(
            &format!("{count} reconciles at the gate"),
            &mut self.waiting.subscribe(),
            |waiting| *waiting >= count,
        )
        .await;
    }
}

/// Copies every ConfigMap without `-copy` in its name: a write to the
/// member per reconcile. With the default options (one slot per cluster).
fn copying_controller(recorder: &Recorder, gate: &Gate) -> Controller {
    let (recorder, gate) = (recorder.clone(), gate.clone());
    Controller::builder("copy")
        .for_resource(Watch::<ConfigMap>::new().filter(
            multicluster_runtime::controller::filters::custom(
                |event: &multicluster_runtime::cache::CacheEvent<ConfigMap>| {
                    !event
                        .object()
                        .metadata
                        .name
                        .as_deref()
                        .unwrap_or_default()
                        .ends_with("-copy")
                },
            ),
        ))
        .build(move |request: Request, cluster: Cluster| {
            let (recorder, gate) = (recorder.clone(), gate.clone());
            async move {
                gate.pass(&request).await;
                let copy = serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": copy_of(&request.name)},
                });
                Api::<ConfigMap>::namespaced(cluster.client(), "default")
                    .patch(
                        &copy_of(&request.name),
                        &PatchParams::apply("isolation-test"),
                        &Patch::Apply(copy),
                    )
                    .await?;
                recorder.record(&request);
                Ok::<_, kube::Error>(Action::await_change())
            }
        })
        .expect("controller")
}

/// A cluster of `cp` built from its kubeconfig, as providers build them,
/// with `options`.
async fn kubeconfig_cluster(name: &str, cp: &ControlPlane, options: &ClientOptions) -> Cluster {
    KubeconfigCluster {
        inventory: Default::default(),
        policy: multicluster_runtime::client::KubeconfigPolicy::default(),
        name: name.into(),
        text: multicluster_envtest::to_yaml(cp.kubeconfig()).expect("yaml"),
        source: format!("test kubeconfig of {name}"),
        stable_id: None,
        member: MemberOptions::from(options.clone()),
    }
    .build()
    .await
    .expect("cluster")
}

fn state_of(manager: &Manager, name: &str) -> Option<ClusterState> {
    manager.cluster_state(&ClusterName::from(name))
}

async fn copy_exists(cp: &ControlPlane, name: &str) -> bool {
    let client = cp.client().await.expect("client");
    Api::<ConfigMap>::namespaced(client, "default")
        .get_opt(&copy_of(name))
        .await
        .ok()
        .flatten()
        .is_some()
}

/// With the default options, a member whose API server stops answering
/// while reconciles of it run holds none of the slots the other members
/// need: their changes are reconciled while it hangs. It is reported
/// unreachable with the reason, and once it answers again it converges and
/// is ready, with nothing restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_does_not_stall_the_others_and_is_reported() {
    let (m1, m2, m3) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (m1, m2, m3) = (m1.expect("m1"), m2.expect("m2"), m3.expect("m3"));
    // Long enough that waiting for m1's requests to time out would miss the
    // deadline below for the healthy members.
    let options = ClientOptions::default().request_timeout(Some(Duration::from_secs(10)));
    let provider = TestProvider::default();
    for (name, cp) in [("m1", &m1), ("m2", &m2), ("m3", &m3)] {
        provider
            .clusters
            .add(name, kubeconfig_cluster(name, cp, &options).await)
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("local", &m2).await)
        .provider(Arc::new(provider))
        .options(ManagerOptions::default().unhealthy_after(Duration::from_secs(1)))
        .build();
    let recorder = Recorder::default();
    let gate = Gate::new();
    manager
        .add_controller(copying_controller(&recorder, &gate))
        .expect("add");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, task) = run_manager(&manager);
    manager.serve_health(listener, stop.clone());
    wait_for_fleet(&manager, "every member to be ready", || {
        ["m1", "m2", "m3"]
            .iter()
            .all(|name| state_of(&manager, name) == Some(ClusterState::Ready))
    })
    .await;

    // A burst of changes in m1, and m1 stops answering while they are
    // being reconciled: as many as m1 may run at once wait at the gate,
    // then go on to write to the stopped server.
    for i in 0..20 {
        create_config_map(&m1, &format!("burst-{i}"), &[]).await;
    }
    gate.until_waiting(1).await;
    m1.pause_api_server().expect("SIGSTOP");
    gate.open.send_replace(true);

    // The healthy members are reconciled meanwhile, well within the time m1
    // stays stopped (and before any of its requests times out).
    for (name, cp) in [("m2", &m2), ("m3", &m3)] {
        create_config_map(cp, "during", &[]).await;
        recorder
            .wait_until_within(
                Duration::from_secs(5),
                &format!("the change in {name} to be reconciled while m1 hangs"),
                |recorder| recorder.count(&req(name, "during")) > 0,
            )
            .await;
    }
    // A request on an open connection gets no answer; a new connection
    // gets no TLS handshake (the connect timeout).
    wait_for_state(&manager, "m1", Duration::from_secs(30), |state| {
        matches!(state, Some(ClusterState::Unreachable(reason))
            if reason.contains("no answer within 10s") || reason.contains("deadline has elapsed"))
    })
    .await;
    let (_, clusters) = multicluster_runtime::testing::http_get(address, "/clusters")
        .await
        .expect("/clusters");
    assert!(
        clusters
            .lines()
            .any(|line| line.starts_with("m1\tunreachable: ")),
        "{clusters}"
    );
    assert!(
        clusters
            .lines()
            .any(|line| line.starts_with("m2\tready\tsince ")),
        "{clusters}"
    );

    // Back: m1 converges and is ready again by itself.
    m1.resume_api_server().expect("SIGCONT");
    for i in 0..20 {
        let name = format!("burst-{i}");
        eventually(
            Polled::ApiServer,
            &format!("{name} to be copied in m1"),
            || async { copy_exists(&m1, &name).await },
        )
        .await;
    }
    wait_for_fleet(&manager, "m1 to be ready again", || {
        state_of(&manager, "m1") == Some(ClusterState::Ready)
    })
    .await;
    let metrics = manager.metrics().encode();
    assert!(
        metrics
            .lines()
            .any(|line| line == "mcr_clusters{state=\"unreachable\"} 0"),
        "{metrics}"
    );

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A member whose credentials lose RBAC for the watched type is degraded,
/// with the server's 403 as the reason, and ready again once the RBAC is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_loses_rbac_is_degraded_until_it_is_back() {
    let member = ControlPlane::start().await.expect("member");
    create_config_map(&member, "seen", &[]).await;
    let rules = config_map_rules(&["get", "list", "watch", "patch", "create"]);
    member
        .grant_in_namespace("default", "reader", rules.clone())
        .await
        .expect("grant");
    let identity = member.user_kubeconfig("reader", None).expect("kubeconfig");
    let client = multicluster_envtest::client_for(&identity)
        .await
        .expect("client");
    // Watches end after 3 s and start again, as they do after their
    // server-side timeout (minutes, normally): that is when a lost grant
    // shows.
    let cache = Cache::with_options(
        "member",
        client.clone(),
        CacheOptions::default()
            .namespace("default".to_string())
            .watcher(watcher::Config::default().timeout(3)),
    );
    let provider = TestProvider::default();
    provider
        .clusters
        .add("member", Cluster::with_cache("member", client, cache))
        .expect("add");
    let manager = Manager::builder(cluster_for("local", &member).await)
        .provider(Arc::new(provider))
        .options(ManagerOptions::default().unhealthy_after(Duration::from_secs(1)))
        .metrics(multicluster_runtime::metrics::Metrics::new(true))
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(copying_controller(&recorder, &Gate::new()))
        .expect("add");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, task) = run_manager(&manager);
    manager.serve_health(listener, stop.clone());
    recorder.wait_for_more(&req("member", "seen"), 0).await;
    wait_until_ready(&manager, "member").await;

    let bindings = Api::<RoleBinding>::namespaced(member.client().await.expect("admin"), "default");
    bindings
        .delete("reader", &DeleteParams::default())
        .await
        .expect("revoke");
    wait_for_fleet(&manager, "the member to be degraded with a 403", || {
        matches!(
            state_of(&manager, "member"),
            Some(ClusterState::Degraded(reason)) if reason.contains("403")
        )
    })
    .await;
    let (_, clusters) = multicluster_runtime::testing::http_get(address, "/clusters")
        .await
        .expect("/clusters");
    assert!(
        clusters
            .lines()
            .any(|line| line.starts_with("member\tdegraded: ") && line.contains("403")),
        "{clusters}"
    );
    let metrics = manager.metrics().encode();
    for expected in [
        "mcr_cluster_state{cluster=\"member\",state=\"degraded\"} 1",
        "mcr_clusters{state=\"degraded\"} 1",
    ] {
        assert!(metrics.lines().any(|line| line == expected), "{metrics}");
    }
    assert!(
        !metrics.contains("mcr_cluster_state{cluster=\"member\",state=\"ready\"}"),
        "one state per cluster: {metrics}"
    );

    member
        .grant_in_namespace("default", "reader", rules)
        .await
        .expect("grant again");
    wait_for_fleet(&manager, "the member to be ready again", || {
        state_of(&manager, "member") == Some(ClusterState::Ready)
    })
    .await;

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// With the default options, a member whose reconciles never return (a
/// reconciler waiting on something that never comes) holds up no other
/// member: theirs start at once, however long the hung one waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_default_options_a_member_whose_reconciles_hang_holds_up_no_other() {
    let cp = ControlPlane::start().await.expect("control plane");
    let provider = TestProvider::default();
    for name in ["hung", "m2", "m3"] {
        provider
            .clusters
            .add(name, cluster_for(name, &cp).await)
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    let hung_started = Arc::new(tokio::sync::Notify::new());
    // Set when a hung reconcile is let go (its future dropped).
    let hung_let_go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let controller = {
        let (recorder, hung_started, hung_let_go) =
            (recorder.clone(), hung_started.clone(), hung_let_go.clone());
        Controller::builder("hangs-in-one-member")
            .for_resource(Watch::<ConfigMap>::new())
            .build(move |request: Request, _cluster: Cluster| {
                let (recorder, hung_started, hung_let_go) =
                    (recorder.clone(), hung_started.clone(), hung_let_go.clone());
                async move {
                    if request.cluster.as_str() == "hung" {
                        struct LetGo(Arc<std::sync::atomic::AtomicBool>);
                        impl Drop for LetGo {
                            fn drop(&mut self) {
                                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
                            }
                        }
                        let _let_go = LetGo(hung_let_go);
                        hung_started.notify_one();
                        std::future::pending::<()>().await;
                    }
                    recorder.record(&request);
                    Ok::<_, kube::Error>(Action::await_change())
                }
            })
            .expect("controller")
    };
    manager.add_controller(controller).expect("add");
    let (stop, task) = run_manager(&manager);
    create_config_map(&cp, "first", &[]).await;
    tokio::time::timeout(DEADLINE, hung_started.notified())
        .await
        .expect("the hung member's reconcile started");
    // Every later change of the other members starts while it hangs.
    for round in 0..3 {
        let name = format!("later-{round}");
        create_config_map(&cp, &name, &[]).await;
        for member in ["m2", "m3"] {
            recorder
                .wait_until_within(
                    Duration::from_secs(5),
                    &format!("{member}'s {name} to be reconciled"),
                    |recorder| recorder.count(&req(member, &name)) > 0,
                )
                .await;
        }
    }
    // The others did not get their turn by the hung reconcile being let
    // go: it still holds its own member's slot.
    assert!(
        !hung_let_go.load(std::sync::atomic::Ordering::SeqCst),
        "the hung reconcile was let go to make room"
    );
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// With the default options, three of five members stopped (SIGSTOP) while
/// their reconciles write to them hold up neither healthy member, and all
/// five converge once they answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_default_options_three_paused_members_of_five_hold_up_no_healthy_one() {
    let planes = futures::future::join_all((0..5).map(|_| ControlPlane::start())).await;
    let planes: Vec<ControlPlane> = planes
        .into_iter()
        .map(|cp| cp.expect("control plane"))
        .collect();
    let names = ["paused-1", "paused-2", "paused-3", "healthy-1", "healthy-2"];
    let provider = TestProvider::default();
    for (name, cp) in names.iter().zip(&planes) {
        provider
            .clusters
            .add(
                *name,
                kubeconfig_cluster(name, cp, &ClientOptions::default()).await,
            )
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("local", &planes[4]).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    let gate = Gate::new();
    manager
        .add_controller(copying_controller(&recorder, &gate))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    wait_for_fleet(&manager, "every member to be ready", || {
        names
            .iter()
            .all(|name| state_of(&manager, name) == Some(ClusterState::Ready))
    })
    .await;

    // A burst in each member to be paused; their reconciles wait at the
    // gate, then write to servers that no longer answer.
    for cp in &planes[..3] {
        for i in 0..5 {
            create_config_map(cp, &format!("burst-{i}"), &[]).await;
        }
    }
    // A reconcile of each member to be paused.
    gate.until_waiting(3).await;
    for cp in &planes[..3] {
        cp.pause_api_server().expect("SIGSTOP");
    }
    gate.open.send_replace(true);

    for round in 0..3 {
        let name = format!("during-{round}");
        for (member, cp) in names[3..].iter().zip(&planes[3..]) {
            create_config_map(cp, &name, &[]).await;
            recorder
                .wait_until_within(
                    Duration::from_secs(5),
                    &format!("{member}'s {name} to be copied while three members hang"),
                    |recorder| recorder.count(&req(member, &name)) > 0,
                )
                .await;
        }
    }

    for cp in &planes[..3] {
        cp.resume_api_server().expect("SIGCONT");
    }
    for (member, cp) in names[..3].iter().zip(&planes[..3]) {
        for i in 0..5 {
            let name = format!("burst-{i}");
            eventually(
                Polled::ApiServer,
                &format!("{member}'s {name} to be copied"),
                || async { copy_exists(cp, &name).await },
            )
            .await;
        }
    }
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The longest a member whose API server stops answering while nothing
/// talks to it may go unreported with the default options: its connection
/// is pinged after 30 s without a frame and closed 15 s later if the ping
/// is not answered (client-go's timings), the keep-alive grid may add a
/// second, the manager's `unhealthy_after` three and its health walk one;
/// the rest is slack for a loaded machine.
const IDLE_HANG_REPORTED_WITHIN: Duration = Duration::from_secs(60);

/// With the default options, a member that stops answering (SIGSTOP) while
/// idle — no reconcile running, its watch quiet — is found out by its
/// connection's keep-alive pings and reported unreachable, while the other
/// member stays ready; once it answers again it is ready by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_member_that_stops_answering_is_found_by_its_keep_alive_pings() {
    let (idle, other) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (idle, other) = (idle.expect("idle"), other.expect("other"));
    let provider = TestProvider::default();
    for (name, cp) in [("idle", &idle), ("other", &other)] {
        provider
            .clusters
            .add(
                name,
                kubeconfig_cluster(name, cp, &ClientOptions::default()).await,
            )
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("local", &other).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(copying_controller(&recorder, &Gate::new()))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    wait_for_fleet(&manager, "both members to be ready", || {
        ["idle", "other"]
            .iter()
            .all(|name| state_of(&manager, name) == Some(ClusterState::Ready))
    })
    .await;
    // Idle means done with its first reconciles too (each writes a copy):
    // a write under way when it stops would be what reports it.
    let present = Api::<ConfigMap>::all(idle.client().await.expect("client"))
        .list(&Default::default())
        .await
        .expect("list");
    for object in &present.items {
        let name = object.metadata.name.clone().unwrap_or_default();
        if !name.ends_with("-copy") {
            let namespace = object.metadata.namespace.as_deref();
            recorder
                .wait_for_more(&Request::new("idle", namespace, name), 0)
                .await;
        }
    }

    idle.pause_api_server().expect("SIGSTOP");
    let state = wait_for_state(&manager, "idle", IDLE_HANG_REPORTED_WITHIN, |state| {
        matches!(state, Some(ClusterState::Unreachable(_)))
    })
    .await;
    let Some(ClusterState::Unreachable(reason)) = state else {
        panic!("waited for unreachable, got {state:?}");
    };
    // The ping went unanswered, so hyper closed the connection under the
    // watch: that is what the watch reports.
    assert!(
        reason.contains("watching configmaps") && reason.contains("broken pipe"),
        "reported for its closed connection: {reason}"
    );
    assert_eq!(state_of(&manager, "other"), Some(ClusterState::Ready));

    idle.resume_api_server().expect("SIGCONT");
    wait_for_fleet(&manager, "the member to be ready again", || {
        state_of(&manager, "idle") == Some(ClusterState::Ready)
    })
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
