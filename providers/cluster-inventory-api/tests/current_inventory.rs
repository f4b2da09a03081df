//! A current inventory: the provider reads v1alpha2 where the hub serves
//! it (and keeps the version it chose when the CRD is upgraded under it),
//! and ClusterProfiles naming one inventory member engage one cluster,
//! handing over when the chosen profile goes.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use multicluster_envtest::ControlPlane;
use multicluster_provider_cluster_inventory_api::{
    ApiVersion, CLUSTER_MANAGER_LABEL, ClusterProfileOptions, ClusterProfileProvider,
    INVENTORY_MEMBER_ID_LABEL,
};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::wait_for_fleet;
use multicluster_runtime::testing::{http_get, run_manager, serve_health, wait_until_left};
use multicluster_runtime::{ClusterName, ManagerOptions};
use serde_json::json;

use common::{NS, credentials_secret, health, req, workload};

/// Creates profile `name` through `version`, managed by `manager`, with
/// `labels`, healthy.
async fn create_profile(
    hub: &kube::Client,
    version: ApiVersion,
    name: &str,
    manager: &str,
    labels: &[(&str, &str)],
) {
    let profiles =
        Api::<DynamicObject>::namespaced_with(hub.clone(), NS, &version.resource("ClusterProfile"));
    let mut profile = DynamicObject::new(name, &version.resource("ClusterProfile")).within(NS);
    profile.metadata.labels = Some(
        labels
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect(),
    );
    profile.data = json!({"spec": {"clusterManager": {"name": manager}}});
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .expect("profile");
    profiles
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": health(true) })),
        )
        .await
        .expect("status");
}

