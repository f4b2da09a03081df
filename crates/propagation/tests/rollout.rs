//! Paced rollouts on real control planes: a hub, and one member API
//! server whose namespaces `m0` to `m5` are six members (each a cluster
//! whose cache and objects stay in its namespace). A hub ConfigMap
//! becomes a Deployment in each member. The members run no Deployment
//! controller: the test plays it, as the real one writes its status, a
//! moment after it sees a new spec, and keeps the timeline of what it
//! saw. The bound is checked on that timeline (what the member API
//! server served), not on the propagation's own status.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use multicluster_coordinator::sharding::{ShardedCoordinator, ShardingOptions, until_split};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::played::Deployments;
use multicluster_propagation::{
    APPROVAL_ANNOTATION, CLEANED_ANNOTATION, Desired, MaxUnavailable, PAUSE_ANNOTATION,
    Propagation, PropagationStatus, Rollout, Stage,
};
use multicluster_runtime::testing::{
    DEFAULT_DEADLINE, Polled, eventually, eventually_some, poll_within, run_manager,
};
use multicluster_runtime::{Cluster, ClusterName, Manager};
use serde_json::json;

use common::{STATUS, namespace_members, status_of, until_states, until_status};

const LABEL: &str = "example.com/rollout";
const MEMBERS: [&str; 6] = ["m0", "m1", "m2", "m3", "m4", "m5"];

/// How long the played Deployment controller takes to roll out a new spec
/// (a failing member fails at once): the scenario's clock, not a wait for
/// anything.
const ROLL_TIME: Duration = Duration::from_secs(1);

fn image(tag: &str) -> String {
    format!("registry.k8s.io/pause:{tag}")
}

/// The members (namespaces) the played controller gave `image` to.
fn given(played: &Deployments, image: &str) -> BTreeSet<String> {
    played
        .given(image)
        .into_iter()
        .filter_map(|key| key.split('/').nth(1).map(str::to_string))
        .collect()
}

/// Plays the members' Deployment controller, rolling a spec out in
/// [`ROLL_TIME`].
async fn play(member: &ControlPlane) -> Deployments {
    let played = Deployments::default();
    played.watch("member", member.client().await.expect("client"), ROLL_TIME);
    played
}

/// The Deployment a hub ConfigMap wants in `member`: its image from the
/// hub object's `tag`.
fn web(hub: &ConfigMap, member: &Cluster) -> Deployment {
    let tag = hub
        .data
        .as_ref()
        .and_then(|data| data.get("tag"))
        .cloned()
        .unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": member.name().as_str()},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image(&tag)}]},
            },
        },
    }))
    .expect("deployment")
}

fn labelled(hub: &ConfigMap, value: &str) -> bool {
    hub.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL))
        .is_some_and(|have| have == value)
}

/// Rolls the `web` Deployment out to the members two at a time.
fn rolling() -> Propagation<ConfigMap> {
    Propagation::<ConfigMap>::new("web")
        .select(|hub| labelled(hub, "web"))
        .propagates::<Deployment>()
        .desired(|hub, member| Ok(vec![Desired::new(&web(hub, member))?]))
        .rollout(Rollout::rolling(MaxUnavailable::Count(2)))
        .status_annotation(STATUS)
}

/// A manager on `hub` whose members are the namespaces of `member`, each
/// a cluster held to its namespace, running `propagation`.
async fn fleet(
    hub: &ControlPlane,
    member: &ControlPlane,
    propagation: Propagation<ConfigMap>,
) -> (
    Manager,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), multicluster_runtime::Error>>,
) {
    let provider = namespace_members(member, &MEMBERS).await;
    let manager = Manager::builder(Cluster::new("hub", hub.client().await.expect("client")))
        .provider(Arc::new(provider))
        .build();
    manager
        .add_controller(propagation.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    (manager, stop, task)
}

async fn make_namespaces(member: &ControlPlane) {
    common::make_namespaces(member, &MEMBERS).await;
}

/// Creates or changes the hub ConfigMap `name` (labelled `value`) with
/// `data`, and sets or clears its `annotations`.
async fn hub_object(hub: &ControlPlane, name: &str, value: &str, tag: &str) {
    let object = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": {LABEL: value}},
        "data": {"tag": tag},
    });
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .patch(name, &PatchParams::apply("test"), &Patch::Apply(&object))
        .await
        .expect("hub object");
}

