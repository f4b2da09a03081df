//! A cluster's state tells the truth about failures that repeat, with the
//! default options: a member whose credential may not list a watched type,
//! or whose RBAC is revoked while it runs, is degraded with a short reason
//! naming what was refused, is asked less and less often, leaves the other
//! members alone, and is ready again by itself once the grant is back.

mod common;

use multicluster_runtime::testing::Polled;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use multicluster_envtest::{ControlPlane, config_map_rules};
use multicluster_runtime::controller::{Action, Controller, Request, Watch};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::{eventually_within, recording_controller};
use multicluster_runtime::testing::{wait_for_fleet, wait_for_fleet_within};
use multicluster_runtime::{Cluster, Manager, ManagerOptions};

/// Reading ConfigMaps, as a cache does.
const READ: [&str; 3] = ["get", "list", "watch"];

/// A cluster of `cp` as providers build it, from a kubeconfig holding the
/// token of the service account `robots/member` (which has no rights until
/// a test grants some), with the default client options.
async fn member_cluster(name: &str, cp: &ControlPlane) -> Cluster {
    let identity = cp
        .service_account_kubeconfig("robots", "member", Duration::from_secs(3600))
        .await
        .expect("service account");
    KubeconfigCluster {
        inventory: Default::default(),
        policy: multicluster_runtime::client::KubeconfigPolicy::default(),
        name: name.into(),
        text: multicluster_envtest::to_yaml(&identity).expect("yaml"),
        source: format!("test kubeconfig of {name}"),
        stable_id: None,
        member: MemberOptions::default(),
    }
    .build()
    .await
    .expect("cluster")
}

/// A cluster of `cp` with its admin credentials, built the same way.
async fn admin_cluster(name: &str, cp: &ControlPlane) -> Cluster {
    KubeconfigCluster {
        inventory: Default::default(),
        policy: multicluster_runtime::client::KubeconfigPolicy::default(),
        name: name.into(),
        text: multicluster_envtest::to_yaml(cp.kubeconfig()).expect("yaml"),
        source: format!("test kubeconfig of {name}"),
        stable_id: None,
        member: MemberOptions::default(),
    }
    .build()
    .await
    .expect("cluster")
}

fn state_of(manager: &Manager, name: &str) -> Option<ClusterState> {
    manager.cluster_state(&name.into())
}

/// How many reads of ConfigMaps the API server refused (403), by its audit
/// log: watches, since a cache fills from a streaming list by default
/// (a watch is recorded when its response starts and when it completes;
/// counted once).
/// When the member's API server answered each watch of ConfigMaps it
/// refused, in order, from its audit log.
fn refused_config_map_watches(member: &ControlPlane) -> Vec<jiff::Timestamp> {
    member
        .audit_events()
        .into_iter()
        .filter(|event| {
            event["verb"] == "watch"
                && event["stage"] == "ResponseComplete"
                && event["objectRef"]["resource"] == "configmaps"
                && event["responseStatus"]["code"] == 403
        })
        .map(|event| {
            event["stageTimestamp"]
                .as_str()
                .and_then(|at| at.parse().ok())
                .expect("stageTimestamp")
        })
        .collect()
}

fn metric(manager: &Manager, name: &str) -> Option<String> {
    manager
        .metrics()
        .encode()
        .lines()
        .find(|line| line.starts_with(name))
        .map(str::to_string)
}

