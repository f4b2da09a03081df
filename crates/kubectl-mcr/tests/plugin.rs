//! The plugin, run as a binary against a real hub, drives a staged
//! rollout that a propagation runs (in this process, on two members that
//! are kubeconfig Secrets on the hub): `rollout status` waits and says
//! why, `approve` lets the main stage go, `pause` holds a new revision
//! back and `resume` lets it go, `history` lists the kept revisions,
//! `undo` rolls the members back and `undo --cancel` forward again,
//! `members` tables them; `cordon` keeps a member's objects out of a new
//! revision, `drain` removes them and `uncordon` brings it back up to
//! date. Its mistakes are said by name.

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::{Expression, Selector};
use kube::{CustomResource, CustomResourceExt};
use multicluster_envtest::ControlPlane;
use multicluster_propagation::{
    Desired, MAINTENANCE_LABEL, MaxUnavailable, Propagation, PropagationStatus, Rollout, Stage,
};
use multicluster_provider_kubeconfig::{KubeconfigOptions, KubeconfigProvider};
use multicluster_runtime::testing::{object_holds_throughout, run_manager, wait_for_object};
use multicluster_runtime::{Cluster, Manager};
use serde::{Deserialize, Serialize};
use serde_json::json;

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-mcr");

/// A value for every member, rolled out canary first, then the main ring
/// once approved.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, schemars::JsonSchema)]
#[kube(
    group = "plugin.example",
    version = "v1alpha1",
    kind = "FleetValue",
    namespaced,
    status = "PropagationStatus",
    shortname = "fv"
)]
struct FleetValueSpec {
    value: String,
}

const RING: &str = "plugin.example/ring";

fn ring(name: &str) -> Selector {
    Expression::Equal(RING.into(), name.into()).into()
}

/// The plugin's answer to `args`, against the hub.
async fn plugin(hub: &ControlPlane, args: &[&str]) -> Output {
    let output = tokio::process::Command::new(PLUGIN)
        .arg("--kubeconfig")
        .arg(hub.kubeconfig_path())
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .unwrap_or_else(|_| panic!("kubectl-mcr {args:?} did not end"))
        .expect("run kubectl-mcr")
}

/// Runs the plugin, asserting it succeeds; its standard output.
async fn ok(hub: &ControlPlane, args: &[&str]) -> String {
    let output = plugin(hub, args).await;
    let (out, err) = texts(&output);
    assert!(
        output.status.success(),
        "kubectl-mcr {args:?}: {err}\n{out}"
    );
    out
}

/// Runs the plugin, asserting it fails; its standard output and error.
async fn fails(hub: &ControlPlane, args: &[&str]) -> (String, String) {
    let output = plugin(hub, args).await;
    let (out, err) = texts(&output);
    assert_eq!(
        output.status.code(),
        Some(1),
        "kubectl-mcr {args:?}: {err}\n{out}"
    );
    (out, err)
}

fn texts(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Waits until `member`'s ConfigMap holds `value` (`None`: is gone).
async fn until_value(member: &ControlPlane, value: Option<&str>) {
    let api = Api::<ConfigMap>::namespaced(member.client().await.expect("client"), "default");
    wait_for_object(
        &api,
        "settings",
        &format!("settings = {value:?}"),
        |object| value_of(object) == value,
    )
    .await;
}

fn value_of(object: Option<&ConfigMap>) -> Option<&str> {
    object?.data.as_ref()?.get("value").map(String::as_str)
}

async fn set_value(hub: &kube::Client, value: &str) {
    Api::<FleetValue>::namespaced(hub.clone(), "default")
        .patch(
            "web",
            &PatchParams::apply("plugin-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "plugin.example/v1alpha1", "kind": "FleetValue",
                "metadata": {"name": "web"}, "spec": {"value": value},
            })),
        )
        .await
        .expect("hub object");
}