/// Sets (or with `None` removes) an annotation of the hub ConfigMap.
async fn annotate(hub: &ControlPlane, name: &str, key: &str, value: Option<&str>) {
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .expect("annotate");
}

/// The images of the members' Deployments, by member.
async fn images(member: &ControlPlane) -> BTreeMap<String, String> {
    Api::<Deployment>::all(member.client().await.expect("client"))
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|deployment| {
            let image = deployment
                .spec?
                .template
                .spec?
                .containers
                .first()?
                .image
                .clone()?;
            Some((deployment.metadata.namespace?, image))
        })
        .collect()
}

/// Whether every member's Deployment `web` has `tag` and is available.
async fn all_available_with(member: &ControlPlane, tag: &str) -> bool {
    all_named_available_with(member, "web", tag).await
}

/// Waits until every member's Deployment has `tag`, available, and the
/// rollout says it is done: no member holds a slot (one that did would
/// carry it into the next revision).
async fn rolled_out(hub: &ControlPlane, member: &ControlPlane, tag: &str) {
    // At the deadline the failure says where the rollout stood: the
    // members' images and the hub object's status (its slots and message).
    let seen = poll_within(DEFAULT_DEADLINE, Polled::ApiServer, || async {
        if all_available_with(member, tag).await {
            return Ok(());
        }
        Err(format!(
            "members' images {:?}; hub status {}",
            images(member).await,
            status_of(hub, "web").await
        ))
    })
    .await;
    if let Err(seen) = seen {
        panic!(
            "timed out after {DEFAULT_DEADLINE:?} waiting for every member available with {tag}: {seen}"
        );
    }
    let done = format!("{} updated, 0 updating, 0 to go", MEMBERS.len());
    until_status(hub, "web", "the rollout to be done", |status| {
        status["condition"]["message"]
            .as_str()
            .is_some_and(|message| message.contains(&done))
    })
    .await;
}

