//! A hub ConfigMap propagated to the clusters a PlacementDecision chose
//! (upstream's CRDs as its main branch serves them, the decision written
//! and read through v1alpha2 and spread over two slices), following the
//! decision as clusters are added to it and removed from it; a profile
//! naming its inventory member is reached under the member's name.

mod common;

use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;
use std::sync::Arc;

use common::{NS, create_profile, set_health};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_provider_cluster_inventory_api::placement::{
    DECISION_INDEX_LABEL, DECISION_KEY_LABEL, DecisionKey, PLACEMENT_KEY_LABEL, Placements,
};
use multicluster_provider_cluster_inventory_api::{
    ApiVersion, ClusterProfileOptions, ClusterProfileProvider, INVENTORY_MEMBER_ID_LABEL,
};
use multicluster_runtime::controller::{Action, ClusterScope, Controller, Watch};
use multicluster_runtime::testing::{eventually, run_manager};
use multicluster_runtime::{Cluster, ClusterName, Manager};

/// The annotation naming the placement a hub ConfigMap follows.
const PLACEMENT_ANNOTATION: &str = "example.com/placement";
const COPY_LABEL: &str = "example.com/copied-from-hub";

fn key_of(object: &ConfigMap) -> Option<DecisionKey> {
    let placement = object
        .metadata
        .annotations
        .as_ref()?
        .get(PLACEMENT_ANNOTATION)?;
    Some(DecisionKey::Placement(placement.clone()))
}

fn decision_resource() -> kube::api::ApiResource {
    ApiVersion::V1Alpha2.resource("PlacementDecision")
}

/// A slice of decision `d1` for placement `p1`.
fn slice(name: &str, index: u32, profiles: &[&str]) -> DynamicObject {
    // Written as a current scheduler writes them: through v1alpha2.
    let mut slice = DynamicObject::new(name, &decision_resource()).within(NS);
    slice.metadata.labels = Some(BTreeMap::from([
        (DECISION_KEY_LABEL.to_string(), "d1".to_string()),
        (DECISION_INDEX_LABEL.to_string(), index.to_string()),
        (PLACEMENT_KEY_LABEL.to_string(), "p1".to_string()),
    ]));
    slice.data = serde_json::json!({
        "decisions": decisions(profiles),
        "schedulerName": "test-scheduler",
    });
    slice
}

fn decisions(profiles: &[&str]) -> serde_json::Value {
    profiles
        .iter()
        .map(|name| serde_json::json!({"clusterProfileRef": {"name": name}, "reason": "test"}))
        .collect()
}

