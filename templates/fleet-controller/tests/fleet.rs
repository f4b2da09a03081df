//! The controller on real control planes (a real etcd and kube-apiserver,
//! started by `multicluster-envtest`): a labelled ConfigMap in a cluster of
//! the fleet is annotated with that cluster's name.
//!
//! The control plane's binaries are found as `multicluster-envtest` says:
//! `KUBEBUILDER_ASSETS` (as `setup-envtest use` prints it), or the cache a
//! multicluster-runtime-rs checkout's `make controlplane` fills.

{%- if provider == "kubeconfig" %}
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::Secret;
{%- else %}
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::Namespace;
{%- endif %}
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::testing::{Polled, eventually, run_manager};

use {{crate_name}}::{GREET_LABEL, GREETED_BY, controller, manager};

/// A labelled ConfigMap `name` in `namespace`.
fn labelled(namespace: &str, name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some([(GREET_LABEL.to_string(), "true".to_string())].into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// The annotation the controller wrote on `name` in `namespace`.
async fn greeted_by(configmaps: &Api<ConfigMap>, name: &str) -> Option<String> {
    configmaps
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|object| object.metadata.annotations)
        .and_then(|annotations| annotations.get(GREETED_BY).cloned())
}
{%- if provider == "kubeconfig" %}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_of_the_fleet_is_greeted_by_name() {
    // The hub (where this process runs and the Secrets live) and a member.
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    hub.create_namespace({{crate_name}}::FLEET_NAMESPACE)
        .await
        .expect("namespace");
    let kubeconfig = multicluster_envtest::to_yaml(member.kubeconfig()).expect("kubeconfig");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("member-a".into()),
            labels: Some(
                [(
                    multicluster_provider_kubeconfig::DEFAULT_LABEL.to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some(
            [(
                multicluster_provider_kubeconfig::DEFAULT_DATA_KEY.to_string(),
                ByteString(kubeconfig.into_bytes()),
            )]
            .into(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(
        hub.client().await.expect("client"),
        {{crate_name}}::FLEET_NAMESPACE,
    )
    .create(&PostParams::default(), &secret)
    .await
    .expect("the member's Secret");

    let manager = manager(hub.client().await.expect("client"));
    manager
        .add_controller(controller().expect("controller"))
        .expect("add");
    let (stop, running) = run_manager(&manager);

    let configmaps =
        Api::<ConfigMap>::namespaced(member.client().await.expect("client"), "default");
    configmaps
        .create(&PostParams::default(), &labelled("default", "hello"))
        .await
        .expect("ConfigMap");
    eventually(
        Polled::ApiServer,
        "the member's ConfigMap greeted",
        || async { greeted_by(&configmaps, "hello").await.as_deref() == Some("member-a") },
    )
    .await;

    stop.cancel();
    running.await.expect("join").expect("manager");
}
{%- else %}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_the_fleet_is_greeted_by_name() {
    let host = ControlPlane::start().await.expect("control plane");
    let client = host.client().await.expect("client");
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some("team-a".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");

    let manager = manager(client.clone());
    manager
        .add_controller(controller().expect("controller"))
        .expect("add");
    let (stop, running) = run_manager(&manager);

    let configmaps = Api::<ConfigMap>::namespaced(client, "team-a");
    configmaps
        .create(&PostParams::default(), &labelled("team-a", "hello"))
        .await
        .expect("ConfigMap");
    eventually(
        Polled::ApiServer,
        "the namespace's ConfigMap greeted",
        || async { greeted_by(&configmaps, "hello").await.as_deref() == Some("team-a") },
    )
    .await;

    stop.cancel();
    running.await.expect("join").expect("manager");
}
{%- endif %}
