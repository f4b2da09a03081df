//! `propagation::Propagation` on real control planes: a hub and two
//! members whose identity may only read and write ResourceQuotas in
//! `default` (least privilege: no Events, no ConfigMaps, nothing else).
//! A labelled hub ConfigMap becomes a ResourceQuota in each member, kept
//! as desired; its status is an annotation on the hub object.

mod common;

use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Event, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use multicluster_envtest::ControlPlane;
use multicluster_propagation::{Conflicts, Desired, Drift, PROPAGATION_LABEL, Propagation};
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::testing::{
    TestProvider, eventually, eventually_some, run_manager, wait_for_object, wait_until_ready,
};
use multicluster_runtime::{Cluster, ClusterName, Manager};
use serde_json::{Value, json};

use common::{STATUS, member_states, until_states};

/// A cluster built from a control plane's admin kubeconfig.
async fn cluster_for(name: &str, cp: &ControlPlane) -> Cluster {
    Cluster::new(name, cp.client().await.expect("client"))
}

/// A manager on `hub` with one member, `name`, reached with `member`'s
/// admin kubeconfig.
async fn with_member(hub: &ControlPlane, name: &str, member: &ControlPlane) -> Manager {
    let provider = TestProvider::default();
    provider
        .clusters
        .add(name, cluster_for(name, member).await)
        .expect("add");
    Manager::builder(cluster_for("hub", hub).await)
        .provider(Arc::new(provider))
        .build()
}

/// The value of one series (name and labels as the text format writes
/// them) of `manager`'s metrics, if it has one.
fn series(manager: &Manager, series: &str) -> Option<f64> {
    manager
        .metrics()
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

const LABEL: &str = "example.com/quota";

/// What the member identity may do: ResourceQuotas in `default`.
fn quota_rules() -> Vec<PolicyRule> {
    vec![PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["resourcequotas".into()]),
        verbs: ["get", "list", "watch", "create", "patch", "delete"]
            .map(String::from)
            .to_vec(),
        ..PolicyRule::default()
    }]
}

/// `cp` as a member reached as `robot`, allowed only [`quota_rules`], its
/// cache restricted to `default` as its rights are.
async fn least_privileged(name: &str, cp: &ControlPlane) -> Cluster {
    cp.grant_in_namespace("default", "robot", quota_rules())
        .await
        .expect("grant");
    let client =
        multicluster_envtest::client_for(&cp.user_kubeconfig("robot", None).expect("kubeconfig"))
            .await
            .expect("client");
    Cluster::with_cache(
        name,
        client.clone(),
        Cache::with_options(
            name,
            client,
            CacheOptions::default().namespace(Some("default".to_string())),
        ),
    )
}

/// Replaces what `robot` may do in `cp` (the Role [`least_privileged`]
/// made).
async fn set_rules(cp: &ControlPlane, rules: Vec<PolicyRule>) {
    Api::<Role>::namespaced(cp.client().await.expect("client"), "default")
        .patch(
            "robot",
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": rules })),
        )
        .await
        .expect("rules");
}

/// The quota a hub ConfigMap asks for: `pods` from its data.
fn quota_for(hub: &ConfigMap) -> ResourceQuota {
    let pods = hub
        .data
        .as_ref()
        .and_then(|data| data.get("pods"))
        .cloned()
        .unwrap_or_else(|| "10".into());
    ResourceQuota {
        metadata: ObjectMeta {
            name: hub.metadata.name.clone(),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(BTreeMap::from([("pods".to_string(), Quantity(pods))])),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    }
}

fn labelled(hub: &ConfigMap, value: &str) -> bool {
    hub.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL))
        .is_some_and(|have| have == value)
}

/// A propagation of the hub ConfigMaps labelled `LABEL=<value>`.
fn quotas(name: &str, value: &'static str) -> Propagation<ConfigMap> {
    Propagation::<ConfigMap>::new(name)
        .select(move |hub| labelled(hub, value))
        .propagates::<ResourceQuota>()
        .desired(|hub, _member| Ok(vec![Desired::new(&quota_for(hub))?]))
        .status_annotation(STATUS)
}

async fn hub_config_map(hub: &ControlPlane, name: &str, value: &str, pods: &str) {
    let object = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": {LABEL: value}},
        "data": {"pods": pods},
    });
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .patch(name, &PatchParams::apply("test"), &Patch::Apply(&object))
        .await
        .expect("hub object");
}

fn quotas_in_default(client: kube::Client) -> Api<ResourceQuota> {
    Api::namespaced(client, "default")
}

fn pods_of(quota: Option<&ResourceQuota>) -> Option<&str> {
    quota?
        .spec
        .as_ref()?
        .hard
        .as_ref()?
        .get("pods")
        .map(|pods| pods.0.as_str())
}

/// The `pods` of the member's quota `name`, if it exists.
async fn pods_in(member: &ControlPlane, name: &str) -> Option<String> {
    let quota = quotas_in_default(member.client().await.expect("client"))
        .get_opt(name)
        .await
        .expect("get");
    pods_of(quota.as_ref()).map(str::to_string)
}

/// Waits, watching it, until the member's quota `name` has `pods` (`None`:
/// until it is gone).
async fn until_pods(member: &ControlPlane, name: &str, pods: Option<&str>, what: &str) {
    let quotas = quotas_in_default(member.client().await.expect("client"));
    wait_for_object(&quotas, name, what, |quota| pods_of(quota) == pods).await;
}

fn states_are(states: &BTreeMap<String, (String, String)>, wanted: &[(&str, &str)]) -> bool {
    states.len() == wanted.len()
        && wanted
            .iter()
            .all(|(member, state)| states.get(*member).is_some_and(|(have, _)| have == state))
}

