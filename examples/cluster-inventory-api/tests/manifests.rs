//! `config/cluster-inventory-api`: the manifests render with `kubectl
//! kustomize`, apply to a real hub with the ClusterProfile CRD, and their
//! ServiceAccount's RBAC is enough for the example, run with the
//! Deployment's own flags and environment (credentials from Secrets for its
//! consumer), to do its work — and no more. The second-instance overlay's
//! engaged clusters are disjoint from the base's.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::manifests::{
    Container, apply, can_i, container, may_not, render, run_as_deployed, stop_all,
    wait_until_engaged,
};
use multicluster_example_testing::wait_for_copy;
use multicluster_provider_cluster_inventory_api::{
    CONSUMER_LABEL, PROFILE_LABEL, SECRET_KEY, WATCH_FILTER_LABEL,
};
use serde_json::json;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-cluster-inventory-api");
const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../config/cluster-inventory-api"
);

/// A healthy ClusterProfile `name` where `instance` runs, with `labels`,
/// and the credentials Secret for `instance`'s consumer reaching `member`.
async fn healthy_profile(
    hub: &kube::Client,
    instance: &Container,
    name: &str,
    member: &ControlPlane,
    labels: &[(&str, &str)],
) {
    let namespace = &instance.namespace;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
    ));
    let profiles: Api<DynamicObject> = Api::namespaced_with(hub.clone(), namespace, &resource);
    let mut profile = DynamicObject::new(name, &resource).within(namespace);
    profile.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    profile.data = json!({"spec": {"clusterManager": {"name": "test"}}});
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
    let consumer = instance
        .env
        .iter()
        .find(|(key, _)| key == "CONSUMER")
        .map(|(_, value)| value.clone())
        .expect("the Deployment names its consumer");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{name}-credentials")),
            labels: Some(
                [
                    (CONSUMER_LABEL.to_string(), consumer),
                    (PROFILE_LABEL.to_string(), name.to_string()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_string(),
            ByteString(
                multicluster_envtest::to_yaml(member.kubeconfig())
                    .expect("yaml")
                    .into_bytes(),
            ),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(hub.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_deploy_with_the_least_privilege_and_instances_stay_apart() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    let crd = multicluster_envtest::upstream::cluster_profile_crd()
        .await
        .expect("upstream CRD");
    hub.install_crds(&crd).await.expect("CRD");
    let dir = tempfile::tempdir().expect("dir");

    let (base_yaml, base) = render(&format!("{CONFIG}/base")).await;
    let (second_yaml, second) = render(&format!("{CONFIG}/second-instance")).await;
    apply(&hub, &base_yaml).await;
    apply(&hub, &second_yaml).await;
    let (a, b) = (container(&base), container(&second));
    assert_ne!(
        a.namespace, b.namespace,
        "each instance has its own namespace"
    );

    let admin = hub.client().await.expect("client");
    let filtered = [(WATCH_FILTER_LABEL, "instance-b")];
    healthy_profile(&admin, &a, "in-a", &member, &[]).await;
    healthy_profile(&admin, &b, "in-b", &member, &filtered).await;
    healthy_profile(&admin, &b, "not-for-b", &member, &[]).await;

    let (mut first, first_address) = run_as_deployed(BINARY, &hub, &a, dir.path()).await;
    let (mut other, other_address) = run_as_deployed(BINARY, &hub, &b, dir.path()).await;
    // It works: its RBAC is enough to read its profiles, their Secrets and
    // to lead.
    wait_for_copy(member.client().await.expect("client"), "settings").await;
    let (want_a, want_b) = (
        vec![format!("{}/in-a", a.namespace)],
        vec![format!("{}/in-b", b.namespace)],
    );
    wait_until_engaged(&[(first_address, want_a), (other_address, want_b)]).await;

    // And no more: reading profiles and Secrets in its own namespace.
    let profiles = "clusterprofiles.multicluster.x-k8s.io";
    for (instance, own, foreign) in [
        (&a, &a.namespace, &b.namespace),
        (&b, &b.namespace, &a.namespace),
    ] {
        assert!(can_i(&hub, instance, &["list", profiles, "-n", own]).await);
        may_not(
            &hub,
            instance,
            &[
                vec!["get", "secrets", "-n", foreign.as_str()],
                vec!["list", profiles, "-n", foreign.as_str()],
                vec!["list", "secrets", "--all-namespaces"],
                vec!["update", profiles, "-n", own.as_str()],
                vec!["create", "secrets", "-n", own.as_str()],
                vec!["update", "leases/some-other-lease", "-n", own.as_str()],
                vec!["list", "configmaps", "-n", own.as_str()],
            ],
        )
        .await;
    }

    stop_all(&mut [&mut first, &mut other]).await;
}
