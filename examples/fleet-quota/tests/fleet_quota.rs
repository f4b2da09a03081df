//! The example binary on a hub and two members (kubeconfig Secrets): it
//! installs its CRD, a FleetQuota becomes a ResourceQuota in each member,
//! and its status subresource shows each member: `InSync` with the
//! generation applied, or `Failed` with the member's 403 while that
//! member's identity may only read quotas, then `InSync` once it may write
//! them. Deleting the FleetQuota removes every quota first.

use multicluster_runtime::testing::Polled;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ResourceQuota, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::{GRACE, kubeconfig_secret, terminate};
use multicluster_runtime::testing::eventually;
use serde_json::{Value, json};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-fleet-quota");

fn fleet_quotas() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "fleet.example",
        "v1alpha1",
        "FleetQuota",
    ))
}

fn quota_rules(verbs: &[&str]) -> Vec<PolicyRule> {
    vec![PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["resourcequotas".into()]),
        verbs: verbs.iter().map(|verb| verb.to_string()).collect(),
        ..PolicyRule::default()
    }]
}

async fn pods_in(member: &ControlPlane) -> Option<String> {
    Api::<ResourceQuota>::namespaced(member.client().await.expect("client"), "default")
        .get_opt("team")
        .await
        .expect("get")
        .and_then(|quota| quota.spec?.hard?.get("pods").map(|pods| pods.0.clone()))
}

/// The FleetQuota's status, if it exists.
async fn status(hub: &kube::Client) -> Option<Value> {
    Api::<DynamicObject>::namespaced_with(hub.clone(), "default", &fleet_quotas())
        .get_opt("team")
        .await
        .ok()
        .flatten()
        .map(|object| object.data["status"].clone())
}

/// `member: state` for each member in `status`, with the reason of any
/// that is not in sync.
fn members(status: &Value) -> Vec<(String, String, String)> {
    status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|member| {
            (
                member["cluster"].as_str().unwrap_or_default().to_string(),
                member["state"].as_str().unwrap_or_default().to_string(),
                member["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_quota_is_in_every_member_and_its_status_says_how_each_is_doing() {
    let (hub_cp, a, b) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub_cp, a, b) = (hub_cp.expect("hub"), a.expect("a"), b.expect("b"));
    hub_cp.create_namespace("fleet").await.expect("namespace");
    let hub = hub_cp.client().await.expect("client");
    // b's identity may read quotas everywhere, and not write them.
    b.grant_service_account_cluster_wide(
        "default",
        "robot",
        quota_rules(&["get", "list", "watch"]),
    )
    .await
    .expect("grant");
    let robot = b
        .service_account_kubeconfig("default", "robot", Duration::from_secs(3600))
        .await
        .expect("kubeconfig");
    for (name, kubeconfig) in [("a", a.kubeconfig().clone()), ("b", robot)] {
        Api::<Secret>::namespaced(hub.clone(), "fleet")
            .create(
                &PostParams::default(),
                &kubeconfig_secret(name, &kubeconfig),
            )
            .await
            .expect("member Secret");
    }

    let mut example = Command::new(BINARY)
        .args(["--namespace", "fleet", "--health-address", "127.0.0.1:0"])
        .env("KUBECONFIG", hub_cp.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example");

    let quotas = Api::<DynamicObject>::namespaced_with(hub.clone(), "default", &fleet_quotas());
    let mut quota = DynamicObject::new("team", &fleet_quotas()).within("default");
    quota.data = json!({"spec": {"hard": {"pods": "4"}}});
    eventually(
        Polled::ApiServer,
        "the example to install its CRD, and the FleetQuota made",
        || async { quotas.create(&PostParams::default(), &quota).await.is_ok() },
    )
    .await;

    eventually(
        Polled::ApiServer,
        "a in sync, b failed with its 403",
        || async {
            let Some(status) = status(&hub).await else {
                return false;
            };
            let members = members(&status);
            pods_in(&a).await.as_deref() == Some("4")
                && members.len() == 2
                && members[0].0 == "a"
                && members[0].1 == "InSync"
                && status["members"][0]["appliedGeneration"] == 1
                && members[1].0 == "b"
                && members[1].1 == "Failed"
                && members[1].2.contains("403")
                && status["conditions"][0]["type"] == "Propagated"
                && status["conditions"][0]["status"] == "False"
                && status["conditions"][0]["reason"] == "Failed"
        },
    )
    .await;

    Api::<ClusterRole>::all(b.client().await.expect("client"))
        .patch(
            "default-robot",
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": quota_rules(&["get", "list", "watch", "create", "patch", "delete"])})),
        )
        .await
        .expect("allow b to write");
    eventually(
        Polled::ApiServer,
        "b in sync too, and the condition true",
        || async {
            let Some(status) = status(&hub).await else {
                return false;
            };
            pods_in(&b).await.as_deref() == Some("4")
                && members(&status)
                    .iter()
                    .all(|(_, state, _)| state == "InSync")
                && status["conditions"][0]["status"] == "True"
        },
    )
    .await;

    quotas
        .delete("team", &DeleteParams::default())
        .await
        .expect("delete");
    eventually(
        Polled::ApiServer,
        "every quota and then the FleetQuota gone",
        || async {
            pods_in(&a).await.is_none()
                && pods_in(&b).await.is_none()
                && quotas.get_opt("team").await.expect("get").is_none()
        },
    )
    .await;
    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}
