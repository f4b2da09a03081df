//! The example binary on a hub and three member control planes, members
//! joining and leaving through kubeconfig Secrets: a labelled hub
//! ConfigMap is copied into every member, follows updates, reaches a member
//! that joins later, is reported on the hub object member by member as
//! members come and go, and is removed from every member when deleted on
//! the hub (whose finalizer then lets it go) or no longer labelled (the
//! finalizer is let go at once).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::{GRACE, kubeconfig_secret, terminate};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-fleet-propagation");
const LABEL: &str = "fleet.example/propagate";
const STATUS: &str = "fleet.example/propagation";

async fn join(hub: &kube::Client, name: &str, member: &ControlPlane) {
    Api::<Secret>::namespaced(hub.clone(), "fleet")
        .create(
            &PostParams::default(),
            &kubeconfig_secret(name, member.kubeconfig()),
        )
        .await
        .expect("member Secret");
}

/// Waits, watching it, until `api`'s object `name` satisfies `that`.
async fn until(
    api: &Api<ConfigMap>,
    name: &str,
    what: &str,
    that: impl Fn(Option<&ConfigMap>) -> bool,
) {
    multicluster_runtime::testing::wait_for_object(api, name, what, that).await;
}

/// Waits until the member's copy `name` holds `v` = `value` (`None`: gone).
async fn until_copy(member: &ControlPlane, name: &str, value: Option<&str>, what: &str) {
    let copies = Api::<ConfigMap>::namespaced(member.client().await.expect("client"), "default");
    let wanted = value.and_then(data);
    until(&copies, name, what, |copy| {
        copy.map(|copy| copy.data.clone().unwrap_or_default()) == wanted
    })
    .await;
}

/// Waits until the hub object's status counts `(in sync, listed)`.
async fn until_counted(hub: &kube::Client, wanted: (usize, usize), what: &str) {
    let objects = Api::<ConfigMap>::namespaced(hub.clone(), "default");
    until(&objects, "shared", what, |object| {
        counted_in(object) == Some(wanted)
    })
    .await;
}

fn data(value: &str) -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([("v".to_string(), value.to_string())]))
}

async fn hub_object(hub: &kube::Client) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(hub.clone(), "default")
        .get_opt("shared")
        .await
        .ok()
        .flatten()
}

/// The members the hub object's status annotation lists, and how many of
/// them are in sync: `(in sync, listed)`.
fn counted_in(object: Option<&ConfigMap>) -> Option<(usize, usize)> {
    let text = object?.metadata.annotations.as_ref()?.get(STATUS)?;
    let status: serde_json::Value = serde_json::from_str(text).ok()?;
    let members = status["members"].as_array()?;
    let in_sync = members
        .iter()
        .filter(|member| member["state"] == "InSync")
        .count();
    Some((in_sync, members.len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_objects_are_propagated_counted_and_cleaned_up_as_members_come_and_go() {
    let (hub_cp, m1, m2, m3) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub_cp, m1, m2, m3) = (
        hub_cp.expect("hub"),
        m1.expect("m1"),
        m2.expect("m2"),
        m3.expect("m3"),
    );
    hub_cp.create_namespace("fleet").await.expect("namespace");
    let hub = hub_cp.client().await.expect("client");
    join(&hub, "m1", &m1).await;
    join(&hub, "m2", &m2).await;

    let mut example = Command::new(BINARY)
        .args(["--namespace", "fleet"])
        .args(["--health-address", "127.0.0.1:0"])
        .env("KUBECONFIG", hub_cp.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example");

    let configmaps = Api::<ConfigMap>::namespaced(hub.clone(), "default");
    let mut source = ConfigMap::default();
    source.metadata.name = Some("shared".into());
    source.metadata.labels = Some([(LABEL.to_string(), "true".to_string())].into());
    source.data = data("1");
    configmaps
        .create(&PostParams::default(), &source)
        .await
        .expect("hub object");

    until_copy(&m1, "shared", Some("1"), "the copy in m1").await;
    until_copy(&m2, "shared", Some("1"), "the copy in m2").await;
    until_counted(&hub, (2, 2), "the hub object to show two members in sync").await;
    let finalizers = hub_object(&hub).await.and_then(|o| o.metadata.finalizers);
    assert_eq!(
        finalizers,
        Some(vec![
            "propagation.mcr.sigs.k8s.io/fleet-propagation".to_string()
        ])
    );

    configmaps
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
        )
        .await
        .expect("update");
    until_copy(&m1, "shared", Some("2"), "m1's copy to follow").await;
    until_copy(&m2, "shared", Some("2"), "m2's copy to follow").await;

    // A member joins: it gets the copy without any change on the hub.
    join(&hub, "m3", &m3).await;
    until_copy(&m3, "shared", Some("2"), "the copy in m3").await;
    until_counted(&hub, (3, 3), "the hub object to show three members in sync").await;

    // A member leaves (its Secret is deleted): it is no longer counted.
    Api::<Secret>::namespaced(hub.clone(), "fleet")
        .delete("m2", &DeleteParams::default())
        .await
        .expect("delete Secret");
    until_counted(&hub, (2, 2), "the hub object to show two members again").await;

    // No longer labelled: its copies go and its finalizer is let go while
    // it lives.
    let mut other = source.clone();
    other.metadata.name = Some("unlabelled-later".into());
    configmaps
        .create(&PostParams::default(), &other)
        .await
        .expect("second hub object");
    let in_m3 = Api::<ConfigMap>::namespaced(m3.client().await.expect("client"), "default");
    until(
        &in_m3,
        "unlabelled-later",
        "the second object's copy in m3",
        |copy| copy.is_some(),
    )
    .await;
    configmaps
        .patch(
            "unlabelled-later",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {LABEL: null}}})),
        )
        .await
        .expect("unlabel");
    until_copy(&m1, "unlabelled-later", None, "its copy in m1 gone").await;
    until_copy(&m3, "unlabelled-later", None, "its copy in m3 gone").await;
    until(
        &configmaps,
        "unlabelled-later",
        "its finalizer released",
        |object| {
            object.is_some_and(|object| {
                object
                    .metadata
                    .finalizers
                    .as_ref()
                    .is_none_or(Vec::is_empty)
            })
        },
    )
    .await;

    // Deleted on the hub: the finalizer holds it until every member's copy
    // is gone.
    configmaps
        .delete("shared", &DeleteParams::default())
        .await
        .expect("delete");
    until_copy(&m1, "shared", None, "m1's copy to go").await;
    until_copy(&m3, "shared", None, "m3's copy to go").await;
    until(
        &configmaps,
        "shared",
        "then the hub object to go",
        |object| object.is_none(),
    )
    .await;
    assert!(
        example.try_wait().expect("status").is_none(),
        "the example is still running"
    );
    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}
