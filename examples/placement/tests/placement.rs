//! The example binary against a real hub (upstream's ClusterProfile and
//! PlacementDecision CRDs) and two workload clusters: the copy follows the
//! decision from one cluster to the other, and the hub object reports it.

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
use multicluster_provider_cluster_inventory_api::placement::{PLACEMENT_KEY_LABEL, Placements};
use multicluster_provider_cluster_inventory_api::{CONSUMER_LABEL, PROFILE_LABEL, SECRET_KEY};
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

async fn report(hub: &kube::Client) -> Option<String> {
    Api::<ConfigMap>::namespaced(hub.clone(), NS)
        .get("settings")
        .await
        .expect("hub object")
        .metadata
        .annotations?
        .remove("fleet.example/placement-status")
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
    let slices = Api::<DynamicObject>::namespaced_with(hub.clone(), NS, &Placements::resource());
    let mut slice = DynamicObject::new("settings-0", &Placements::resource()).within(NS);
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

    eventually("the copy in east, reported in sync", || async {
        copy_of(&east_client).await.as_deref() == Some("blue")
            && report(&hub).await.as_deref() == Some(r#"{"inventory/east":"in-sync"}"#)
    })
    .await;
    assert_eq!(copy_of(&west_client).await, None, "west was not chosen");

    // The decision moves to west: the copy follows, and the report.
    slices
        .patch(
            "settings-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"decisions": [{"clusterProfileRef": {"name": "west"}}]})),
        )
        .await
        .expect("move");
    eventually("the copy moved to west, reported in sync", || async {
        copy_of(&west_client).await.as_deref() == Some("blue")
            && copy_of(&east_client).await.is_none()
            && report(&hub).await.as_deref() == Some(r#"{"inventory/west":"in-sync"}"#)
    })
    .await;

    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}
