//! Set-up shared by the ClusterProfile tests: a hub with the CRD, profiles
//! and their status, workload control planes.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::config::Kubeconfig;
use multicluster_envtest::ControlPlane;
use multicluster_provider_cluster_inventory_api::{
    CLUSTER_ID_PROPERTY, CONSUMER_LABEL, PROFILE_LABEL, SECRET_KEY,
};

use multicluster_provider_cluster_inventory_api::ClusterProfileProvider;
use multicluster_runtime::controller::Request;
use multicluster_runtime::testing::{Recorder, recording_manager};
use multicluster_runtime::{Cluster, Manager, ManagerOptions};

/// The hub namespace the profiles live in.
pub(crate) const NS: &str = "inventory";

/// A hub control plane with the ClusterProfile CRD (upstream's, as its main
/// branch serves it: v1alpha2 beside the released v1alpha1) and namespace
/// [`NS`].
pub(crate) async fn hub(cp: &ControlPlane) -> kube::Client {
    let crd = multicluster_envtest::upstream::cluster_profile_crd()
        .await
        .expect("upstream CRD");
    hub_with(cp, &crd).await
}

/// A hub control plane with the released ClusterProfile CRD (v1alpha1
/// only, as the module v0.1.3 publishes it) and namespace [`NS`]: where
/// the fields v1alpha2 dropped still exist.
pub(crate) async fn released_hub(cp: &ControlPlane) -> kube::Client {
    let crd = multicluster_envtest::upstream::released_cluster_profile_crd()
        .await
        .expect("upstream CRD");
    hub_with(cp, &crd).await
}

async fn hub_with(cp: &ControlPlane, crd: &str) -> kube::Client {
    cp.install_crds(crd).await.expect("CRD");
    cp.create_namespace(NS).await.expect("namespace");
    cp.client().await.expect("client")
}

pub(crate) fn profiles(hub: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
    ));
    Api::namespaced_with(hub.clone(), NS, &resource)
}

pub(crate) async fn create_profile(hub: &kube::Client, name: &str) {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
    ));
    let mut profile = DynamicObject::new(name, &resource).within(NS);
    profile.data =
        serde_json::json!({"spec": {"displayName": name, "clusterManager": {"name": "test"}}});
    profiles(hub)
        .create(&PostParams::default(), &profile)
        .await
        .expect("profile");
}

/// Merges `status` into the profile's status.
pub(crate) async fn set_status(hub: &kube::Client, name: &str, status: serde_json::Value) {
    profiles(hub)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .expect("status");
}

/// The `ControlPlaneHealthy` condition as a status fragment.
pub(crate) fn health(healthy: bool) -> serde_json::Value {
    serde_json::json!({"conditions": [{
        "type": "ControlPlaneHealthy",
        "status": if healthy { "True" } else { "False" },
        "reason": "Test",
        "message": "set by the test",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]})
}

pub(crate) async fn set_health(
    hub: &kube::Client,
    name: &str,
    healthy: bool,
    cluster_id: Option<&str>,
) {
    let mut status = health(healthy);
    if let Some(id) = cluster_id {
        status["properties"] = serde_json::json!([{"name": CLUSTER_ID_PROPERTY, "value": id}]);
    }
    set_status(hub, name, status).await;
}

/// A workload control plane holding ConfigMap `object` in `default`.
pub(crate) async fn workload(object: &str) -> ControlPlane {
    let cp = ControlPlane::start().await.expect("workload");
    cp.create_config_map(object, &[]).await.expect("object");
    cp
}

pub(crate) fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

/// A manager over `provider`'s fleet with a controller recording every
/// ConfigMap reconcile.
pub(crate) fn manager(
    hub: &kube::Client,
    provider: &Arc<ClusterProfileProvider>,
    options: ManagerOptions,
) -> (Manager, Recorder) {
    recording_manager(Cluster::new("hub", hub.clone()), provider.clone(), options)
}

/// The Secret `name` holding `kubeconfig` for `consumer` of `profile`.
pub(crate) fn credentials_secret(
    name: &str,
    profile: &str,
    consumer: &str,
    kubeconfig: &Kubeconfig,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                (CONSUMER_LABEL.to_string(), consumer.to_string()),
                (PROFILE_LABEL.to_string(), profile.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_string(),
            ByteString(
                multicluster_envtest::to_yaml(kubeconfig)
                    .expect("yaml")
                    .into_bytes(),
            ),
        )])),
        ..Secret::default()
    }
}

/// Base64 of `pem`, as a kubeconfig's `certificate-authority-data`.
pub(crate) fn base64_pem(pem: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(pem)
}

/// A state directory whose plugin hands out a token of a cluster-admin
/// service account `name` of `cluster`.
pub(crate) async fn state_with_token(cluster: &ControlPlane, name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("state dir");
    multicluster_envtest::plugins::set_token(dir.path(), &admin_token(cluster, name).await)
        .expect("token");
    dir
}

pub(crate) async fn admin_token(cluster: &ControlPlane, name: &str) -> String {
    cluster
        .cluster_admin_token("robots", name)
        .await
        .expect("token")
}

/// One recorded `token.sh` call, field by field.
pub(crate) fn call_field<'a>(call: &'a str, field: &str) -> &'a str {
    call.split('\t')
        .find_map(|part| part.strip_prefix(&format!("{field}=")))
        .unwrap_or_else(|| panic!("no {field} in {call}"))
}