/// The hub object's `Propagated` condition message.
async fn condition_message(hub: &ControlPlane, name: &str) -> String {
    status_of(hub, name).await["condition"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits, watching the hub ConfigMap `name`, until its condition's
/// message satisfies `that`; returns the message.
async fn until_message(
    hub: &ControlPlane,
    name: &str,
    what: &str,
    that: impl Fn(&str) -> bool,
) -> String {
    let said = |status: &serde_json::Value| {
        status["condition"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    until_status(hub, name, what, |status| that(&said(status))).await;
    condition_message(hub, name).await
}

/// Two at a time, never more, through a first rollout, an update, a pause,
/// a member that fails (the rollout halts; a new revision goes to the
/// failed member first; it goes on once the member recovers),
/// a controller killed mid-rollout and started again, and two controllers
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_rollout_never_has_more_than_two_members_changing() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    make_namespaces(&member).await;
    let played = play(&member).await;
    let (_manager, stop, task) = fleet(&hub, &member, rolling()).await;

    // A new hub object: every member gets it, two at a time.
    hub_object(&hub, "web", "web", "v1").await;
    rolled_out(&hub, &member, "v1").await;
    let most = played.most_changing();
    assert!(most <= 2, "{most} members changing at once");

    // An update: the same.
    hub_object(&hub, "web", "web", "v2").await;
    rolled_out(&hub, &member, "v2").await;
    let most = played.most_changing();
    assert!(most <= 2, "{most} members changing at once");

    // Paused before a change: no member is given it until resumed.
    annotate(&hub, "web", PAUSE_ANNOTATION, Some("true")).await;
    hub_object(&hub, "web", "web", "v3").await;
    until_states(
        &hub,
        "web",
        "every member held, the rollout paused",
        |states| {
            states.len() == MEMBERS.len()
                && states.values().all(|(state, reason)| {
                    state == "Pending"
                        && reason.contains("waiting for a slot")
                        && reason.contains("paused")
                })
        },
    )
    .await;
    assert_eq!(
        given(&played, &image("v3")),
        BTreeSet::new(),
        "a member changed while paused"
    );
    annotate(&hub, "web", PAUSE_ANNOTATION, None).await;
    rolled_out(&hub, &member, "v3").await;

    // m1 fails its rollout: with no failure budget the rollout halts,
    // the hub object says where, and no member after the first two is
    // given the change.
    played.fail_in("m1", true);
    hub_object(&hub, "web", "web", "v4").await;
    until_message(
        &hub,
        "web",
        "the hub object to say it halted at m1",
        |message| message.contains("halted") && message.contains("m1: Deployment m1/web"),
    )
    .await;
    assert_eq!(
        given(&played, &image("v4")),
        BTreeSet::from(["m0".to_string(), "m1".to_string()]),
        "a member was given the change past the halt"
    );
    // A new revision while halted, once m0 is done with v4 (its slot
    // freed): the failed member still holds its slot, so it is given the
    // revision first (the README's order); no other member is, while it
    // fails.
    until_message(&hub, "web", "m0 done, m1 alone holding a slot", |message| {
        message.contains("1 updated, 1 updating") && message.contains("halted")
    })
    .await;
    hub_object(&hub, "web", "web", "v4b").await;
    eventually(Polled::ApiServer, "the failed member given v4b", || async {
        given(&played, &image("v4b")) == BTreeSet::from(["m1".to_string()])
    })
    .await;
    until_message(&hub, "web", "the halt to stand for v4b", |message| {
        message.contains("halted") && message.contains("m1: Deployment m1/web")
    })
    .await;
    assert_eq!(
        given(&played, &image("v4b")),
        BTreeSet::from(["m1".to_string()]),
        "a member was given v4b past the halt"
    );
    // m1 recovers (its controller succeeds after all): the rollout goes on,
    // the others in the order of their names.
    played.fail_in("m1", false);
    played
        .roll_out_now(
            "member",
            &member.client().await.expect("client"),
            "m1",
            "web",
        )
        .await;
    rolled_out(&hub, &member, "v4b").await;
    let most = played.most_changing();
    assert!(most <= 2, "{most} members changing at once");

    // Killed mid-rollout (no clean stop: its task is dropped) and started
    // again: the new controller reads the slots from the hub object and
    // never hands out more. (Tasks the dropped manager spawned may run on
    // for a while: a second writer, which the bound holds against too.)
    hub_object(&hub, "web", "web", "v5").await;
    eventually(Polled::ApiServer, "the first members given v5", || async {
        !given(&played, &image("v5")).is_empty()
    })
    .await;
    task.abort();
    let _ = task.await;
    drop(stop);
    let (_manager, stop, task) = fleet(&hub, &member, rolling()).await;
    rolled_out(&hub, &member, "v5").await;
    let most = played.most_changing();
    assert!(most <= 2, "{most} members changing at once");
    assert_eq!(
        images(&member).await.values().collect::<BTreeSet<_>>(),
        BTreeSet::from([&image("v5")])
    );

    // Two controllers at once (two replicas, neither leading nor
    // sharding): each gives slots only through the hub object, so
    // together they never give more.
    let (_second, second_stop, second_task) = fleet(&hub, &member, rolling()).await;
    hub_object(&hub, "web", "web", "v6").await;
    rolled_out(&hub, &member, "v6").await;
    let most = played.most_changing();
    assert!(
        most <= 2,
        "{most} members changing at once with two controllers"
    );

    second_stop.cancel();
    second_task.await.expect("task").expect("clean stop");
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A replica of a sharded fleet: a manager on `hub` whose members are
/// the namespaces of `member`, sharing them with the other replicas by a
/// sharded coordinator (its Leases on the hub), running [`rolling`].
async fn replica(
    hub: &ControlPlane,
    member: &ControlPlane,
    id: &str,
) -> (
    Arc<ShardedCoordinator>,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), multicluster_runtime::Error>>,
) {
    let provider = namespace_members(member, &MEMBERS).await;
    let client = hub.client().await.expect("client");
    let coordinator = Arc::new(
        ShardedCoordinator::new(
            client.clone(),
            ShardingOptions::default().peer_id(id.to_string()),
        )
        .expect("coordinator"),
    );
    let manager = Manager::builder(Cluster::new("hub", client))
        .provider(Arc::new(provider))
        .coordinator(coordinator.clone())
        .build();
    manager
        .add_controller(rolling().build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    (coordinator, stop, task)
}

/// Two replicas sharing the fleet (a sharded coordinator), each working
/// on its own members: every member is served, two at a time at most
/// between them, the hub object's status lists every member with the
/// counts summed, and the hub object goes only once both replicas'
/// members are clean. One stopping mid-rollout leaves its members to the
/// other, which finishes within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sharded_replicas_serve_every_member_within_one_bound() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    make_namespaces(&member).await;
    let played = play(&member).await;
    let (a, a_stop, a_task) = replica(&hub, &member, "replica-a").await;
    let (b, b_stop, b_task) = replica(&hub, &member, "replica-b").await;

    // Each replica works on the members rendezvous hashing gives it.
    let shares = until_split(&[&a, &b], &MEMBERS, Duration::from_secs(60))
        .await
        .expect("the fleet split between the replicas");
    let (a_share, b_share) = (&shares[0], &shares[1]);
    assert!(
        !a_share.is_empty() && !b_share.is_empty(),
        "the test needs members on both replicas: {a_share:?} {b_share:?}"
    );

    // A new hub object, then an update: every member gets each, never
    // more than two changing at once across both replicas.
    for tag in ["v1", "v2"] {
        hub_object(&hub, "web", "web", tag).await;
        rolled_out(&hub, &member, tag).await;
        let most = played.most_changing();
        assert!(most <= 2, "{most} members changing at once with two shards");
    }

    // The status names every member, each told by its own replica, and
    // sums both replicas' counts.
    until_states(
        &hub,
        "web",
        "every member in sync on the hub object",
        |states| {
            states.len() == MEMBERS.len() && states.values().all(|(state, _)| state == "InSync")
        },
    )
    .await;
    let status = status_of(&hub, "web").await;
    assert_eq!(
        status["counts"],
        json!({"InSync": MEMBERS.len()}),
        "{status}"
    );
    assert_eq!(
        status["countsByReplica"],
        json!({
            "replica-a": {"InSync": a_share.len()},
            "replica-b": {"InSync": b_share.len()},
        }),
        "{status}"
    );

    // Deleted while one of replica b's members cannot let go yet (a
    // finalizer of someone else's holds its Deployment): replica a says
    // its members are clean, and the hub object keeps its finalizer until
    // b's member is clean too.
    let held = b_share[0].as_str();
    let deployments = Api::<Deployment>::namespaced(member.client().await.expect("client"), held);
    let hold = |finalizers: Vec<&str>| json!({"metadata": {"finalizers": finalizers}});
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(hold(vec!["example.com/hold"])),
        )
        .await
        .expect("hold the Deployment");
    let hub_objects = Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default");
    hub_objects
        .delete("web", &Default::default())
        .await
        .expect("delete");
    let cleaned = || async {
        let object = hub_objects.get_opt("web").await.expect("get");
        let text = object
            .and_then(|object| object.metadata.annotations)
            .and_then(|annotations| annotations.get(CLEANED_ANNOTATION).cloned());
        text.map(|text| {
            serde_json::from_str::<serde_json::Value>(&text).expect("JSON")["web"].clone()
        })
    };
    eventually(
        Polled::ApiServer,
        "replica a to say its members are clean",
        || async { cleaned().await == Some(json!(["replica-a"])) },
    )
    .await;
    eventually(Polled::ApiServer, "every other member clean", || async {
        images(&member).await.into_keys().collect::<Vec<_>>() == [held.to_string()]
    })
    .await;
    assert_eq!(
        cleaned().await,
        Some(json!(["replica-a"])),
        "the hub object went (or b said clean) while b's member held a Deployment"
    );
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("let the Deployment go");
    multicluster_runtime::testing::wait_for_object(
        &hub_objects,
        "web",
        "the hub object gone",
        |object| object.is_none(),
    )
    .await;
    assert_eq!(images(&member).await, BTreeMap::new());

    // Made again, and replica b stops while the rollout is under way:
    // replica a takes b's members over and finishes, within the bound,
    // and the status no longer counts b.
    hub_object(&hub, "web", "web", "v3").await;
    eventually(Polled::ApiServer, "the first members given v3", || async {
        !given(&played, &image("v3")).is_empty()
    })
    .await;
    b_stop.cancel();
    b_task.await.expect("task").expect("clean stop");
    rolled_out(&hub, &member, "v3").await;
    let most = played.most_changing();
    assert!(most <= 2, "{most} members changing at once as b left");
    until_status(&hub, "web", "replica a counting every member", |status| {
        status["countsByReplica"] == json!({"replica-a": {"InSync": MEMBERS.len()}})
    })
    .await;

    a_stop.cancel();
    a_task.await.expect("task").expect("clean stop");
}

/// The members a hub ConfigMap names in its `example.com/members`
/// annotation (a placement decision, as far as the test needs one).
fn named_members(hub: &ConfigMap) -> Vec<ClusterName> {
    hub.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get("example.com/members"))
        .map(|names| names.split(',').map(ClusterName::from).collect())
        .unwrap_or_default()
}

/// A move with a surge: the Deployment moves from m0 and m1 to m2 and m3;
/// m0 and m1 keep theirs while m2 is not available (its rollout fails),
/// and let go once it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_moved_out_keep_the_workload_until_those_moved_in_are_available() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    make_namespaces(&member).await;
    let played = play(&member).await;
    let propagation = rolling()
        .members_chosen_by(named_members)
        .removal_grace(Duration::ZERO)
        .rollout(Rollout::rolling(MaxUnavailable::Count(2)).max_surge(2));
    let (_manager, stop, task) = fleet(&hub, &member, propagation).await;

    hub_object(&hub, "web", "web", "v1").await;
    annotate(&hub, "web", "example.com/members", Some("m0,m1")).await;
    eventually(Polled::ApiServer, "m0 and m1 available with v1", || async {
        played.available(&image("v1"))
            == BTreeSet::from(["member/m0/web".into(), "member/m1/web".into()])
    })
    .await;

    // Moved to m2 and m3, m2 failing its rollout: m0 and m1 keep theirs.
    played.fail_in("m2", true);
    annotate(&hub, "web", "example.com/members", Some("m2,m3")).await;
    until_states(
        &hub,
        "web",
        "m0 and m1 kept for the surge while m2 is not available",
        |states| {
            ["m0", "m1"].iter().all(|kept| {
                states.get(*kept).is_some_and(|(state, reason)| {
                    state == "Progressing"
                        && reason.contains("max surge 2")
                        && reason.contains("m2")
                })
            }) && played.available(&image("v1")).contains("member/m3/web")
        },
    )
    .await;
    assert_eq!(
        images(&member).await.into_keys().collect::<Vec<_>>(),
        ["m0", "m1", "m2", "m3"],
        "a member moved out let go before those moved in were available"
    );

    // m2 recovers: m0 and m1 let go.
    played.fail_in("m2", false);
    played
        .roll_out_now(
            "member",
            &member.client().await.expect("client"),
            "m2",
            "web",
        )
        .await;
    eventually(Polled::ApiServer, "m0 and m1 to let go", || async {
        images(&member).await.into_keys().collect::<Vec<_>>() == ["m2", "m3"]
    })
    .await;

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A staged rollout: the canary first, then the rest once approved for
/// the revision rolled out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_waits_for_its_approval() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    make_namespaces(&member).await;
    let played = play(&member).await;
    let staged = rolling().rollout(Rollout::staged(
        [
            Stage::named("canary", ["m0"]),
            Stage::named("rest", MEMBERS).needs_approval(),
        ],
        MaxUnavailable::Percent(50),
    ));
    let (_manager, stop, task) = fleet(&hub, &member, staged).await;

    hub_object(&hub, "web", "web", "v1").await;
    let message = until_message(
        &hub,
        "web",
        "the rest to wait for its approval",
        |message| message.contains("waits for its approval"),
    )
    .await;
    assert_eq!(
        given(&played, &image("v1")),
        BTreeSet::from(["m0".to_string()]),
        "only the canary before the approval"
    );
    // The message names what to write: the annotation and its value.
    let approval = message
        .split(&format!("{APPROVAL_ANNOTATION}="))
        .nth(1)
        .and_then(|rest| rest.split([',', ';']).next())
        .expect("the approval to write")
        .trim()
        .to_string();
    assert!(approval.starts_with("rest@"), "{approval}");
    // Told in a Normal Event too, where the hub object's owner looks.
    eventually(Polled::ApiServer, "a RolloutWaiting Event", || {
        has_event(&hub, "web", "RolloutWaiting")
    })
    .await;
    annotate(&hub, "web", APPROVAL_ANNOTATION, Some(&approval)).await;
    rolled_out(&hub, &member, "v1").await;
    let most = played.most_changing();
    assert!(most <= 3, "{most} members changing at once");

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A hub custom resource whose status is the shipped [`PropagationStatus`]:
/// its CRD comes from the derive alone, no schema written by hand.
#[derive(
    kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, schemars::JsonSchema,
)]
#[kube(
    group = "rollout.test.example.com",
    version = "v1",
    kind = "Web",
    namespaced,
    status = "PropagationStatus"
)]
struct WebSpec {
    /// The image's tag.
    tag: String,
}