/// A member whose credential may not read the watched type is degraded
/// within `unhealthy_after` and a backoff step, the reason naming the
/// resource and the refusal in one short line; it is asked again with a
/// doubling backoff (kube-runtime's own asked about 150 times a minute);
/// another member is reconciled and ready meanwhile; and once the grant
/// arrives, the member is ready and reconciled without being engaged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_may_not_read_a_watched_type_is_degraded_and_asked_rarely() {
    let (member, healthy) = tokio::join!(
        ControlPlane::builder().audit(true).start(),
        ControlPlane::start()
    );
    let (member, healthy) = (member.expect("member"), healthy.expect("healthy"));
    create_config_map(&member, "waiting", &[]).await;
    create_config_map(&healthy, "seen", &[]).await;
    let provider = TestProvider::default();
    provider
        .clusters
        .add("member", member_cluster("member", &member).await)
        .expect("add");
    provider
        .clusters
        .add("healthy", admin_cluster("healthy", &healthy).await)
        .expect("add");
    let metrics = Metrics::default();
    let manager = Manager::builder(cluster_for("local", &healthy).await)
        .provider(Arc::new(provider))
        .metrics(metrics)
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(
            recording_controller("recorder", Watch::<ConfigMap>::new(), &recorder)
                .expect("controller"),
        )
        .expect("add");
    let (stop, task) = run_manager(&manager);

    // unhealthy_after (3 s) and a backoff step (up to 2 s), checked every
    // second, after the member was found ready and its watch started.
    wait_for_fleet_within(
        &manager,
        Duration::from_secs(15),
        "the member to be degraded",
        || {
            matches!(
                state_of(&manager, "member"),
                Some(ClusterState::Degraded(_))
            )
        },
    )
    .await;
    let Some(ClusterState::Degraded(reason)) = state_of(&manager, "member") else {
        panic!("degraded, then not");
    };
    for expected in [
        "watching configmaps",
        "403 Forbidden",
        "cannot watch resource",
    ] {
        assert!(reason.contains(expected), "{reason} should say {expected}");
    }
    assert!(
        reason.len() < 400 && !reason.contains('\n'),
        "one short line: {reason}"
    );
    assert!(
        !reason.contains("ErrorResponse") && !reason.contains("Status {"),
        "{reason}"
    );
    recorder.wait_for_more(&req("healthy", "seen"), 0).await;
    wait_until_ready(&manager, "healthy").await;
    // Ready so far: the local cluster and `healthy`; the member refused
    // from its first watch was never ready on the way to degraded.
    assert_eq!(times_entered(&manager, "ready"), 2);

    // Asked again with backoff: the refusals the member's API server
    // recorded are at least 1, 2 and 4 s apart (each delay is stretched by
    // up to as much again at random, never shortened).
    eventually_within(
        Duration::from_secs(45),
        Polled::OtherProcess,
        "four refused watches in the member's audit log",
        || async { refused_config_map_watches(&member).len() >= 4 },
    )
    .await;
    let refused = refused_config_map_watches(&member);
    for (step, pair) in refused.windows(2).take(3).enumerate() {
        let gap = pair[1].duration_since(pair[0]);
        let least = jiff::SignedDuration::from_millis(1000 << step);
        assert!(
            gap >= least,
            "refusal {} came {gap:?} after the one before, sooner than the backoff's {least:?}: {refused:?}",
            step + 2
        );
    }
    // The fleet view counts the refusals in a row and says when the watch
    // is asked next.
    let (_, status) = manager
        .cluster_states()
        .into_iter()
        .find(|(name, _)| name.as_str() == "member")
        .expect("the member");
    assert!(status.failed_attempts >= 2, "{status:?}");
    assert!(
        status.next_attempt.is_some_and(|next| next > status.since),
        "{status:?}"
    );

    // The cache watches every namespace: reading everywhere.
    member
        .grant_service_account_cluster_wide("robots", "member", config_map_rules(&READ))
        .await
        .expect("grant");
    // The next attempt comes within the delay in progress (at most 30 s,
    // 60 s with its random part).
    wait_for_fleet_within(
        &manager,
        Duration::from_secs(90),
        "the member to be ready",
        || state_of(&manager, "member") == Some(ClusterState::Ready),
    )
    .await;
    recorder.wait_for_more(&req("member", "waiting"), 0).await;
    assert_eq!(
        metric(&manager, "mcr_cluster_disengagements_total").as_deref(),
        Some("mcr_cluster_disengagements_total 0"),
        "the member was not engaged again"
    );

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Copies every ConfigMap without `-copy` in its name, counting attempts.
fn copying_controller(attempts: &Recorder, copied: &Recorder) -> Controller {
    let (attempts, copied) = (attempts.clone(), copied.clone());
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
            let (attempts, copied) = (attempts.clone(), copied.clone());
            async move {
                attempts.record(&request);
                let name = format!("{}-copy", request.name);
                let copy = serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name},
                });
                Api::<ConfigMap>::namespaced(cluster.client(), "default")
                    .patch(
                        &name,
                        &PatchParams::apply("health-test"),
                        &Patch::Apply(copy),
                    )
                    .await?;
                copied.record(&request);
                Ok::<_, kube::Error>(Action::await_change())
            }
        })
        .expect("controller")
}

