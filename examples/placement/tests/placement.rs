//! The example binary against a real hub (upstream's ClusterProfile and
//! PlacementDecision CRDs) and two workload clusters: the copy follows the
//! decision, a cluster moved from one slice to another keeps its copy (the
//! same object), and the hub object reports each chosen cluster.

use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::{GRACE, terminate};
use multicluster_provider_cluster_inventory_api::placement::PLACEMENT_KEY_LABEL;
use multicluster_provider_cluster_inventory_api::{
    ApiVersion, CONSUMER_LABEL, PROFILE_LABEL, SECRET_KEY,
};
use multicluster_runtime::testing::eventually;
use serde_json::json;
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-placement");
const NS: &str = "inventory";

/// A ready ClusterProfile `name` whose consumer `me` reaches `workload`
/// through a Secret.
async fn enrol(hub: &kube::Client, name: &str, workload: &ControlPlane) {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
    ));
    let profiles: Api<DynamicObject> = Api::namespaced_with(hub.clone(), NS, &resource);
    let mut profile = DynamicObject::new(name, &resource).within(NS);
    profile.data = json!({"spec": {"displayName": name, "clusterManager": {"name": "test"}}});
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .expect("profile");
    let status = json!({"status": {"conditions": [{
        "type": "ControlPlaneHealthy", "status": "True", "reason": "Test",
        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}});
    profiles
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("status");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{name}-creds")),
            labels: Some(BTreeMap::from([
                (CONSUMER_LABEL.to_string(), "me".to_string()),
                (PROFILE_LABEL.to_string(), name.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_string(),
            ByteString(
                multicluster_envtest::to_yaml(workload.kubeconfig())
                    .expect("yaml")
                    .into_bytes(),
            ),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(hub.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
}

async fn copy_of(workload: &kube::Client) -> Option<String> {
    Api::<ConfigMap>::namespaced(workload.clone(), NS)
        .get_opt("settings")
        .await
        .expect("get")
        .and_then(|copy| copy.data?.remove("colour"))
}

/// Each chosen cluster's state, as the hub object's status annotation
/// says.
async fn report(hub: &kube::Client) -> BTreeMap<String, String> {
    let text = Api::<ConfigMap>::namespaced(hub.clone(), NS)
        .get("settings")
        .await
        .expect("hub object")
        .metadata
        .annotations
        .and_then(|mut annotations| annotations.remove("fleet.example/placement-status"));
    let Some(text) = text else {
        return BTreeMap::new();
    };
    let status: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|member| {
            (
                member["cluster"].as_str().unwrap_or_default().to_string(),
                member["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn states(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(cluster, state)| (cluster.to_string(), state.to_string()))
        .collect()
}

async fn uid_of_copy(workload: &kube::Client) -> Option<String> {
    Api::<ConfigMap>::namespaced(workload.clone(), NS)
        .get_opt("settings")
        .await
        .expect("get")
        .and_then(|copy| copy.metadata.uid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_copy_follows_the_placement_decision() {
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
    for crd in [
        multicluster_envtest::upstream::cluster_profile_crd().await,
        multicluster_envtest::upstream::placement_decision_crd().await,
    ] {
        hub_cp
            .install_crds(&crd.expect("upstream CRD"))
            .await
            .expect("CRD");
    }
    let hub = hub_cp.client().await.expect("hub client");
    hub_cp.create_namespace(NS).await.expect("namespace");
    let (east_client, west_client) = (
        east.client().await.expect("east client"),
        west.client().await.expect("west client"),
    );
    for (name, workload) in [("east", &east), ("west", &west)] {
        workload.create_namespace(NS).await.expect("namespace");
        enrol(&hub, name, workload).await;
    }
    // The scheduler's decision for placement "settings": east.
    // Written through v1alpha2, as a current scheduler writes them.
    let decisions = ApiVersion::V1Alpha2.resource("PlacementDecision");
    let slices = Api::<DynamicObject>::namespaced_with(hub.clone(), NS, &decisions);
    let mut slice = DynamicObject::new("settings-0", &decisions).within(NS);
    slice.metadata.labels = Some(BTreeMap::from([(
        PLACEMENT_KEY_LABEL.to_string(),
        "settings".to_string(),
    )]));
    slice.data = json!({"decisions": [{"clusterProfileRef": {"name": "east"}}]});
    slices
        .create(&PostParams::default(), &slice)
        .await
        .expect("slice");
    let mut source = ConfigMap::default();
    source.metadata.name = Some("settings".into());
    source.metadata.annotations = Some(BTreeMap::from([(
        "fleet.example/placement".to_string(),
        "settings".to_string(),
    )]));
    source.data = Some(BTreeMap::from([("colour".to_string(), "blue".to_string())]));
    Api::<ConfigMap>::namespaced(hub.clone(), NS)
        .create(&PostParams::default(), &source)
        .await
        .expect("hub object");

    let mut example = Command::new(BINARY)
        .args([
            "--consumer",
            "me",
            "--namespace",
            NS,
            "--health-address",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", hub_cp.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example");

    eventually(
        Polled::ApiServer,
        "the copy in east, reported in sync",
        || async {
            copy_of(&east_client).await.as_deref() == Some("blue")
                && report(&hub).await == states(&[("inventory/east", "InSync")])
        },
    )
    .await;
    assert_eq!(copy_of(&west_client).await, None, "west was not chosen");
    let east_copy = uid_of_copy(&east_client).await.expect("east's copy");

    // The scheduler rebalances: east moves from slice 0 to a new slice 1,
    // west takes its place in slice 0. For a moment east is in no slice.
    slices
        .patch(
            "settings-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"decisions": [{"clusterProfileRef": {"name": "west"}}]})),
        )
        .await
        .expect("west into slice 0");
    let mut second = DynamicObject::new("settings-1", &decisions).within(NS);
    second.metadata.labels = slice.metadata.labels.clone();
    second.data = json!({"decisions": [{"clusterProfileRef": {"name": "east"}}]});
    slices
        .create(&PostParams::default(), &second)
        .await
        .expect("east into slice 1");
    eventually(
        Polled::ApiServer,
        "both copies, reported in sync",
        || async {
            copy_of(&west_client).await.as_deref() == Some("blue")
                && report(&hub).await
                    == states(&[("inventory/east", "InSync"), ("inventory/west", "InSync")])
        },
    )
    .await;

    // West leaves the decision: its copy goes once the grace has passed,
    // which had passed for east's moment out too.
    slices
        .patch(
            "settings-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"decisions": []})),
        )
        .await
        .expect("west out");
    eventually(
        Polled::ApiServer,
        "west's copy gone, east alone reported",
        || async {
            copy_of(&west_client).await.is_none()
                && report(&hub).await == states(&[("inventory/east", "InSync")])
        },
    )
    .await;
    assert_eq!(
        uid_of_copy(&east_client).await,
        Some(east_copy),
        "east's copy is the one made first: the move deleted nothing"
    );

    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}