/// The derived CRD of a hub type with the shipped status is accepted by
/// the API server, and a rolling rollout's state and the members' status
/// stay in it (a schema that pruned them would lose the slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_status_type_keeps_what_a_rollout_writes() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::runtime::wait::{await_condition, conditions};
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    make_namespaces(&member).await;
    let hub_client = hub.client().await.expect("client");
    let crds = Api::<CustomResourceDefinition>::all(hub_client.clone());
    crds.create(&PostParams::default(), &Web::crd())
        .await
        .expect("the derived CRD");
    tokio::time::timeout(
        multicluster_runtime::testing::DEFAULT_DEADLINE,
        await_condition(
            crds,
            "webs.rollout.test.example.com",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("established in time")
    .expect("established");
    let played = play(&member).await;
    let webs = Propagation::<Web>::new("webs")
        .propagates::<Deployment>()
        .desired(|hub, member| {
            let config = ConfigMap {
                data: Some(BTreeMap::from([("tag".to_string(), hub.spec.tag.clone())])),
                ..ConfigMap::default()
            };
            Ok(vec![Desired::new(&web(&config, member))?])
        })
        .rollout(Rollout::rolling(MaxUnavailable::Percent(50)))
        .status_subresource();
    let provider = namespace_members(&member, &MEMBERS).await;
    let manager = Manager::builder(Cluster::new("hub", hub_client.clone()))
        .provider(Arc::new(provider))
        .build();
    manager
        .add_controller(webs.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);

    let api = Api::<Web>::namespaced(hub_client, "default");
    api.create(
        &PostParams::default(),
        &Web::new("web", WebSpec { tag: "v1".into() }),
    )
    .await
    .expect("hub object");
    // Halfway: the rollout's state is in the status, typed.
    let rollout = multicluster_runtime::testing::eventually_some(
        Polled::ApiServer,
        "the rollout's state in the status",
        || async {
            let status = api.get("web").await.ok()?.status?;
            status
                .rollout
                .filter(|rollout| !rollout.updating.is_empty())
        },
    )
    .await;
    assert!(rollout.updating.len() <= 3, "{rollout:?}");
    assert_eq!(rollout.revision, "1", "the revision is the generation");
    eventually(Polled::ApiServer, "every member available with v1", || {
        all_available_with(&member, "v1")
    })
    .await;
    let status = multicluster_runtime::testing::eventually_some(
        Polled::ApiServer,
        "the rollout done and every member in sync",
        || async {
            let status = api.get("web").await.ok()?.status?;
            let done = status.rollout.as_ref()?.updating.is_empty()
                && status.counts.get("InSync") == Some(&(MEMBERS.len() as u64));
            done.then_some(status)
        },
    )
    .await;
    assert_eq!(status.members.len(), MEMBERS.len());
    assert!(
        status
            .conditions
            .iter()
            .any(|condition| condition.type_ == "Propagated" && condition.status == "True"),
        "{status:?}"
    );
    let most = played.most_changing();
    assert!(most <= 3, "{most} members changing at once");
    // The propagation's metrics are in the manager's registry.
    let exported = manager.metrics().encode();
    for series in [
        r#"mcr_propagation_members{propagation="webs",state="InSync"} 6"#,
        r#"mcr_propagation_rollout_members{propagation="webs",phase="updated"} 6"#,
        r#"mcr_propagation_time_to_available_seconds_count{propagation="webs"} 6"#,
    ] {
        assert!(exported.contains(series), "{series} in\n{exported}");
    }
    // No reconcile failed on the way (a rollout's own write refused, say).
    let errors: f64 = exported
        .lines()
        .filter(|line| {
            line.starts_with(r#"controller_runtime_reconcile_errors_total{controller="webs""#)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(errors, 0.0, "{exported}");

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The Deployment a hub ConfigMap wants in `member`, named after the hub
/// object, with its image from the hub object's `tag`.
fn named_web(hub: &ConfigMap, member: &Cluster) -> Deployment {
    let mut deployment = web(hub, member);
    deployment.metadata.name = hub.metadata.name.clone();
    deployment
}

/// A hub ConfigMap's own pace and deletion policy, from its data: a
/// Deployment-style `maxUnavailable`, and `keepOnDelete`.
fn per_hub_object() -> Propagation<ConfigMap> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use multicluster_propagation::DeletionPolicy;
    let datum = |hub: &ConfigMap, key: &str| {
        hub.data
            .as_ref()
            .and_then(|data| data.get(key))
            .cloned()
            .unwrap_or_default()
    };
    Propagation::<ConfigMap>::new("paced-apart")
        .select(|hub| labelled(hub, "apart"))
        .propagates::<Deployment>()
        .desired(|hub, member| Ok(vec![Desired::new(&named_web(hub, member))?]))
        .rollout_for(move |hub| {
            let given = datum(hub, "maxUnavailable");
            let given = given
                .parse::<i32>()
                .map_or(IntOrString::String(given), IntOrString::Int);
            MaxUnavailable::from_int_or_string(&given)
                .map_or_else(|_| Rollout::all_at_once(), Rollout::rolling)
        })
        .when_hub_deleted_by(move |hub| {
            if datum(hub, "keepOnDelete") == "true" {
                DeletionPolicy::Orphan
            } else {
                DeletionPolicy::Delete
            }
        })
        .status_annotation(STATUS)
}

/// Whether every member's Deployment `name` has `tag` and is available.
async fn all_named_available_with(member: &ControlPlane, name: &str, tag: &str) -> bool {
    let deployments = Api::<Deployment>::all(member.client().await.expect("client"))
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    let named: Vec<&Deployment> = deployments
        .iter()
        .filter(|deployment| deployment.metadata.name.as_deref() == Some(name))
        .collect();
    named.len() == MEMBERS.len()
        && named.iter().all(|deployment| {
            let image_is = deployment
                .spec
                .as_ref()
                .and_then(|spec| spec.template.spec.as_ref())
                .and_then(|pod| pod.containers.first())
                .and_then(|container| container.image.as_deref())
                == Some(image(tag).as_str());
            let available = deployment.status.as_ref().is_some_and(|status| {
                status.observed_generation == deployment.metadata.generation
                    && status.available_replicas == Some(1)
            });
            image_is && available
        })
}

/// Two hub objects of one propagation, each with its own pace from its
/// data (one member at a time; half of them, three, at a time), reach
/// every member each at its own pace, the bound reached and never passed;
/// deleted, the one that asks to be kept leaves its Deployments, with
/// nothing of ours on them, and the other's go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hub_objects_of_one_propagation_roll_out_at_their_own_paces() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    make_namespaces(&member).await;
    let played = play(&member).await;
    let (_manager, stop, task) = fleet(&hub, &member, per_hub_object()).await;
    let configmaps = Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default");
    for (name, max_unavailable, keep) in [("slow", "1", "true"), ("fast", "50%", "false")] {
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": {LABEL: "apart"}},
            "data": {"tag": "v1", "maxUnavailable": max_unavailable, "keepOnDelete": keep},
        });
        configmaps
            .patch(name, &PatchParams::apply("test"), &Patch::Apply(&object))
            .await
            .expect("hub object");
    }
    for name in ["slow", "fast"] {
        eventually(
            Polled::ApiServer,
            &format!("every member available with {name} v1"),
            || all_named_available_with(&member, name, "v1"),
        )
        .await;
    }
    assert_eq!(played.most_changing_named("slow"), 1, "slow: one at a time");
    assert_eq!(
        played.most_changing_named("fast"),
        3,
        "fast: three at a time (half of six), reached and never passed"
    );

    for name in ["slow", "fast"] {
        configmaps
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete the hub object");
    }
    for name in ["slow", "fast"] {
        multicluster_runtime::testing::wait_for_object(
            &configmaps,
            name,
            "the hub object gone, its finalizer released",
            |object| object.is_none(),
        )
        .await;
    }
    let deployments = Api::<Deployment>::all(member.client().await.expect("client"))
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    let kept: BTreeSet<String> = deployments
        .iter()
        .filter_map(|deployment| deployment.metadata.namespace.clone())
        .collect();
    assert_eq!(
        deployments.len(),
        MEMBERS.len(),
        "only the kept hub object's Deployments stay"
    );
    assert_eq!(kept.len(), MEMBERS.len(), "one in each member");
    for deployment in &deployments {
        assert_eq!(deployment.metadata.name.as_deref(), Some("slow"));
        let ours = deployment
            .metadata
            .labels
            .iter()
            .flatten()
            .any(|(key, _)| key == multicluster_propagation::PROPAGATION_LABEL);
        assert!(
            !ours,
            "a kept Deployment keeps our label: {:?}",
            deployment.metadata
        );
    }
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The rollout record of the hub ConfigMap `name` (the annotation beside
/// the status one), or null.
async fn rollout_record(hub: &ControlPlane, name: &str) -> serde_json::Value {
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .get_opt(name)
        .await
        .expect("get the hub object")
        .and_then(|object| object.metadata.annotations)
        .and_then(|annotations| annotations.get(&format!("{STATUS}-rollout")).cloned())
        .map(|text| serde_json::from_str(&text).expect("rollout JSON"))
        .unwrap_or_default()
}

/// Whether the hub ConfigMap `name` has an Event with `reason`.
async fn has_event(hub: &ControlPlane, name: &str, reason: &str) -> bool {
    use k8s_openapi::api::events::v1::Event;
    Api::<Event>::namespaced(hub.client().await.expect("client"), "default")
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .iter()
        .any(|event| {
            event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && event.reason.as_deref() == Some(reason)
        })
}

/// A bad release (its image fails wherever it goes) fails at its canary,
/// the first member given it: past the failure budget the rollout rolls
/// that member back to the last revision every member had, one member at
/// a time as before, and no other member is ever given the bad one; the
/// hub object says so and tells it in an Event. Later, with a good
/// release out, a roll back asked for by annotation takes every member
/// back, and removing the annotation brings the release again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_canary_rolls_back_and_a_roll_back_can_be_asked_for() {
    use multicluster_propagation::{OnFailure, ROLL_BACK_ANNOTATION};
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    make_namespaces(&member).await;
    let played = play(&member).await;
    let propagation = Propagation::<ConfigMap>::new("web")
        .select(|hub| labelled(hub, "web"))
        .propagates::<Deployment>()
        .desired(|hub, member| Ok(vec![Desired::new(&web(hub, member))?]))
        .rollout(Rollout::rolling(MaxUnavailable::Count(1)).on_failure(OnFailure::RollBack))
        .status_annotation(STATUS);
    let (_manager, stop, task) = fleet(&hub, &member, propagation).await;

    hub_object(&hub, "web", "web", "v1").await;
    rolled_out(&hub, &member, "v1").await;
    let v1 = eventually_some(Polled::ApiServer, "v1 complete", || async {
        rollout_record(&hub, "web").await["lastComplete"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    played.reset_most();

    // The bad release: m0 fails with it and goes back to v1.
    played.fail_image(&image("v2"), true);
    hub_object(&hub, "web", "web", "v2").await;
    let back = eventually_some(Polled::ApiServer, "the rollout rolling back", || async {
        let rollout = rollout_record(&hub, "web").await;
        (!rollout["rollingBack"].is_null()).then_some(rollout["rollingBack"].clone())
    })
    .await;
    assert_eq!(back["to"], v1.as_str(), "{back}");
    assert!(
        back["reason"].as_str().unwrap_or_default().contains("m0"),
        "{back}"
    );
    rolled_out(&hub, &member, "v1").await;
    assert_eq!(
        given(&played, &image("v2")),
        BTreeSet::from(["m0".to_string()]),
        "only the canary was given the bad release"
    );
    assert_eq!(played.most_changing(), 1, "one member at a time");
    let message = condition_message(&hub, "web").await;
    assert!(
        message.contains("roll back from revision") && message.contains(&v1),
        "{message}"
    );
    for reason in ["RolloutComplete", "RolloutHalted", "RollingBack"] {
        eventually(Polled::ApiServer, &format!("a {reason} Event"), || {
            has_event(&hub, "web", reason)
        })
        .await;
    }

    // A good release, then a roll back to v1 asked for, then undone.
    played.fail_image(&image("v2"), false);
    hub_object(&hub, "web", "web", "v3").await;
    rolled_out(&hub, &member, "v3").await;
    annotate(&hub, "web", ROLL_BACK_ANNOTATION, Some(&v1)).await;
    rolled_out(&hub, &member, "v1").await;
    annotate(&hub, "web", ROLL_BACK_ANNOTATION, None).await;
    rolled_out(&hub, &member, "v3").await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