async fn fleet(
    hub: &ControlPlane,
    members: &[(&str, &ControlPlane)],
    propagations: Vec<Propagation<ConfigMap>>,
) -> (
    Manager,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), multicluster_runtime::Error>>,
) {
    let provider = TestProvider::default();
    for (name, cp) in members {
        provider
            .clusters
            .add(*name, least_privileged(name, cp).await)
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("hub", hub).await)
        .provider(Arc::new(provider))
        .build();
    for propagation in propagations {
        manager
            .add_controller(propagation.build().expect("propagation"))
            .expect("add");
    }
    let (stop, task) = run_manager(&manager);
    for (name, _) in members {
        wait_until_ready(&manager, name).await;
    }
    (manager, stop, task)
}

/// Create, update, drift repaired, a member refused (shown on the hub
/// object and in an Event there, never `degraded`), and delete held by the
/// finalizer until every member's copy is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_object_is_applied_kept_reported_and_removed() {
    let (hub, a, b) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub, a, b) = (hub.expect("hub"), a.expect("a"), b.expect("b"));
    let (manager, stop, task) = fleet(
        &hub,
        &[("a", &a), ("b", &b)],
        vec![quotas("fleet-quota", "on")],
    )
    .await;

    hub_config_map(&hub, "team", "on", "4").await;
    until_pods(&a, "team", Some("4"), "a to get the quota").await;
    until_pods(&b, "team", Some("4"), "b to get the quota").await;
    let quota = Api::<ResourceQuota>::namespaced(a.client().await.expect("client"), "default")
        .get("team")
        .await
        .expect("quota");
    let labels = quota.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get(PROPAGATION_LABEL).map(String::as_str),
        Some("fleet-quota")
    );
    until_states(
        &hub,
        "team",
        "the hub object to show both members in sync",
        |states| states_are(states, &[("a", "InSync"), ("b", "InSync")]),
    )
    .await;

    // An update on the hub reaches both members; hub objects of the type
    // that the propagation does not select cause no member reconcile.
    let reconciles = || {
        series(
            &manager,
            r#"controller_runtime_reconcile_total{controller="fleet-quota",result="success"}"#,
        )
        .unwrap_or_default()
    };
    let before = reconciles();
    for i in 0..10 {
        hub.create_config_map(&format!("unselected-{i}"), &[])
            .await
            .expect("config map");
    }
    hub_config_map(&hub, "team", "on", "6").await;
    until_pods(&a, "team", Some("6"), "a to follow the update").await;
    until_pods(&b, "team", Some("6"), "b to follow the update").await;
    let spent = reconciles() - before;
    eprintln!("{spent} reconciles for 10 unselected hub objects and one update");
    assert!(
        spent < 25.0,
        "{spent} reconciles: the unselected objects made member requests"
    );

    // Drift: someone edits the quota in a member; it is put back.
    Api::<ResourceQuota>::namespaced(a.client().await.expect("client"), "default")
        .patch(
            "team",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hard": {"pods": "99"}}})),
        )
        .await
        .expect("edit in the member");
    until_pods(&a, "team", Some("6"), "the drift to be repaired").await;

    // A member that refuses: b's identity loses its rights to write.
    set_rules(
        &b,
        vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["resourcequotas".into()]),
            verbs: ["get", "list", "watch"].map(String::from).to_vec(),
            ..PolicyRule::default()
        }],
    )
    .await;
    hub_config_map(&hub, "team", "on", "8").await;
    until_states(
        &hub,
        "team",
        "b to be reported failed with its 403",
        |states| {
            states.get("a").is_some_and(|(state, _)| state == "InSync")
                && states
                    .get("b")
                    .is_some_and(|(state, reason)| state == "Failed" && reason.contains("403"))
        },
    )
    .await;
    let events = Api::<Event>::namespaced(hub.client().await.expect("client"), "default")
        .list(&ListParams::default().fields("involvedObject.name=team"))
        .await
        .expect("events");
    assert!(
        events
            .items
            .iter()
            .any(|event| event.reason.as_deref() == Some("PropagationFailed")
                && event
                    .message
                    .as_deref()
                    .is_some_and(|message| message.starts_with("member b:"))),
        "a Warning Event on the hub object names the member: {:?}",
        events
            .items
            .iter()
            .map(|event| (&event.reason, &event.message))
            .collect::<Vec<_>>()
    );
    for member in ["a", "b"] {
        assert_eq!(
            manager.cluster_state(&ClusterName::from(member)),
            Some(ClusterState::Ready),
            "{member} is not degraded by the propagation"
        );
    }
    set_rules(&b, quota_rules()).await;
    until_pods(&b, "team", Some("8"), "b to catch up once allowed").await;

    // Deleting the hub object removes every copy before the finalizer goes.
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .delete("team", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(
        Polled::ApiServer,
        "the copies and then the hub object to be gone",
        || async {
            pods_in(&a, "team").await.is_none()
                && pods_in(&b, "team").await.is_none()
                && Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
                    .get_opt("team")
                    .await
                    .expect("get")
                    .is_none()
        },
    )
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Drift reported instead of repaired, and a quota someone else made:
/// reported as a conflict by one propagation, taken over by another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_and_conflicts_are_reported_or_taken_over_as_chosen() {
    let (hub, a) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    // Quotas someone else applied first, with their own field manager.
    for name in ["theirs", "taken"] {
        let mut quota = quota_for(&ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("pods".to_string(), "1".to_string())])),
            ..ConfigMap::default()
        });
        quota.metadata.namespace = Some("default".into());
        let mut value = serde_json::to_value(&quota).expect("json");
        value["apiVersion"] = "v1".into();
        value["kind"] = "ResourceQuota".into();
        Api::<ResourceQuota>::namespaced(a.client().await.expect("client"), "default")
            .patch(
                name,
                &PatchParams::apply("someone-else"),
                &Patch::Apply(&value),
            )
            .await
            .expect("their quota");
    }
    let reporting = quotas("reporting", "report")
        .drift(Drift::Report)
        .conflicts(Conflicts::Report);
    let taking = quotas("taking", "take").conflicts(Conflicts::TakeOver);
    let (_manager, stop, task) = fleet(&hub, &[("a", &a)], vec![reporting, taking]).await;

    hub_config_map(&hub, "theirs", "report", "4").await;
    hub_config_map(&hub, "taken", "take", "4").await;
    until_states(
        &hub,
        "theirs",
        "their quota to be reported a conflict, and left alone",
        |states| {
            states.get("a").is_some_and(|(state, reason)| {
                state == "Conflict" && reason.contains("someone-else")
            })
        },
    )
    .await;
    assert_eq!(pods_in(&a, "theirs").await.as_deref(), Some("1"));
    eventually(Polled::ApiServer, "the other to be taken over", || async {
        pods_in(&a, "taken").await.as_deref() == Some("4")
            && states_are(&member_states(&hub, "taken").await, &[("a", "InSync")])
    })
    .await;

    // A quota of the reporting propagation's own, edited in the member:
    // drift is reported and the edit left in place.
    hub_config_map(&hub, "ours", "report", "5").await;
    until_pods(&a, "ours", Some("5"), "our quota to be applied").await;
    Api::<ResourceQuota>::namespaced(a.client().await.expect("client"), "default")
        .patch(
            "ours",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hard": {"pods": "99"}}})),
        )
        .await
        .expect("edit in the member");
    until_states(&hub, "ours", "the drift to be reported", |states| {
        states.get("a").is_some_and(|(state, _)| state == "Drifted")
    })
    .await;
    assert_eq!(
        pods_in(&a, "ours").await.as_deref(),
        Some("99"),
        "left in place"
    );
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

