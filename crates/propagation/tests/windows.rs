//! Maintenance windows on real control planes: a hub and one member API
//! server whose namespaces `a` and `b` are two members. A hub ConfigMap
//! becomes a ConfigMap in each, rolled one member at a time. The rollout
//! is frozen by a deny window of its own until a few seconds from the
//! start; member `a` also has its own window (in its inventory's
//! annotation), a few seconds wide, opening later. Each member is
//! `Pending` with the time it opens until then, and takes the revision
//! within its window: the objects' creation times say when.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp, Unit};
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_propagation::{
    Desired, MaxUnavailable, Propagation, Rollout, WINDOWS_ANNOTATION, Window,
};
use multicluster_runtime::testing::{run_manager, wait_for_object};
use multicluster_runtime::{Cluster, Inventory, Manager};

const MEMBERS: [&str; 2] = ["a", "b"];

/// A six-field cron schedule (seconds first) that starts once, at `at`
/// (UTC; it comes again a year later).
fn once_at(at: Timestamp) -> String {
    let at = at.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
    format!(
        "{} {} {} {} {} *",
        at.second(),
        at.minute(),
        at.hour(),
        at.day(),
        at.month()
    )
}

/// Waits until member `name`'s ConfigMap is there; returns when it was
/// created (whole seconds, as the API server keeps it).
async fn created_in(member: &ControlPlane, name: &str) -> Timestamp {
    let settings = Api::<ConfigMap>::namespaced(member.client().await.expect("client"), name);
    wait_for_object(&settings, "settings", &format!("{name}'s copy"), |object| {
        object.is_some()
    })
    .await;
    settings
        .get("settings")
        .await
        .expect("copy")
        .metadata
        .creation_timestamp
        .expect("creation time")
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_outside_their_windows_wait_pending_and_change_within_them() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    common::make_namespaces(&member, &MEMBERS).await;
    let provider = common::namespace_members(&member, &MEMBERS).await;
    let member_a = provider.clusters.get(&"a".into()).expect("a is a member");

    // Whole seconds: a cron schedule names seconds.
    let now = Timestamp::now().round(Unit::Second).expect("now");
    let later = |seconds: i64| now + SignedDuration::from_secs(seconds);
    // The rollout is frozen from a second ago until `thawed`; a's own
    // window opens at `a_opens`, for four seconds.
    let (thawed, a_opens) = (later(12), later(20));
    let freeze = Window::deny(&once_at(later(-1)), Duration::from_secs(13)).expect("freeze");
    let windows = serde_json::json!([{
        "kind": "allow",
        "schedule": once_at(a_opens),
        "duration": "4s",
    }]);
    member_a.set_inventory(Inventory {
        annotations: BTreeMap::from([(WINDOWS_ANNOTATION.to_string(), windows.to_string())]),
        ..Inventory::default()
    });

    let propagation = Propagation::<ConfigMap>::new("settings")
        .select(|hub| hub.metadata.name.as_deref() == Some("web"))
        .propagates::<ConfigMap>()
        .desired(|hub, member| {
            let copy = ConfigMap {
                metadata: ObjectMeta {
                    name: Some("settings".into()),
                    namespace: Some(member.name().to_string()),
                    ..ObjectMeta::default()
                },
                data: hub.data.clone(),
                ..ConfigMap::default()
            };
            Ok(vec![Desired::new(&copy)?])
        })
        .rollout(Rollout::rolling(MaxUnavailable::Count(1)).window(freeze))
        .status_annotation(common::STATUS);
    let manager = Manager::builder(Cluster::new("hub", hub.client().await.expect("client")))
        .provider(std::sync::Arc::new(provider))
        .build();
    manager
        .add_controller(propagation.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("web".into()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([("value".into(), "one".into())])),
                ..ConfigMap::default()
            },
        )
        .await
        .expect("hub object");

    // Frozen: both wait, each saying when it opens; the rollout says it
    // waits for them (the condition sums its record up), and nothing is
    // halted.
    let b_says = format!("outside the rollout's maintenance windows; opens at {thawed}");
    let a_says = format!("outside its or the rollout's maintenance windows; opens at {a_opens}");
    common::until_status(&hub, "web", "both pending with their openings", |status| {
        let says = |name: &str, text: &str| {
            status["members"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|entry| {
                    entry["cluster"] == name
                        && entry["state"] == "Pending"
                        && entry["reason"]
                            .as_str()
                            .is_some_and(|reason| reason.contains(text))
                })
        };
        says("b", &b_says)
            && says("a", &a_says)
            && status["condition"]["message"]
                .as_str()
                .is_some_and(|message| {
                    message.contains(
                        "the rollout waits for 2 member(s) outside their maintenance windows",
                    ) && !message.contains("halted")
                })
    })
    .await;

    // Thawed, b changes; a only within its own window.
    let b_changed = created_in(&member, "b").await;
    let a_changed = created_in(&member, "a").await;
    assert!(
        b_changed >= thawed,
        "b changed at {b_changed}, before the freeze ended at {thawed}"
    );
    assert!(
        a_changed >= a_opens && a_changed < a_opens + SignedDuration::from_secs(4),
        "a changed at {a_changed}, outside its window {a_opens} + 4s"
    );
    common::until_in_sync(&hub, "web", &MEMBERS).await;

    stop.cancel();
    task.await.expect("join").expect("manager");
}