/// A member whose RoleBinding is deleted while it runs has its writes
/// refused while its watch goes on: it is degraded within
/// `unhealthy_after`, the reason saying which request was refused, and is
/// ready again once the grant is back, its refused change copied after all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_writes_are_refused_is_degraded_until_the_grant_is_back() {
    let member = ControlPlane::start().await.expect("member");
    create_config_map(&member, "before", &[]).await;
    // Reading everywhere (the cache watches every namespace), writing in
    // `default` through a RoleBinding the test deletes and restores.
    let provider = TestProvider::default();
    provider
        .clusters
        .add("member", member_cluster("member", &member).await)
        .expect("add");
    member
        .grant_service_account_cluster_wide("robots", "member", config_map_rules(&READ))
        .await
        .expect("grant reads");
    let verbs = ["create", "patch"];
    member
        .grant_service_account_in_namespace("default", "robots", "member", config_map_rules(&verbs))
        .await
        .expect("grant writes");
    let manager = Manager::builder(cluster_for("local", &member).await)
        .provider(Arc::new(provider))
        .options(ManagerOptions::default())
        .build();
    let (attempts, copied) = (Recorder::default(), Recorder::default());
    manager
        .add_controller(copying_controller(&attempts, &copied))
        .expect("add");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, task) = run_manager(&manager);
    manager.serve_health(listener, stop.clone());
    copied.wait_for_more(&req("member", "before"), 0).await;
    wait_until_ready(&manager, "member").await;

    let admin = member.client().await.expect("admin");
    Api::<RoleBinding>::namespaced(admin, "default")
        .delete("robots-member", &DeleteParams::default())
        .await
        .expect("revoke");
    create_config_map(&member, "after", &[]).await;
    // 3 s of refusals, a health check a second.
    wait_for_fleet_within(
        &manager,
        Duration::from_secs(10),
        "the member to be degraded",
        || {
            matches!(
                state_of(&manager, "member"),
                Some(ClusterState::Degraded(_))
            )
        },
    )
    .await;
    let Some(ClusterState::Degraded(reason)) = state_of(&manager, "member") else {
        panic!("degraded, then not");
    };
    assert_eq!(
        reason.as_str(),
        "403 Forbidden: cannot patch configmaps in namespace \"default\""
    );
    let (_, clusters) = multicluster_runtime::testing::http_get(address, "/clusters")
        .await
        .expect("/clusters");
    assert!(
        clusters
            .lines()
            .any(|line| line.starts_with(&format!("member\tdegraded: {reason}\tsince "))),
        "{clusters}"
    );
    // Its watch still delivers: a new change is seen (and refused).
    create_config_map(&member, "during", &[]).await;
    attempts.wait_for_more(&req("member", "during"), 0).await;
    assert_eq!(copied.count(&req("member", "after")), 0);

    member
        .grant_service_account_in_namespace("default", "robots", "member", config_map_rules(&verbs))
        .await
        .expect("grant again");
    copied.wait_for_more(&req("member", "after"), 0).await;
    copied.wait_for_more(&req("member", "during"), 0).await;
    wait_for_fleet(&manager, "the member to be ready again", || {
        state_of(&manager, "member") == Some(ClusterState::Ready)
    })
    .await;
    assert_eq!(
        metric(&manager, "mcr_cluster_disengagements_total").as_deref(),
        Some("mcr_cluster_disengagements_total 0")
    );

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