const CHOSEN: &str = "example.com/members";

/// The members a hub object names in its `CHOSEN` annotation: a decision
/// of the simplest kind.
fn chosen(hub: &ConfigMap) -> Vec<ClusterName> {
    hub.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(CHOSEN))
        .map(|names| {
            names
                .split(',')
                .filter(|name| !name.is_empty())
                .map(ClusterName::from)
                .collect()
        })
        .unwrap_or_default()
}

async fn choose(hub: &ControlPlane, names: &str) {
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .patch(
            "team",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {CHOSEN: names}}})),
        )
        .await
        .expect("choose");
}

async fn uid_in(member: &ControlPlane, name: &str) -> Option<String> {
    Api::<ResourceQuota>::namespaced(member.client().await.expect("client"), "default")
        .get_opt(name)
        .await
        .expect("get")
        .and_then(|quota| quota.metadata.uid)
}

/// With the default removal grace: a chosen member that is not engaged is
/// `NotEngaged`, a member that joins later and is chosen gets the quota, a
/// member moved out and back within the grace keeps its quota (the same
/// object), one left out loses it after the grace, and a member that
/// leaves the fleet while chosen shows `NotEngaged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chosen_members_join_move_without_deletion_and_leave() {
    let (hub, a, b) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub, a, b) = (hub.expect("hub"), a.expect("a"), b.expect("b"));
    let provider = TestProvider::default();
    provider
        .clusters
        .add("a", least_privileged("a", &a).await)
        .expect("add");
    let manager = Manager::builder(cluster_for("hub", &hub).await)
        .provider(Arc::new(provider.clone()))
        .build();
    let propagation = quotas("chosen-quota", "on").members_chosen_by(chosen);
    manager
        .add_controller(propagation.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    wait_until_ready(&manager, "a").await;

    hub_config_map(&hub, "team", "on", "4").await;
    choose(&hub, "a,b").await;
    eventually(
        Polled::ApiServer,
        "a to be in sync and b not engaged",
        || async {
            pods_in(&a, "team").await.as_deref() == Some("4")
                && states_are(
                    &member_states(&hub, "team").await,
                    &[("a", "InSync"), ("b", "NotEngaged")],
                )
        },
    )
    .await;

    provider
        .clusters
        .add("b", least_privileged("b", &b).await)
        .expect("add b");
    eventually(
        Polled::ApiServer,
        "b, once engaged, to get the quota",
        || async {
            pods_in(&b, "team").await.as_deref() == Some("4")
                && states_are(
                    &member_states(&hub, "team").await,
                    &[("a", "InSync"), ("b", "InSync")],
                )
        },
    )
    .await;

    // a moves out and straight back; b moves out for good after it.
    let before = uid_in(&a, "team").await.expect("a's quota");
    choose(&hub, "b").await;
    choose(&hub, "a").await;
    until_pods(
        &b,
        "team",
        None,
        "b's quota to go once its grace has passed",
    )
    .await;
    assert_eq!(
        uid_in(&a, "team").await,
        Some(before),
        "a's quota was never deleted: its grace began before b's"
    );
    until_states(&hub, "team", "the hub object to list only a", |states| {
        states_are(states, &[("a", "InSync")])
    })
    .await;

    // a leaves the fleet while chosen.
    provider.clusters.remove(&ClusterName::from("a"));
    until_states(&hub, "team", "a to be shown not engaged", |states| {
        states_are(states, &[("a", "NotEngaged")])
    })
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A cluster-scoped type (a Namespace per hub object) in members reached
/// as admin, and `report`: each member's `status.phase`, set by its API
/// server, is written back under the member on the hub object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_status_field_reaches_the_hub_object() {
    use k8s_openapi::api::core::v1::Namespace;
    let (hub, a) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    let manager = with_member(&hub, "a", &a).await;
    let namespaces = Propagation::<ConfigMap>::new("team-namespaces")
        .select(|hub| labelled(hub, "namespace"))
        .propagates::<Namespace>()
        .desired(|hub, _member| {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: hub.metadata.name.clone(),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            Ok(vec![Desired::new(&namespace)?])
        })
        .report(|applied| applied.data.pointer("/status/phase").cloned())
        .status_annotation(STATUS);
    manager
        .add_controller(namespaces.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    hub_config_map(&hub, "team-x", "namespace", "1").await;
    eventually(
        Polled::ApiServer,
        "the member's namespace phase on the hub object",
        || async {
            let Some(object) =
                Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
                    .get_opt("team-x")
                    .await
                    .expect("get")
            else {
                return false;
            };
            let Some(text) = object
                .metadata
                .annotations
                .and_then(|a| a.get(STATUS).cloned())
            else {
                return false;
            };
            let status: Value = serde_json::from_str(&text).expect("JSON");
            status["members"][0]["reported"]["Namespace team-x"] == "Active"
        },
    )
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// `Propagation::members_labelled`: a member whose cluster labels stop matching loses
/// its quota (after the grace) without any other event, and gets it back
/// when they match again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelled_members_follow_their_cluster_labels() {
    use kube::core::{Expression, Selector};
    use multicluster_runtime::Inventory;
    let (hub, a) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    let member = least_privileged("a", &a).await;
    let labelled_as =
        |env: &str| Inventory::labelled(BTreeMap::from([("env".to_string(), env.to_string())]));
    member.set_inventory(labelled_as("prod"));
    let provider = TestProvider::default();
    provider.clusters.add("a", member.clone()).expect("add");
    let manager = Manager::builder(cluster_for("hub", &hub).await)
        .provider(Arc::new(provider))
        .build();
    let prod: Selector = Expression::Equal("env".into(), "prod".into()).into();
    let propagation = quotas("prod-quota", "on").members_labelled(prod);
    manager
        .add_controller(propagation.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    wait_until_ready(&manager, "a").await;
    hub_config_map(&hub, "team", "on", "4").await;
    until_pods(&a, "team", Some("4"), "the prod member to get the quota").await;

    member.set_inventory(labelled_as("dev"));
    until_pods(
        &a,
        "team",
        None,
        "the quota to go once the member is no longer prod",
    )
    .await;
    member.set_inventory(labelled_as("prod"));
    until_pods(
        &a,
        "team",
        Some("4"),
        "the quota back once it is prod again",
    )
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A member whose watch of a propagated type cannot list (its identity
/// may write quotas but not list or watch them) is `Pending`, not
/// `InSync`: what is no longer desired there could not be looked for. Once
/// it may list, it is in sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_watch_has_not_listed_is_pending_not_in_sync() {
    let (hub, a) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    let member = least_privileged("a", &a).await;
    let write_only = vec![PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["resourcequotas".into()]),
        verbs: ["get", "create", "patch", "delete"]
            .map(String::from)
            .to_vec(),
        ..PolicyRule::default()
    }];
    set_rules(&a, write_only).await;
    let provider = TestProvider::default();
    provider.clusters.add("a", member).expect("add");
    let manager = Manager::builder(cluster_for("hub", &hub).await)
        .provider(Arc::new(provider))
        .build();
    manager
        .add_controller(quotas("quotas", "on").build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    hub_config_map(&hub, "limits", "on", "5").await;

    // Pending at first is also what a member not reconciled yet shows (with
    // no reason): wait for the pending that names the watch it waits for.
    until_states(
        &hub,
        "limits",
        "a pending on its watch of resourcequotas",
        |states| {
            states_are(states, &[("a", "Pending")]) && states["a"].1.contains("resourcequotas")
        },
    )
    .await;
    // Applied all the same.
    assert_eq!(pods_in(&a, "limits").await.as_deref(), Some("5"));

    set_rules(&a, quota_rules()).await;
    until_states(&hub, "limits", "a in sync once it may list", |states| {
        states_are(states, &[("a", "InSync")])
    })
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A custom resource of the test's own, propagated with its definition.
#[derive(
    kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq,
)]
#[kube(
    group = "test.example.com",
    version = "v1",
    kind = "Widget",
    namespaced,
    schema = "disabled"
)]
struct WidgetSpec {
    size: i64,
}

