//! Member options applied by the provider to each member it builds: a
//! member whose credentials may read one namespace only works when its
//! cache is held to that namespace, chosen per member from an annotation on
//! its Secret; taking the restriction away rebuilds it and shows it
//! degraded (its cluster-wide watch is refused).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use multicluster_envtest::{ControlPlane, config_map_rules};
use multicluster_provider_kubeconfig::{DEFAULT_LABEL, KubeconfigOptions, KubeconfigProvider};
use multicluster_runtime::controller::{Request, Watch};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::member::Members;
use multicluster_runtime::testing::{Recorder, recording_controller, run_manager};
use multicluster_runtime::{Cluster, Manager};

const FLEET: &str = "fleet";
/// The annotation this test's users put on a Secret to hold its member to
/// one namespace.
const NAMESPACE_ANNOTATION: &str = "example.com/namespace";

fn secret(name: &str, kubeconfig: &str, namespace: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(FLEET.into()),
            labels: Some(BTreeMap::from([(DEFAULT_LABEL.into(), "true".into())])),
            annotations: namespace
                .map(|ns| BTreeMap::from([(NAMESPACE_ANNOTATION.into(), ns.to_string())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

async fn create_config_map(client: &kube::Client, namespace: &str, name: &str) {
    let object = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .expect("config map");
}

/// Holds a member to the namespace its Secret names, if it names one.
fn members() -> Members<Secret> {
    Members::default().per_member(|secret: &Secret, options| {
        let namespace = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(NAMESPACE_ANNOTATION));
        match namespace {
            Some(namespace) => {
                let cache = options.cache.clone().namespace(namespace.clone());
                options.cache(cache)
            }
            None => options,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_rbac_for_one_namespace_works_when_held_to_it() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    let member_admin = member.client().await.expect("member client");
    for namespace in ["team-a", "team-b"] {
        member.create_namespace(namespace).await.expect("namespace");
    }
    // A robot that may read ConfigMaps in team-a and nowhere else.
    let token = member
        .service_account_token("robots", "team-a", Duration::from_secs(3600))
        .await
        .expect("token");
    member
        .grant_service_account_in_namespace(
            "team-a",
            "robots",
            "team-a",
            config_map_rules(&["get", "list", "watch"]),
        )
        .await
        .expect("grant");
    let robot =
        multicluster_envtest::to_yaml(&member.token_kubeconfig("robot", token)).expect("yaml");
    let admin = multicluster_envtest::to_yaml(member.kubeconfig()).expect("yaml");
    create_config_map(&member_admin, "team-a", "first").await;
    create_config_map(&member_admin, "team-b", "elsewhere").await;

    let hub = management.client().await.expect("hub client");
    management.create_namespace(FLEET).await.expect("namespace");
    let secrets = Api::<Secret>::namespaced(hub.clone(), FLEET);
    for object in [
        secret("team-a", &robot, Some("team-a")),
        secret("whole", &admin, None),
    ] {
        secrets
            .create(&PostParams::default(), &object)
            .await
            .expect("secret");
    }

    let provider = Arc::new(KubeconfigProvider::new(
        hub.clone(),
        KubeconfigOptions::default()
            .namespace(FLEET.to_string())
            .members(members()),
    ));
    let manager = Manager::builder(Cluster::new("local", hub.clone()))
        .provider(provider.clone())
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(
            recording_controller("configmaps", Watch::<ConfigMap>::new(), &recorder)
                .expect("controller"),
        )
        .expect("add");
    let (shutdown, task) = run_manager(&manager);
    let state = |name: &str| manager.cluster_state(&name.into());

    // The restricted member reconciles its namespace and is ready.
    recorder
        .wait_for_more(&Request::new("team-a", Some("team-a"), "first"), 0)
        .await;
    recorder
        .wait_for_more(&Request::new("whole", Some("team-b"), "elsewhere"), 0)
        .await;
    multicluster_runtime::testing::wait_until_ready(&manager, "team-a").await;
    // A change in team-a reaches it; team-b was never its business (the
    // unrestricted member, fed by the same API server, saw team-b first).
    create_config_map(&member_admin, "team-a", "second").await;
    recorder
        .wait_for_more(&Request::new("team-a", Some("team-a"), "second"), 0)
        .await;
    assert_eq!(
        recorder.count(&Request::new("team-a", Some("team-b"), "elsewhere")),
        0,
        "the restricted member reconciled outside its namespace"
    );
    multicluster_runtime::testing::wait_until_ready(&manager, "team-a").await;

    // Without its restriction the same credentials cannot watch: the
    // member is built again (its options changed) and shows degraded.
    secrets
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {NAMESPACE_ANNOTATION: null}}
            })),
        )
        .await
        .expect("patch");
    multicluster_runtime::testing::wait_for_state(
        &manager,
        "team-a",
        Duration::from_secs(30),
        |state| matches!(state, Some(ClusterState::Degraded(_))),
    )
    .await;
    let Some(ClusterState::Degraded(reason)) = state("team-a") else {
        panic!("degraded, then not");
    };
    assert!(
        reason.to_string().contains("403 Forbidden"),
        "the reason should name the refusal: {reason}"
    );
    assert_eq!(state("whole"), Some(ClusterState::Ready));

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