/// How many clusters left `manager`'s fleet (a replacement is no leaving).
fn disengagements(manager: &multicluster_runtime::Manager) -> u64 {
    manager
        .metrics()
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix("mcr_cluster_disengagements_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .expect("mcr_cluster_disengagements") as u64
}

/// `kubeconfig` under other names: the same credential, other text.
fn renamed(kubeconfig: &Kubeconfig, suffix: &str) -> Kubeconfig {
    let mut renamed = kubeconfig.clone();
    for context in &mut renamed.contexts {
        context.name = format!("{}-{suffix}", context.name);
    }
    renamed.current_context = renamed
        .current_context
        .map(|name| format!("{name}-{suffix}"));
    renamed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_served_version_is_read_and_kept_through_a_crd_upgrade() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("in-member"));
    let hub_cp = hub_cp.expect("hub");
    // A hub installed from the released module: v1alpha1 only.
    let released = multicluster_envtest::upstream::released_cluster_profile_crd()
        .await
        .expect("released CRD");
    hub_cp.install_crds(&released).await.expect("CRD");
    hub_cp.create_namespace(NS).await.expect("namespace");
    let hub = hub_cp.client().await.expect("hub client");
    let secrets = Api::<Secret>::namespaced(hub.clone(), NS);
    for name in ["old", "new"] {
        secrets
            .create(
                &PostParams::default(),
                &credentials_secret(&format!("{name}-creds"), name, "me", member.kubeconfig()),
            )
            .await
            .expect("secret");
    }
    create_profile(&hub, ApiVersion::V1Alpha1, "old", "test", &[]).await;

    let first = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_secrets("me"),
    ));
    assert_eq!(first.api_version(), None, "decided when it starts");
    let (first_manager, first_seen) = common::manager(&hub, &first, ManagerOptions::default());
    let (stop_first, first_task) = run_manager(&first_manager);
    first_seen
        .wait_for_more(&req("inventory/old", "in-member"), 0)
        .await;
    assert_eq!(first.api_version(), Some(ApiVersion::V1Alpha1));

    // The CRD upgraded under it: v1alpha2 served beside v1alpha1. The
    // running provider keeps reading v1alpha1, which is still served, and
    // sees a profile written through v1alpha2.
    let current = multicluster_envtest::upstream::cluster_profile_crd()
        .await
        .expect("current CRD");
    hub_cp.install_crds(&current).await.expect("upgraded CRD");
    create_profile(&hub, ApiVersion::V1Alpha2, "new", "test", &[]).await;
    first_seen
        .wait_for_more(&req("inventory/new", "in-member"), 0)
        .await;
    assert_eq!(first.api_version(), Some(ApiVersion::V1Alpha1));

    // A provider started now reads v1alpha2, and finds both profiles.
    let second = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_secrets("me"),
    ));
    let (second_manager, second_seen) = common::manager(&hub, &second, ManagerOptions::default());
    let (stop_second, second_task) = run_manager(&second_manager);
    for profile in ["inventory/old", "inventory/new"] {
        second_seen
            .wait_for_more(&req(profile, "in-member"), 0)
            .await;
    }
    assert_eq!(second.api_version(), Some(ApiVersion::V1Alpha2));

    stop_first.cancel();
    stop_second.cancel();
    first_task.await.expect("task").expect("clean stop");
    second_task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_of_one_inventory_member_engage_one_cluster_and_hand_over() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("in-member"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let secrets = Api::<Secret>::namespaced(hub.clone(), NS);
    // Two cluster managers describe the member, each with a credential of
    // its own (the same identity under other names, so the kubeconfigs
    // differ and a hand-over builds a new client).
    for (profile, kubeconfig) in [
        ("capi-member", member.kubeconfig().clone()),
        ("ocm-member", renamed(member.kubeconfig(), "ocm")),
    ] {
        secrets
            .create(
                &PostParams::default(),
                &credentials_secret(&format!("{profile}-creds"), profile, "me", &kubeconfig),
            )
            .await
            .expect("secret");
    }
    let id = [(INVENTORY_MEMBER_ID_LABEL, "member-1")];
    create_profile(&hub, ApiVersion::V1Alpha2, "capi-member", "capi", &id).await;
    create_profile(&hub, ApiVersion::V1Alpha2, "ocm-member", "ocm", &id).await;

    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_secrets("me"),
    ));
    let (manager, seen) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    let address = serve_health(&manager, shutdown.child_token()).await;
    let cluster = ClusterName::from("member-1");
    let (capi, ocm) = (
        ClusterName::from("inventory/capi-member"),
        ClusterName::from("inventory/ocm-member"),
    );

    // One cluster, named by the member id, engaged from the older profile.
    seen.wait_for_more(&req("member-1", "in-member"), 0).await;
    let managed_by = || {
        provider
            .cluster_set()
            .get(&cluster)
            .ok()
            .and_then(|engaged| {
                engaged
                    .inventory()
                    .labels
                    .get(CLUSTER_MANAGER_LABEL)
                    .cloned()
            })
    };
    assert_eq!(managed_by().as_deref(), Some("capi"));
    assert_eq!(
        provider.cluster_set().names(),
        std::slice::from_ref(&cluster)
    );
    // The other profile is listed as a duplicate, nothing is built for it.
    wait_for_fleet(&manager, "the other profile listed as a duplicate", || {
        manager.cluster_state(&ocm) == Some(ClusterState::Duplicate(cluster.clone()))
    })
    .await;
    assert_eq!(manager.cluster_state(&capi), None);
    assert_eq!(
        provider.duplicates(),
        BTreeMap::from([(ocm.clone(), cluster.clone())])
    );
    assert_eq!(seen.for_cluster("inventory/ocm-member"), 0);
    assert_eq!(seen.for_cluster("inventory/capi-member"), 0);
    let (_, clusters) = http_get(address, "/clusters").await.expect("/clusters");
    assert!(
        clusters
            .lines()
            .any(|line| line.starts_with("inventory/ocm-member\tduplicate of member-1\t")),
        "{clusters}"
    );
    assert_eq!(manager.watch_fleet().borrow().duplicates, 1);

    // The chosen profile deleted: the other takes over under the same name.
    // Its client is built before the old one is let go, so the member is
    // engaged throughout: replaced, never disengaged.
    common::profiles(&hub)
        .delete("capi-member", &DeleteParams::default())
        .await
        .expect("delete the chosen profile");
    wait_for_fleet(
        &manager,
        "the member engaged from the other profile",
        || managed_by().as_deref() == Some("ocm"),
    )
    .await;
    assert_eq!(
        disengagements(&manager),
        0,
        "the member left the fleet during the hand-over"
    );
    wait_for_fleet(&manager, "no duplicate left", || {
        manager.cluster_state(&ocm).is_none()
    })
    .await;
    assert!(provider.duplicates().is_empty());
    // Its reconciles go on under the same name.
    let before = seen.count(&req("member-1", "in-member"));
    Api::<ConfigMap>::namespaced(member.client().await.expect("client"), "default")
        .patch(
            "in-member",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"changed": "yes"}})),
        )
        .await
        .expect("change");
    seen.wait_for_more(&req("member-1", "in-member"), before)
        .await;

    // The last profile leaves the member (its label removed): the member
    // goes, the profile is a cluster of its own.
    common::profiles(&hub)
        .patch(
            "ocm-member",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {INVENTORY_MEMBER_ID_LABEL: null}}})),
        )
        .await
        .expect("unlabel");
    wait_until_left(&manager, "member-1").await;
    assert_eq!(disengagements(&manager), 1);
    seen.wait_for_more(&req("inventory/ocm-member", "in-member"), 0)
        .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