/// The definition of [`Widget`], as a user would ship it.
fn widget_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.example.com"},
        "spec": {
            "group": "test.example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }))
    .expect("definition")
}

/// Warning Events on the hub object `name` with `reason`.
async fn warnings(hub: &ControlPlane, name: &str, reason: &str) -> usize {
    Api::<Event>::namespaced(hub.client().await.expect("client"), "default")
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|event| {
            event.involved_object.name.as_deref() == Some(name)
                && event.reason.as_deref() == Some(reason)
        })
        .count()
}

/// Objects that depend on each other, listed in the worst order (the
/// custom resource and the quota before their definition and namespace),
/// reach a fresh member in waves: each wave once the one before is
/// available, so the member is never `Failed` and no Warning is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_a_namespace_and_what_needs_them_reach_a_fresh_member_in_waves() {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    // The member runs kube-controller-manager: a deleted namespace is
    // finalized by its namespace controller.
    let (hub, a) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::builder().controller_manager(true).start()
    );
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    let manager = with_member(&hub, "a", &a).await;
    let tenants = Propagation::<ConfigMap>::new("tenants")
        .select(|hub| labelled(hub, "tenant"))
        .propagates::<CustomResourceDefinition>()
        .propagates::<Namespace>()
        .propagates::<ResourceQuota>()
        .propagates::<Widget>()
        .desired(|hub, _member| {
            let name = hub.metadata.name.clone().unwrap_or_default();
            let mut widget = Widget::new("w", WidgetSpec { size: 3 });
            widget.metadata.namespace = Some(name.clone());
            let mut quota = quota_for(hub);
            quota.metadata.namespace = Some(name.clone());
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(name),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            Ok(vec![
                Desired::new(&widget)?,
                Desired::new(&quota)?,
                Desired::new(&namespace)?,
                Desired::new(&widget_definition())?,
            ])
        })
        .status_annotation(STATUS);
    manager
        .add_controller(tenants.build().expect("propagation"))
        .expect("add");
    // Not waited for to be ready: the member's watch of widgets cannot
    // start before their definition is there (it is `degraded` until).
    let (stop, task) = run_manager(&manager);
    hub_config_map(&hub, "tenant-x", "tenant", "4").await;
    // Polled: the state is written to the hub object on the API server.
    multicluster_runtime::testing::eventually_within(
        std::time::Duration::from_secs(120),
        Polled::ApiServer,
        "the member in sync",
        || async { states_are(&member_states(&hub, "tenant-x").await, &[("a", "InSync")]) },
    )
    .await;
    let widget = Api::<Widget>::namespaced(a.client().await.expect("client"), "tenant-x")
        .get("w")
        .await
        .expect("the widget in the member");
    assert_eq!(widget.spec, WidgetSpec { size: 3 });
    assert!(
        Api::<ResourceQuota>::namespaced(a.client().await.expect("client"), "tenant-x")
            .get_opt("tenant-x")
            .await
            .expect("get")
            .is_some(),
        "the quota in its namespace"
    );
    assert_eq!(
        warnings(&hub, "tenant-x", "PropagationFailed").await,
        0,
        "a wave was applied before the one it needs"
    );

    // The hub object deleted: what was made goes the other way round, the
    // widget before the quota before its namespace and the definition,
    // as the member's own watch sees it.
    let seen = Arc::new(tokio::sync::watch::Sender::new(Vec::<String>::new()));
    let member = a.client().await.expect("client");
    let watching = [
        watch_goings::<Widget>(&member, &seen, "widget"),
        watch_goings::<ResourceQuota>(&member, &seen, "quota"),
        watch_goings::<Namespace>(&member, &seen, "namespace"),
        watch_goings::<CustomResourceDefinition>(&member, &seen, "definition"),
    ];
    // Each watch has listed before the deletion: one started after its
    // objects went would never see them go.
    let mut watching_now = Vec::new();
    for (task, listed) in watching {
        tokio::time::timeout(multicluster_runtime::testing::DEFAULT_DEADLINE, listed)
            .await
            .expect("the member's watch to list in time")
            .expect("the member's watch to list");
        watching_now.push(task);
    }
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .delete("tenant-x", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(Polled::ApiServer, "the hub object to be gone", || async {
        Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
            .get_opt("tenant-x")
            .await
            .is_ok_and(|object| object.is_none())
    })
    .await;
    // The test's own watches may tell a little after the hub object went.
    let order = tokio::time::timeout(
        multicluster_runtime::testing::DEFAULT_DEADLINE,
        seen.subscribe().wait_for(|seen| seen.len() == 4),
    )
    .await
    .map(|order| order.expect("seen").clone())
    .unwrap_or_else(|_| panic!("not all four went: {:?}", *seen.borrow()));
    let at = |what: &str| {
        order
            .iter()
            .position(|seen| seen == what)
            .unwrap_or_else(|| panic!("{what} never went: {order:?}"))
    };
    assert!(at("widget") < at("quota"), "{order:?}");
    assert!(at("quota") < at("namespace"), "{order:?}");
    assert!(at("widget") < at("definition"), "{order:?}");
    for watch in watching_now {
        watch.abort();
    }
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Notes `what` in `seen` the first time an object of type `T` in
/// `member` is being deleted (or is gone), as the member's watch tells.
/// The receiver is told once the watch has listed.
fn watch_goings<T>(
    member: &kube::Client,
    seen: &Arc<tokio::sync::watch::Sender<Vec<String>>>,
    what: &'static str,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<()>,
)
where
    T: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    use futures::StreamExt;
    use kube::runtime::watcher;
    let (api, seen) = (Api::<T>::all(member.clone()), seen.clone());
    let (listed, told) = tokio::sync::oneshot::channel();
    let mut listed = Some(listed);
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            if matches!(event, Ok(watcher::Event::InitDone))
                && let Some(listed) = listed.take()
            {
                let _ = listed.send(());
            }
            let going = match event {
                Ok(watcher::Event::Delete(_)) => true,
                Ok(watcher::Event::Apply(object)) => object.meta().deletion_timestamp.is_some(),
                _ => false,
            };
            seen.send_if_modified(|seen| {
                let first = going && !seen.iter().any(|known| known == what);
                if first {
                    seen.push(what.to_string());
                }
                first
            });
        }
    });
    (task, told)
}

