//! The example binary on a hub and three member control planes, members
//! joining and leaving through kubeconfig Secrets: a labelled hub
//! ConfigMap is copied into every member, follows updates, reaches a member
//! that joins later, is reported on the hub object member by member as
//! members come and go, and is removed from every member when deleted on
//! the hub (whose finalizer then lets it go) or no longer labelled (the
//! finalizer is let go at once).

use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::{GRACE, kubeconfig_secret, terminate};
use multicluster_runtime::testing::eventually;
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

async fn copy_of(member: &ControlPlane) -> Option<BTreeMap<String, String>> {
    copy_named(member, "shared").await
}

async fn copy_named(member: &ControlPlane, name: &str) -> Option<BTreeMap<String, String>> {
    Api::<ConfigMap>::namespaced(member.client().await.ok()?, "default")
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .map(|copy| copy.data.unwrap_or_default())
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
async fn counted(hub: &kube::Client) -> Option<(usize, usize)> {
    let text = hub_object(hub)
        .await?
        .metadata
        .annotations?
        .get(STATUS)
        .cloned()?;
    let status: serde_json::Value = serde_json::from_str(&text).ok()?;
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

    eventually(Polled::ApiServer, "copies in m1 and m2", || async {
        copy_of(&m1).await == data("1") && copy_of(&m2).await == data("1")
    })
    .await;
    eventually(
        Polled::ApiServer,
        "the hub object to show two members in sync",
        || async { counted(&hub).await == Some((2, 2)) },
    )
    .await;
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
    eventually(Polled::ApiServer, "the copies to follow", || async {
        copy_of(&m1).await == data("2") && copy_of(&m2).await == data("2")
    })
    .await;

    // A member joins: it gets the copy without any change on the hub.
    join(&hub, "m3", &m3).await;
    eventually(Polled::ApiServer, "the copy in m3", || async {
        copy_of(&m3).await == data("2")
    })
    .await;
    eventually(
        Polled::ApiServer,
        "the hub object to show three members in sync",
        || async { counted(&hub).await == Some((3, 3)) },
    )
    .await;

    // A member leaves (its Secret is deleted): it is no longer counted.
    Api::<Secret>::namespaced(hub.clone(), "fleet")
        .delete("m2", &DeleteParams::default())
        .await
        .expect("delete Secret");
    eventually(
        Polled::ApiServer,
        "the hub object to show two members again",
        || async { counted(&hub).await == Some((2, 2)) },
    )
    .await;

    // No longer labelled: its copies go and its finalizer is let go while
    // it lives.
    let mut other = source.clone();
    other.metadata.name = Some("unlabelled-later".into());
    configmaps
        .create(&PostParams::default(), &other)
        .await
        .expect("second hub object");
    eventually(
        Polled::ApiServer,
        "the second object's copy in m3",
        || async { copy_named(&m3, "unlabelled-later").await.is_some() },
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
    eventually(
        Polled::ApiServer,
        "its copies gone and its finalizer released",
        || async {
            copy_named(&m1, "unlabelled-later").await.is_none()
                && copy_named(&m3, "unlabelled-later").await.is_none()
                && configmaps
                    .get_opt("unlabelled-later")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|o| o.metadata.finalizers.unwrap_or_default().is_empty())
        },
    )
    .await;

    // Deleted on the hub: the finalizer holds it until every member's copy
    // is gone.
    configmaps
        .delete("shared", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(
        Polled::ApiServer,
        "the copies and then the hub object to go",
        || async {
            copy_of(&m1).await.is_none()
                && copy_of(&m3).await.is_none()
                && hub_object(&hub).await.is_none()
        },
    )
    .await;
    assert!(
        example.try_wait().expect("status").is_none(),
        "the example is still running"
    );
    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}
