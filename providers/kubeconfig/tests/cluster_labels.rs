//! Choosing members by the labels of their kubeconfig Secrets: a hub
//! ConfigMap is copied only into members labelled `env=production`; a
//! member relabelled into the selection gets its copy, one relabelled out
//! of it loses its copy, and neither is built again for it. Its Secret's
//! annotations reach its inventory too, but for kubectl's last-applied
//! copy of the Secret (its data).

use multicluster_runtime::testing::wait_for_fleet;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::{Expression, Selector, SelectorExt};
use multicluster_envtest::ControlPlane;
use multicluster_provider_kubeconfig::{DEFAULT_LABEL, KubeconfigOptions, KubeconfigProvider};
use multicluster_runtime::controller::{Action, ClusterScope, Controller, Watch, map};
use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::run_manager;
use multicluster_runtime::{Cluster, ClusterName, Manager};

const FLEET: &str = "fleet";
const SOURCE: &str = "source";
/// The label this test's propagation puts on the copies it makes, so it
/// never deletes what it did not make.
const COPY_LABEL: &str = "example.com/copied-from-hub";

fn secret(name: &str, kubeconfig: &str, env: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(FLEET.into()),
            labels: Some(BTreeMap::from([
                (DEFAULT_LABEL.into(), "true".into()),
                ("env".into(), env.into()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

fn config_map(name: &str, value: &str, labels: BTreeMap<String, String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(SOURCE.into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("value".to_string(), value.to_string())])),
        ..ConfigMap::default()
    }
}

fn production() -> Selector {
    Expression::Equal("env".into(), "production".into()).into()
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(#[from] kube::Error);

/// Copies the hub's ConfigMaps of `source` into the members `production()`
/// selects, and removes its copies from members it does not.
fn propagation(hub: kube::Client) -> Controller {
    Controller::builder("propagation")
        .for_resource(Watch::<ConfigMap>::new().cluster_labels(production()))
        .watches(
            Watch::<ConfigMap>::new().clusters(ClusterScope::Local),
            map::to_members_matching(production()),
        )
        .owed_on_engage(map::local_objects(|cm: &ConfigMap| {
            cm.metadata.namespace.as_deref() == Some(SOURCE)
        }))
        .owed_on_disengage(map::local_objects(|cm: &ConfigMap| {
            cm.metadata.namespace.as_deref() == Some(SOURCE)
        }))
        .build(move |request, member: Cluster| {
            let hub = hub.clone();
            async move {
                let namespace = request.namespace.as_deref().unwrap_or_default();
                if namespace != SOURCE {
                    return Ok(Action::await_change());
                }
                let copies = Api::<ConfigMap>::namespaced(member.client(), SOURCE);
                let original = Api::<ConfigMap>::namespaced(hub, SOURCE)
                    .get_opt(&request.name)
                    .await?;
                let selected = production().matches(&member.inventory().labels);
                match original.filter(|_| selected) {
                    Some(original) => {
                        let copy = config_map(
                            &request.name,
                            "",
                            BTreeMap::from([(COPY_LABEL.into(), "true".into())]),
                        );
                        let copy = ConfigMap {
                            data: original.data,
                            ..copy
                        };
                        copies
                            .patch(
                                &request.name,
                                &PatchParams::apply("propagation").force(),
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

async fn value_in(client: &kube::Client, name: &str) -> Option<String> {
    Api::<ConfigMap>::namespaced(client.clone(), SOURCE)
        .get_opt(name)
        .await
        .expect("get")
        .and_then(|cm| cm.data?.remove("value"))
}

/// Waits, watching it, until the member's copy `name` holds `value`
/// (`None`: until it is gone).
async fn until_value(client: &kube::Client, name: &str, value: Option<&str>, what: &str) {
    let copies = Api::<ConfigMap>::namespaced(client.clone(), SOURCE);
    multicluster_runtime::testing::wait_for_object(&copies, name, what, |copy| {
        copy.and_then(|copy| copy.data.as_ref()?.get("value"))
            .map(String::as_str)
            == value
    })
    .await;
}

async fn relabel(secrets: &Api<Secret>, name: &str, env: &str) {
    secrets
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"env": env}}})),
        )
        .await
        .expect("relabel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_relabelled_in_and_out_of_a_selector_gain_and_lose_the_copies() {
    let (management, east, west) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (management, east, west) = (
        management.expect("management"),
        east.expect("east"),
        west.expect("west"),
    );
    let hub = management.client().await.expect("hub client");
    let east_client = east.client().await.expect("east client");
    let west_client = west.client().await.expect("west client");
    for plane in [&management, &east, &west] {
        plane.create_namespace(SOURCE).await.expect("namespace");
    }
    management.create_namespace(FLEET).await.expect("namespace");
    let secrets = Api::<Secret>::namespaced(hub.clone(), FLEET);
    for object in [
        secret(
            "east",
            &multicluster_envtest::to_yaml(east.kubeconfig()).expect("yaml"),
            "production",
        ),
        secret(
            "west",
            &multicluster_envtest::to_yaml(west.kubeconfig()).expect("yaml"),
            "staging",
        ),
    ] {
        secrets
            .create(&PostParams::default(), &object)
            .await
            .expect("secret");
    }
    let hub_config_maps = Api::<ConfigMap>::namespaced(hub.clone(), SOURCE);
    hub_config_maps
        .create(
            &PostParams::default(),
            &config_map("settings", "one", BTreeMap::new()),
        )
        .await
        .expect("hub config map");

    let provider = Arc::new(KubeconfigProvider::new(
        hub.clone(),
        KubeconfigOptions::default().namespace(FLEET.to_string()),
    ));
    let manager = Manager::builder(Cluster::local(hub.clone()))
        .provider(provider.clone())
        .build();
    manager
        .add_controller(propagation(hub.clone()))
        .expect("add");
    let (shutdown, task) = run_manager(&manager);
    let member = |name: &str| {
        provider
            .cluster_set()
            .get(&ClusterName::from(name))
            .expect("engaged")
    };

    // Only the production member gets the copy.
    until_value(&east_client, "settings", Some("one"), "the copy in east").await;
    wait_for_fleet(&manager, "both members engaged", || {
        provider.names().len() == 2
    })
    .await;
    let (east_member, west_member) = (member("east"), member("west"));
    assert_eq!(
        west_member.labels().get("env").map(String::as_str),
        Some("staging")
    );
    assert_eq!(value_in(&west_client, "settings").await, None);

    // West relabelled into production: its copy is made (it is owed the
    // hub's objects), with its client and cache as they were.
    relabel(&secrets, "west", "production").await;
    until_value(&west_client, "settings", Some("one"), "the copy in west").await;
    assert!(
        member("west").same_instance(&west_member),
        "a change of labels alone rebuilt the cluster"
    );
    assert_eq!(
        member("west").labels().get("env").map(String::as_str),
        Some("production")
    );

    // Its Secret's annotations reach its inventory the same way (a
    // propagation's maintenance windows are one), but for kubectl's copy
    // of what it last applied: for a Secret, its data.
    let last_applied = "kubectl.kubernetes.io/last-applied-configuration";
    secrets
        .patch(
            "west",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                "example.com/windows": "[]",
                last_applied: "{\"data\":{\"kubeconfig\":\"c2VjcmV0\"}}",
            }}})),
        )
        .await
        .expect("annotate");
    let mut inventory = member("west").inventory_changes();
    tokio::time::timeout(
        multicluster_runtime::testing::DEFAULT_DEADLINE,
        inventory.wait_for(|inventory| {
            inventory
                .annotations
                .get("example.com/windows")
                .is_some_and(|value| value == "[]")
        }),
    )
    .await
    .expect("west's annotation in its inventory")
    .expect("west engaged");
    assert!(
        !member("west")
            .inventory()
            .annotations
            .contains_key(last_applied),
        "the Secret's last applied data reached the inventory"
    );
    assert!(member("west").same_instance(&west_member));

    // East relabelled out: its copy is removed, and a change on the hub
    // reaches west only.
    relabel(&secrets, "east", "staging").await;
    until_value(&east_client, "settings", None, "the copy in east removed").await;
    assert!(member("east").same_instance(&east_member));
    hub_config_maps
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"value": "two"}})),
        )
        .await
        .expect("hub update");
    until_value(&west_client, "settings", Some("two"), "the update in west").await;
    assert_eq!(value_in(&east_client, "settings").await, None);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