/// A Deployment applied in a member is `Progressing` until its controller
/// says it rolled out (the test plays the Deployment controller: members
/// here run none), then `InSync`; a user rule replaces the built-in one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_is_in_sync_only_once_what_it_got_is_available() {
    use k8s_openapi::api::apps::v1::Deployment;
    use multicluster_propagation::Health;
    let (hub, a) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    let manager = with_member(&hub, "a", &a).await;
    let web = |hub: &ConfigMap| -> Deployment {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": hub.metadata.name, "namespace": "default"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}]},
                },
            },
        }))
        .expect("deployment")
    };
    let workloads = Propagation::<ConfigMap>::new("workloads")
        .select(|hub| labelled(hub, "web"))
        .propagates::<Deployment>()
        .desired(move |hub, _member| Ok(vec![Desired::new(&web(hub))?]))
        .status_annotation(STATUS);
    manager
        .add_controller(workloads.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    wait_until_ready(&manager, "a").await;
    hub_config_map(&hub, "web", "web", "1").await;
    until_states(
        &hub,
        "web",
        "the member progressing with the Deployment named",
        |states| {
            states.get("a").is_some_and(|(state, reason)| {
                state == "Progressing" && reason.contains("Deployment default/web")
            })
        },
    )
    .await;
    assert!(
        Api::<Deployment>::namespaced(a.client().await.expect("client"), "default")
            .get_opt("web")
            .await
            .expect("get")
            .is_some(),
        "progressing means applied"
    );
    // The Deployment controller's report, as the real one writes it.
    let deployments = Api::<Deployment>::namespaced(a.client().await.expect("client"), "default");
    let generation = deployments
        .get("web")
        .await
        .expect("get")
        .metadata
        .generation
        .expect("generation");
    deployments
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "observedGeneration": generation,
                "replicas": 2,
                "updatedReplicas": 2,
                "readyReplicas": 2,
                "availableReplicas": 2,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability."},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "message": "ReplicaSet \"web-1\" has successfully progressed."},
                ],
            }})),
        )
        .await
        .expect("status");
    until_states(
        &hub,
        "web",
        "the member in sync once the Deployment is available",
        |states| states_are(states, &[("a", "InSync")]),
    )
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");

    // A user's rule instead: this one never finds a Deployment available.
    let manager = with_member(&hub, "a", &a).await;
    let strict = Propagation::<ConfigMap>::new("workloads")
        .select(|hub| labelled(hub, "web"))
        .propagates::<Deployment>()
        .desired(move |hub, _member| Ok(vec![Desired::new(&web(hub))?]))
        .health::<Deployment>(|_| Health::Degraded("never good enough".to_string()))
        .status_annotation(STATUS);
    manager
        .add_controller(strict.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    until_states(
        &hub,
        "web",
        "the member degraded by the user's rule",
        |states| {
            states.get("a").is_some_and(|(state, reason)| {
                state == "Degraded" && reason.contains("never good enough")
            })
        },
    )
    .await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Whether anything of the propagation `name` is left on `quota`: its
/// label, the owner or revision annotations, its field manager.
fn claimed_by(quota: &ResourceQuota, name: &str) -> Vec<String> {
    let mut left = Vec::new();
    let meta = &quota.metadata;
    // Every label and annotation of ours is in our domain.
    let ours = |key: &String| key.contains("mcr.sigs.k8s.io/");
    for (what, keys) in [("label", &meta.labels), ("annotation", &meta.annotations)] {
        for key in keys
            .iter()
            .flat_map(|keys| keys.keys())
            .filter(|key| ours(key))
        {
            left.push(format!("{what} {key}"));
        }
    }
    if meta
        .managed_fields
        .iter()
        .flatten()
        .any(|entry| entry.manager.as_deref() == Some(name))
    {
        left.push("field manager".to_string());
    }
    left
}

/// Orphaned, not deleted: by the propagation's policy when its hub object
/// is deleted, and by an object's own annotation when it is no longer
/// wanted. What stays has nothing of the propagation on it, and is no
/// longer claimed (the hub object's finalizer goes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_objects_stay_in_the_member_with_nothing_of_ours_on_them() {
    use multicluster_propagation::{DELETION_POLICY_ANNOTATION, DeletionPolicy};
    let (hub, a) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    let keeping = quotas("keeping", "keep").when_hub_deleted(DeletionPolicy::Orphan);
    let marking = Propagation::<ConfigMap>::new("marking")
        .select(|hub| labelled(hub, "mark"))
        .propagates::<ResourceQuota>()
        .desired(|hub, _member| {
            let mut quota = quota_for(hub);
            quota.metadata.annotations = Some(BTreeMap::from([(
                DELETION_POLICY_ANNOTATION.to_string(),
                "orphan".to_string(),
            )]));
            Ok(vec![Desired::new(&quota)?])
        })
        .status_annotation(STATUS);
    let (_manager, stop, task) = fleet(&hub, &[("a", &a)], vec![keeping, marking]).await;
    hub_config_map(&hub, "kept", "keep", "4").await;
    hub_config_map(&hub, "marked", "mark", "5").await;
    until_pods(&a, "kept", Some("4"), "the kept quota in the member").await;
    until_pods(&a, "marked", Some("5"), "the marked quota in the member").await;

    // The hub object of the orphaning propagation is deleted; the marked
    // one is no longer selected (the propagation's policy: delete).
    let hub_config_maps =
        Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default");
    hub_config_maps
        .delete("kept", &DeleteParams::default())
        .await
        .expect("delete");
    hub_config_maps
        .patch(
            "marked",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL: null}}})),
        )
        .await
        .expect("unlabel");
    eventually(Polled::ApiServer, "both hub objects let go", || async {
        let kept_gone = hub_config_maps
            .get_opt("kept")
            .await
            .is_ok_and(|o| o.is_none());
        let marked_released = hub_config_maps
            .get_opt("marked")
            .await
            .is_ok_and(|o| o.is_some_and(|o| o.metadata.finalizers.unwrap_or_default().is_empty()));
        kept_gone && marked_released
    })
    .await;
    let quotas = Api::<ResourceQuota>::namespaced(a.client().await.expect("client"), "default");
    for (name, propagation) in [("kept", "keeping"), ("marked", "marking")] {
        let quota = quotas
            .get(name)
            .await
            .unwrap_or_else(|err| panic!("{name} was deleted, not orphaned: {err}"));
        assert_eq!(
            claimed_by(&quota, propagation),
            Vec::<String>::new(),
            "{name}"
        );
    }
    assert_eq!(
        pods_in(&a, "kept").await.as_deref(),
        Some("4"),
        "left as it was"
    );

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A quota `name` with `pods` made in `member` by someone else (its own
/// field manager), before any propagation.
async fn someone_elses_quota(member: &ControlPlane, name: &str, pods: &str) {
    let object = json!({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"hard": {"pods": pods}},
    });
    Api::<ResourceQuota>::namespaced(member.client().await.expect("client"), "default")
        .patch(name, &PatchParams::apply("someone"), &Patch::Apply(&object))
        .await
        .expect("someone else's quota");
}