/// Waits until the hub object's rollout is at `revision` and says it
/// waits for `waiting`.
async fn until_waiting(hub: &kube::Client, revision: &str, waiting: &str) {
    let api = Api::<FleetValue>::namespaced(hub.clone(), "default");
    wait_for_object(
        &api,
        "web",
        &format!("revision {revision} waiting for {waiting}"),
        |object| {
            object
                .and_then(|object| object.status.as_ref()?.rollout.as_ref())
                .is_some_and(|rollout| {
                    rollout.revision == revision
                        && rollout
                            .waiting
                            .as_deref()
                            .is_some_and(|why| why.contains(waiting))
                })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_drives_a_rollout_and_takes_a_member_out_and_back() {
    let (hub_cp, east, west) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub_cp, east, west) = (
        hub_cp.expect("hub"),
        east.expect("east"),
        west.expect("west"),
    );
    let hub = hub_cp.client().await.expect("client");
    hub_cp.create_namespace("fleet").await.expect("namespace");
    hub_cp
        .install_crds(&serde_json::to_string(&FleetValue::crd()).expect("crd"))
        .await
        .expect("crd");
    for (name, member, ring) in [("east", &east, "canary"), ("west", &west, "main")] {
        let mut secret = multicluster_example_testing::kubeconfig_secret(name, member.kubeconfig());
        secret.metadata.namespace = Some("fleet".into());
        secret
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(RING.into(), ring.into());
        Api::<Secret>::namespaced(hub.clone(), "fleet")
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret");
    }
    let provider = Arc::new(KubeconfigProvider::new(
        hub.clone(),
        KubeconfigOptions::default().namespace("fleet".to_string()),
    ));
    let manager = Manager::builder(Cluster::local(hub.clone()))
        .provider(provider)
        .build();
    let propagation = Propagation::<FleetValue>::new("values")
        .propagates::<ConfigMap>()
        .desired(|hub, _member| {
            let settings = ConfigMap {
                metadata: ObjectMeta {
                    name: Some("settings".into()),
                    namespace: Some("default".into()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([("value".into(), hub.spec.value.clone())])),
                ..ConfigMap::default()
            };
            Ok(vec![Desired::new(&settings)?])
        })
        .rollout(Rollout::staged(
            [
                Stage::labelled("canary", ring("canary")),
                Stage::labelled("main", ring("main")).needs_approval(),
            ],
            MaxUnavailable::Count(1),
        ))
        .status_subresource();
    manager
        .add_controller(propagation.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);
    let fv = "fleetvalue/web";

    // The canary takes revision 1; the main ring waits for its approval,
    // and `rollout status` says so until its timeout.
    Api::<FleetValue>::namespaced(hub.clone(), "default")
        .create(
            &PostParams::default(),
            &FleetValue::new(
                "web",
                FleetValueSpec {
                    value: "one".into(),
                },
            ),
        )
        .await
        .expect("hub object");
    until_value(&east, Some("one")).await;
    until_waiting(&hub, "1", "approval").await;
    let (out, err) = fails(&hub_cp, &["rollout", "status", fv, "--timeout", "1s"]).await;
    assert!(out.contains("main") && out.contains("approval"), "{out}");
    assert!(err.contains("timed out waiting for the condition"), "{err}");
    assert_eq!(
        value_of(
            Api::<ConfigMap>::namespaced(west.client().await.expect("client"), "default")
                .get_opt("settings")
                .await
                .expect("get")
                .as_ref()
        ),
        None,
        "the main ring changed before its approval"
    );
    // Short name, resource and kind name the same type.
    let out = ok(&hub_cp, &["rollout", "approve", "fv/web", "main"]).await;
    assert!(out.contains("approved for revision 1"), "{out}");
    let out = ok(
        &hub_cp,
        &["rollout", "status", "fleetvalues/web", "--timeout", "60s"],
    )
    .await;
    assert!(
        out.contains("revision 1 successfully rolled out to all 2 members"),
        "{out}"
    );
    until_value(&west, Some("one")).await;

    // Paused, revision 2 reaches no member; resumed, the canary takes it.
    assert!(
        ok(&hub_cp, &["rollout", "pause", fv])
            .await
            .contains("paused")
    );
    let (_, err) = fails(&hub_cp, &["rollout", "pause", fv]).await;
    assert!(err.contains("already paused"), "{err}");
    set_value(&hub, "two").await;
    until_waiting(&hub, "2", "paused").await;
    let east_settings =
        Api::<ConfigMap>::namespaced(east.client().await.expect("client"), "default");
    object_holds_throughout(
        &east_settings,
        "settings",
        Duration::from_secs(2),
        "paused: east keeps one",
        |object| value_of(object) == Some("one"),
    )
    .await;
    ok(&hub_cp, &["rollout", "resume", fv]).await;
    until_value(&east, Some("two")).await;
    until_waiting(&hub, "2", "approval").await;
    ok(&hub_cp, &["rollout", "approve", fv, "main"]).await;
    ok(&hub_cp, &["rollout", "status", fv, "--timeout", "60s"]).await;
    until_value(&west, Some("two")).await;

    // Both revisions are kept; undo goes back to the one before.
    let history = ok(&hub_cp, &["rollout", "history", fv]).await;
    let rows: Vec<&str> = history.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{history}");
    assert!(
        rows[0].starts_with("1 ") && rows[1].starts_with("2 "),
        "{history}"
    );
    assert!(
        rows[1].contains("the object's own") && rows[1].contains("values"),
        "{history}"
    );
    let kept = ok(&hub_cp, &["rollout", "history", fv, "--revision", "1"]).await;
    assert!(kept.contains("\"one\""), "{kept}");
    let (_, err) = fails(&hub_cp, &["rollout", "undo", fv, "--to-revision", "9"]).await;
    assert!(err.contains("revision 9 is not kept (kept: 1, 2)"), "{err}");
    let out = ok(&hub_cp, &["rollout", "undo", fv]).await;
    assert!(out.contains("rolling back to revision 1"), "{out}");
    let out = ok(&hub_cp, &["rollout", "status", fv, "--timeout", "60s"]).await;
    assert!(out.contains("rolled back to revision 1 (from 2)"), "{out}");
    until_value(&east, Some("one")).await;
    until_value(&west, Some("one")).await;
    let members = ok(&hub_cp, &["members", fv]).await;
    let lines: Vec<Vec<&str>> = members
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["CLUSTER", "STATE", "REVISION", "SLOT", "REASON"],
        "{members}"
    );
    assert_eq!(
        lines[1..],
        [vec!["east", "InSync", "1"], vec!["west", "InSync", "1"]],
        "{members}"
    );
    ok(&hub_cp, &["rollout", "undo", fv, "--cancel"]).await;
    let out = ok(&hub_cp, &["rollout", "status", fv, "--timeout", "60s"]).await;
    assert!(out.contains("revision 2 successfully rolled out"), "{out}");
    until_value(&east, Some("two")).await;

    // Cordoned, east keeps two while the main ring takes three; drained,
    // it loses its objects; uncordoned, it catches up.
    let out = ok(&hub_cp, &["cordon", "secret/east", "-n", "fleet"]).await;
    assert!(out.contains("secret/east cordoned"), "{out}");
    let labels = Api::<Secret>::namespaced(hub.clone(), "fleet")
        .get("east")
        .await
        .expect("secret")
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels.get(MAINTENANCE_LABEL).map(String::as_str),
        Some("cordon")
    );
    set_value(&hub, "three").await;
    until_waiting(&hub, "3", "approval").await;
    ok(&hub_cp, &["rollout", "approve", fv, "main"]).await;
    until_value(&west, Some("three")).await;
    assert_eq!(
        value_of(
            east_settings
                .get_opt("settings")
                .await
                .expect("get")
                .as_ref()
        ),
        Some("two"),
        "east changed while cordoned"
    );
    wait_for_object(
        &Api::<FleetValue>::namespaced(hub.clone(), "default"),
        "web",
        "east shown cordoned",
        |object| {
            object
                .and_then(|object| object.status.as_ref())
                .is_some_and(|status| {
                    status.members.iter().any(|member| {
                        member.cluster == "east"
                            && member
                                .reason
                                .as_deref()
                                .is_some_and(|reason| reason.contains(MAINTENANCE_LABEL))
                    })
                })
        },
    )
    .await;
    let members = ok(&hub_cp, &["members", fv]).await;
    assert!(
        members
            .lines()
            .any(|line| line.starts_with("east") && line.contains(MAINTENANCE_LABEL)),
        "{members}"
    );
    ok(&hub_cp, &["drain", "secret/east", "-n", "fleet"]).await;
    until_value(&east, None).await;
    ok(&hub_cp, &["uncordon", "secret/east", "-n", "fleet"]).await;
    until_value(&east, Some("three")).await;
    let out = ok(&hub_cp, &["rollout", "status", fv, "--timeout", "60s"]).await;
    assert!(out.contains("revision 3 successfully rolled out"), "{out}");

    // Mistakes, by name.
    let (_, err) = fails(&hub_cp, &["rollout", "status", "widgets/web"]).await;
    assert!(err.contains("no resource type \"widgets\""), "{err}");
    let (_, err) = fails(&hub_cp, &["rollout", "status", "fleetvalue/nothing"]).await;
    assert!(err.contains("fleetvalue/nothing not found"), "{err}");
    let (_, err) = fails(&hub_cp, &["rollout", "resume", fv]).await;
    assert!(err.contains("is not paused"), "{err}");

    stop.cancel();
    task.await.expect("join").expect("manager");
}