fn credentials(profile: &str, workload: &ControlPlane) -> Secret {
    common::credentials_secret(
        &format!("{profile}-creds"),
        profile,
        "me",
        workload.kubeconfig(),
    )
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(#[from] kube::Error);

/// Copies the hub's ConfigMaps into the clusters their placement chose,
/// and removes its copies from the others.
fn propagation(hub: kube::Client, placements: &Placements) -> Controller {
    let chosen = placements.clone();
    Controller::builder("placement")
        .for_resource(Watch::<ConfigMap>::new())
        .watches(
            Watch::<ConfigMap>::new().clusters(ClusterScope::Local),
            placements.to_placed_clusters(key_of),
        )
        .watches_dynamic(
            placements.resource(),
            Watch::new().clusters(ClusterScope::Local),
            placements.on_decision::<ConfigMap>(key_of),
        )
        .owed_on_engage(placements.owed::<ConfigMap>(key_of))
        .build(move |request, member: Cluster| {
            let (hub, chosen) = (hub.clone(), chosen.clone());
            async move {
                if request.namespace.as_deref() != Some(NS) {
                    return Ok(Action::await_change());
                }
                let copies = Api::<ConfigMap>::namespaced(member.client(), NS);
                let original = Api::<ConfigMap>::namespaced(hub, NS)
                    .get_opt(&request.name)
                    .await?
                    .filter(|original| {
                        key_of(original)
                            .is_some_and(|key| chosen.chosen(Some(NS), &key, member.name()))
                    });
                match original {
                    Some(original) => {
                        let copy = ConfigMap {
                            metadata: ObjectMeta {
                                name: Some(request.name.clone()),
                                namespace: Some(NS.into()),
                                labels: Some(BTreeMap::from([(COPY_LABEL.into(), "true".into())])),
                                ..ObjectMeta::default()
                            },
                            data: original.data,
                            ..ConfigMap::default()
                        };
                        copies
                            .patch(
                                &request.name,
                                &PatchParams::apply("placement").force(),
                                &Patch::Apply(copy),
                            )
                            .await?;
                    }
                    None => {
                        let ours = copies.get_opt(&request.name).await?.is_some_and(|copy| {
                            copy.metadata
                                .labels
                                .is_some_and(|labels| labels.contains_key(COPY_LABEL))
                        });
                        if ours {
                            copies
                                .delete(&request.name, &DeleteParams::default())
                                .await?;
                        }
                    }
                }
                Ok::<_, Failed>(Action::await_change())
            }
        })
        .expect("controller")
}

async fn has_copy(client: &kube::Client) -> bool {
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get_opt("settings")
        .await
        .expect("get")
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_over_two_slices_places_copies_and_follows_its_changes() {
    let (hub_cp, alpha, beta, gamma) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start(),
    );
    let hub_cp = hub_cp.expect("hub");
    let workloads = [
        ("alpha", alpha.expect("alpha")),
        ("beta", beta.expect("beta")),
        ("gamma", gamma.expect("gamma")),
    ];
    let hub = common::hub(&hub_cp).await;
    let crd = multicluster_envtest::upstream::placement_decision_crd()
        .await
        .expect("upstream CRD");
    hub_cp.install_crds(&crd).await.expect("CRD");
    let secrets = Api::<Secret>::namespaced(hub.clone(), NS);
    let mut members = BTreeMap::new();
    for (name, workload) in &workloads {
        workload.create_namespace(NS).await.expect("namespace");
        create_profile(&hub, name).await;
        set_health(&hub, name, true, None).await;
        secrets
            .create(&PostParams::default(), &credentials(name, workload))
            .await
            .expect("secret");
        members.insert(*name, workload.client().await.expect("client"));
    }
    // Gamma's profile names its inventory member: its cluster is engaged,
    // and a decision naming the profile resolved, under the member's name.
    common::profiles(&hub)
        .patch(
            "gamma",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {INVENTORY_MEMBER_ID_LABEL: "gamma-member"}}})),
        )
        .await
        .expect("label gamma");
    let slices = Api::<DynamicObject>::namespaced_with(hub.clone(), NS, &decision_resource());
    // Index 1 written first: the order comes from the label.
    slices
        .create(&PostParams::default(), &slice("p1-b", 1, &["beta"]))
        .await
        .expect("slice");
    slices
        .create(&PostParams::default(), &slice("p1-a", 0, &["alpha"]))
        .await
        .expect("slice");
    let settings = ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".into()),
            namespace: Some(NS.into()),
            annotations: Some(BTreeMap::from([(
                PLACEMENT_ANNOTATION.to_string(),
                "p1".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("value".to_string(), "one".to_string())])),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(hub.clone(), NS)
        .create(&PostParams::default(), &settings)
        .await
        .expect("hub config map");

    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_secrets("me"),
    ));
    let local = Cluster::local(hub.clone());
    let placements = Placements::new(&local).await.expect("placements");
    assert_eq!(placements.api_version(), Some(ApiVersion::V1Alpha2));
    let manager = Manager::builder(local).provider(provider.clone()).build();
    manager
        .add_controller(propagation(hub.clone(), &placements))
        .expect("add");
    let (shutdown, task) = run_manager(&manager);

    // Both slices' clusters, merged in the decision's order; not gamma.
    eventually(Polled::ApiServer, "copies in alpha and beta", || async {
        has_copy(&members["alpha"]).await && has_copy(&members["beta"]).await
    })
    .await;
    let key = DecisionKey::Placement("p1".into());
    assert_eq!(
        placements.clusters(Some(NS), &key),
        [
            ClusterName::from(format!("{NS}/alpha")),
            ClusterName::from(format!("{NS}/beta"))
        ]
    );
    assert!(!has_copy(&members["gamma"]).await, "gamma was not chosen");

    // Gamma added to the second slice gets its copy.
    slices
        .patch(
            "p1-b",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"decisions": decisions(&["beta", "gamma"])})),
        )
        .await
        .expect("add gamma");
    eventually(Polled::ApiServer, "a copy in gamma", || {
        has_copy(&members["gamma"])
    })
    .await;
    assert_eq!(
        placements.clusters(Some(NS), &key),
        [
            ClusterName::from(format!("{NS}/alpha")),
            ClusterName::from(format!("{NS}/beta")),
            ClusterName::from("gamma-member"),
        ]
    );
    assert_eq!(provider.api_version(), Some(ApiVersion::V1Alpha2));

    // Alpha removed from the first slice loses its copy; the others keep
    // theirs.
    slices
        .patch(
            "p1-a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"decisions": decisions(&[])})),
        )
        .await
        .expect("remove alpha");
    eventually(Polled::ApiServer, "alpha's copy removed", || async {
        !has_copy(&members["alpha"]).await
    })
    .await;
    assert!(has_copy(&members["beta"]).await && has_copy(&members["gamma"]).await);

    // The second slice deleted: its clusters lose their copies too.
    slices
        .delete("p1-b", &DeleteParams::default())
        .await
        .expect("delete slice");
    eventually(
        Polled::ApiServer,
        "beta's and gamma's copies removed",
        || async { !has_copy(&members["beta"]).await && !has_copy(&members["gamma"]).await },
    )
    .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