/// The revision the hub object's status says member `a` is in sync with.
async fn revision_of_a(hub: &ControlPlane, name: &str) -> Option<String> {
    let object = Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .get_opt(name)
        .await
        .expect("get")?;
    let status: Value = serde_json::from_str(object.metadata.annotations?.get(STATUS)?).ok()?;
    status["members"]
        .as_array()?
        .iter()
        .find(|member| member["cluster"] == "a")?["revision"]
        .as_str()
        .map(str::to_string)
}

/// Writes `robot` made to the quota `name`, by the member's audit log
/// (dry runs and refused requests are no writes).
fn writes_to(member: &ControlPlane, name: &str) -> usize {
    member
        .audit_events()
        .into_iter()
        .filter(|event| {
            event["stage"] == "ResponseComplete"
                && event["user"]["username"] == "robot"
                && event["objectRef"]["resource"] == "resourcequotas"
                && event["objectRef"]["name"] == name
                && ["create", "update", "patch", "delete"]
                    .iter()
                    .any(|verb| event["verb"] == *verb)
                && !event["requestURI"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("dryRun=All")
                && event["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|code| (200..300).contains(&code))
        })
        .count()
}

/// Create-only never updates; report-only writes nothing (the member's
/// audit log) and names the differing fields, never their values; taking
/// over when equal adopts an identical object for good and leaves a
/// different one, naming why; ignored fields are neither set nor owned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_modes_create_only_report_only_take_over_when_equal_and_ignored_fields() {
    use multicluster_propagation::ApplyMode;
    let (hub, a) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::builder().audit(true).start()
    );
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    someone_elses_quota(&a, "looked", "3").await;
    someone_elses_quota(&a, "equal", "7").await;
    someone_elses_quota(&a, "unequal", "2").await;
    let creating = quotas("creating", "once").apply_mode(ApplyMode::CreateOnly);
    let reporting = quotas("reporting", "look").apply_mode(ApplyMode::ReportOnly);
    let adopting = quotas("adopting", "adopt").conflicts(Conflicts::TakeOverWhenEqual);
    let ignoring = Propagation::<ConfigMap>::new("ignoring")
        .select(|hub| labelled(hub, "partial"))
        .propagates::<ResourceQuota>()
        .desired(|hub, _member| {
            let mut quota = quota_for(hub);
            if let Some(hard) = quota.spec.as_mut().and_then(|spec| spec.hard.as_mut()) {
                hard.insert("cpu".into(), Quantity("1".into()));
            }
            Ok(vec![Desired::new(&quota)?])
        })
        .ignore_fields(["/spec/hard/cpu"])
        .status_annotation(STATUS);
    let (_manager, stop, task) = fleet(
        &hub,
        &[("a", &a)],
        vec![creating, reporting, adopting, ignoring],
    )
    .await;
    hub_config_map(&hub, "once", "once", "4").await;
    hub_config_map(&hub, "looked", "look", "5").await;
    hub_config_map(&hub, "equal", "adopt", "7").await;
    hub_config_map(&hub, "unequal", "adopt", "8").await;
    hub_config_map(&hub, "partial", "partial", "3").await;

    eventually(Polled::ApiServer, "the created quota in sync", || async {
        pods_in(&a, "once").await.as_deref() == Some("4")
            && revision_of_a(&hub, "once").await.is_some()
    })
    .await;
    let looked = eventually_some(Polled::ApiServer, "the difference reported", || async {
        let states = member_states(&hub, "looked").await;
        let (state, reason) = states.get("a")?.clone();
        (state == "Drifted").then_some(reason)
    })
    .await;
    assert!(
        looked.contains("applying would change spec.hard.pods")
            && !looked.contains('3')
            && !looked.contains('5'),
        "{looked}"
    );
    let unequal = eventually_some(
        Polled::ApiServer,
        "the unequal quota left alone",
        || async {
            let states = member_states(&hub, "unequal").await;
            let (state, reason) = states.get("a")?.clone();
            (state == "Conflict").then_some(reason)
        },
    )
    .await;
    assert!(unequal.contains("would change spec.hard.pods"), "{unequal}");
    until_states(&hub, "equal", "the equal quota adopted", |states| {
        states_are(states, &[("a", "InSync")])
    })
    .await;
    until_pods(&a, "partial", Some("3"), "the partial quota applied").await;
    let partial = Api::<ResourceQuota>::namespaced(a.client().await.expect("client"), "default")
        .get("partial")
        .await
        .expect("partial");
    assert_eq!(
        partial
            .spec
            .and_then(|spec| spec.hard)
            .and_then(|hard| hard.get("cpu").cloned()),
        None,
        "an ignored field was set"
    );

    // Create-only: a new revision is looked at, and never applied.
    let first = revision_of_a(&hub, "once").await;
    hub_config_map(&hub, "once", "once", "6").await;
    eventually(Polled::ApiServer, "the new revision looked at", || async {
        let now = revision_of_a(&hub, "once").await;
        now.is_some() && now != first
    })
    .await;
    assert_eq!(pods_in(&a, "once").await.as_deref(), Some("4"), "updated");
    assert_eq!(writes_to(&a, "once"), 1, "written more than to create it");
    // Adopted for good: a later change reaches it, where a shared field
    // would have been a conflict.
    hub_config_map(&hub, "equal", "adopt", "9").await;
    until_pods(&a, "equal", Some("9"), "the adopted quota to follow").await;
    assert_eq!(pods_in(&a, "looked").await.as_deref(), Some("3"));
    assert_eq!(writes_to(&a, "looked"), 0, "report-only wrote");
    assert_eq!(pods_in(&a, "unequal").await.as_deref(), Some("2"));
    assert_eq!(writes_to(&a, "unequal"), 0, "a different object was taken");

    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A desired object whose ownerReference names the hub object (a copy of
/// its metadata, or an owner set as within one cluster), or an object the
/// member does not hold, would be deleted by the member's garbage
/// collector as soon as it is made (shown first, with the member's own
/// kube-controller-manager), and made again: it is refused, by name, and
/// not made. One owned by an object of the member is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desired_object_owned_outside_its_member_is_refused_not_fed_to_the_garbage_collector() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use multicluster_runtime::testing::wait_for_object;
    let (hub, a) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::builder().controller_manager(true).start()
    );
    let (hub, a) = (hub.expect("hub"), a.expect("a"));
    hub_config_map(&hub, "owned", "owned", "3").await;
    let hub_uid = Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .get("owned")
        .await
        .expect("hub object")
        .metadata
        .uid
        .expect("uid");
    let owned_by = |kind: &str, name: &str, uid: &str| OwnerReference {
        api_version: "v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        ..OwnerReference::default()
    };

    // What the propagation must not do: the member's garbage collector
    // deletes an object owned by the hub object's uid.
    let quotas_in_a =
        Api::<ResourceQuota>::namespaced(a.client().await.expect("client"), "default");
    let mut doomed = quota_for(&ConfigMap::default());
    doomed.metadata.name = Some("doomed".into());
    doomed.metadata.owner_references = Some(vec![owned_by("ConfigMap", "owned", &hub_uid)]);
    quotas_in_a
        .create(&Default::default(), &doomed)
        .await
        .expect("a quota owned by the hub object, made by hand");
    wait_for_object(
        &quotas_in_a,
        "doomed",
        "the member's garbage collector to delete it",
        |quota| quota.is_none(),
    )
    .await;

    // An owner the member holds: another quota there.
    let mut anchor = quota_for(&ConfigMap::default());
    anchor.metadata.name = Some("anchor".into());
    let anchor_uid = quotas_in_a
        .create(&Default::default(), &anchor)
        .await
        .expect("anchor")
        .metadata
        .uid
        .expect("uid");
    let owned_as = |owner: OwnerReference, label: &'static str| {
        Propagation::<ConfigMap>::new(label)
            .select(move |hub| labelled(hub, label))
            .propagates::<ResourceQuota>()
            .desired(move |hub, _member| {
                let mut quota = quota_for(hub);
                quota.metadata.owner_references = Some(vec![owner.clone()]);
                Ok(vec![Desired::new(&quota)?])
            })
            .status_annotation(STATUS)
    };
    let propagations = vec![
        owned_as(owned_by("ConfigMap", "owned", &hub_uid), "owned"),
        owned_as(
            owned_by("ResourceQuota", "nowhere", "0000-nowhere"),
            "nowhere",
        ),
        owned_as(owned_by("ResourceQuota", "anchor", &anchor_uid), "anchored"),
        quotas("plain", "plain"),
    ];
    let (_manager, stop, task) = fleet(&hub, &[("a", &a)], propagations).await;
    hub_config_map(&hub, "nowhere", "nowhere", "4").await;
    hub_config_map(&hub, "anchored", "anchored", "5").await;
    hub_config_map(&hub, "plain", "plain", "2").await;
    let refused = |name: &'static str| {
        let hub = &hub;
        async move {
            eventually_some(Polled::ApiServer, "the quota refused", || async {
                member_states(hub, name)
                    .await
                    .get("a")
                    .filter(|(state, _)| state == "Failed")
                    .map(|(_, reason)| reason.clone())
            })
            .await
        }
    };
    let reason = refused("owned").await;
    assert!(
        reason.contains("ResourceQuota default/owned")
            && reason.contains("ownerReference to ConfigMap/owned names an object of the hub")
            && reason.contains("garbage collector"),
        "{reason}"
    );
    let reason = refused("nowhere").await;
    assert!(
        reason.contains(
            "ownerReference to ResourceQuota/nowhere names an object this member does not hold"
        ),
        "{reason}"
    );
    for name in ["anchored", "plain"] {
        eventually(Polled::ApiServer, "the quota in sync", || async {
            states_are(&member_states(&hub, name).await, &[("a", "InSync")])
        })
        .await;
    }
    assert_eq!(pods_in(&a, "anchored").await.as_deref(), Some("5"));
    assert_eq!(pods_in(&a, "plain").await.as_deref(), Some("2"));
    for name in ["owned", "nowhere"] {
        assert_eq!(pods_in(&a, name).await, None, "{name} was made");
    }
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The maintenance label on a member's cluster, honoured by every
/// propagation: cordoned, a member keeps what it has while the others
/// (one at a time, a paced rollout it does not hold up) get a new
/// revision, and catches up once uncordoned; drained, it loses what was
/// propagated, and gets it back without the label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordoned_member_keeps_a_drained_one_lets_go_and_both_catch_up() {
    use multicluster_propagation::{MAINTENANCE_LABEL, MaxUnavailable, Rollout};
    use multicluster_runtime::Inventory;
    let (hub, a, b) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub, a, b) = (hub.expect("hub"), a.expect("a"), b.expect("b"));
    let (member_a, member_b) = (
        least_privileged("a", &a).await,
        least_privileged("b", &b).await,
    );
    let provider = TestProvider::default();
    provider.clusters.add("a", member_a.clone()).expect("add");
    provider.clusters.add("b", member_b.clone()).expect("add");
    let manager = Manager::builder(cluster_for("hub", &hub).await)
        .provider(Arc::new(provider))
        .build();
    let propagation = quotas("quota", "on").rollout(Rollout::rolling(MaxUnavailable::Count(1)));
    manager
        .add_controller(propagation.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    wait_until_ready(&manager, "a").await;
    wait_until_ready(&manager, "b").await;
    let maintenance = |value: Option<&str>| {
        Inventory::labelled(
            value
                .map(|value| BTreeMap::from([(MAINTENANCE_LABEL.to_string(), value.to_string())]))
                .unwrap_or_default(),
        )
    };
    hub_config_map(&hub, "team", "on", "4").await;
    until_pods(&a, "team", Some("4"), "a with 4").await;
    until_pods(&b, "team", Some("4"), "b with 4").await;

    // Cordoned: a keeps 4 while b gets 5, the rollout not held up by a.
    member_a.set_inventory(maintenance(Some("cordon")));
    hub_config_map(&hub, "team", "on", "5").await;
    until_pods(&b, "team", Some("5"), "b with 5").await;
    let reason = eventually_some(Polled::ApiServer, "a shown cordoned", || async {
        member_states(&hub, "team")
            .await
            .get("a")
            .filter(|(state, reason)| state == "Pending" && reason.contains("cordoned"))
            .map(|(_, reason)| reason.clone())
    })
    .await;
    assert!(reason.contains(MAINTENANCE_LABEL), "{reason}");
    until_states(&hub, "team", "b in sync", |states| {
        states.get("b").is_some_and(|(state, _)| state == "InSync")
    })
    .await;
    assert_eq!(
        pods_in(&a, "team").await.as_deref(),
        Some("4"),
        "a changed while cordoned"
    );

    // Uncordoned: a catches up.
    member_a.set_inventory(maintenance(None));
    until_pods(&a, "team", Some("5"), "a caught up with 5").await;

    // Drained: b loses the quota, a keeps it; without the label it is back.
    member_b.set_inventory(maintenance(Some("drain")));
    until_pods(&b, "team", None, "b drained").await;
    assert_eq!(
        pods_in(&a, "team").await.as_deref(),
        Some("5"),
        "a drained too"
    );
    until_states(&hub, "team", "b shown drained", |states| {
        states
            .get("b")
            .is_some_and(|(state, reason)| state == "Pending" && reason.contains("drained"))
    })
    .await;
    member_b.set_inventory(maintenance(None));
    until_pods(&b, "team", Some("5"), "b back with 5").await;
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
