//! What the example's tests share: Cluster API's Cluster CRD and ready
//! Clusters with their kubeconfig Secrets.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use multicluster_provider_cluster_api::CLUSTER_NAME_LABEL;

/// Installs Cluster API's Cluster CRD (upstream's, from the Go module
/// proxy) in `management`.
pub async fn install_crd(management: &multicluster_envtest::ControlPlane) {
    let crd = multicluster_envtest::upstream::cluster_api_cluster_crd()
        .await
        .expect("upstream CRD");
    management.install_crds(&crd).await.expect("CRD");
}

/// A ready v1beta2 Cluster `name` in `namespace`, with `labels`, whose
/// kubeconfig Secret holds `kubeconfig`.
pub async fn ready_cluster(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    kubeconfig: &kube::config::Kubeconfig,
    labels: &[(&str, &str)],
) {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
    ));
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let mut object = DynamicObject::new(name, &resource).within(namespace);
    object.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    // As a user writes it: a control plane and an infrastructure.
    object.data = serde_json::json!({"spec": {
        "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": name},
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerCluster", "name": name},
    }});
    clusters
        .create(&PostParams::default(), &object)
        .await
        .expect("Cluster");
    clusters
        .patch_status(
            name,
            &PatchParams::default(),
            // As Cluster API's controllers leave a provisioned Cluster.
            &Patch::Merge(serde_json::json!({"status": {
                "initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true},
                "phase": "Provisioned",
            }})),
        )
        .await
        .expect("status");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{name}-kubeconfig")),
            labels: Some([(CLUSTER_NAME_LABEL.to_string(), name.to_string())].into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "value".to_string(),
            ByteString(
                multicluster_envtest::to_yaml(kubeconfig)
                    .expect("yaml")
                    .into_bytes(),
            ),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret");
}
