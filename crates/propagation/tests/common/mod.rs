//! What the propagation's test files share: reading the status a
//! propagation wrote on a hub ConfigMap, and members that are namespaces
//! of one member control plane.

#![allow(dead_code)] // each test file uses its own part

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Cluster;
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::testing::TestProvider;
use serde_json::Value;

/// The annotation the tests' propagations write their status to.
pub(crate) const STATUS: &str = "example.com/propagation";

/// The status annotation of `object` (null without it).
fn status_in(object: Option<&ConfigMap>) -> Value {
    object
        .and_then(|object| object.metadata.annotations.as_ref())
        .and_then(|annotations| annotations.get(STATUS))
        .map(|text| serde_json::from_str(text).expect("status JSON"))
        .unwrap_or_default()
}

/// Each member's state and reason, as `status` says.
fn states_in(status: &Value) -> BTreeMap<String, (String, String)> {
    let field = |entry: &Value, key: &str| entry[key].as_str().unwrap_or_default().to_string();
    status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| {
            (
                field(entry, "cluster"),
                (field(entry, "state"), field(entry, "reason")),
            )
        })
        .collect()
}

/// The status annotation of the hub ConfigMap `name` in `default`
/// (null if the object or the annotation is not there yet).
pub(crate) async fn status_of(hub: &ControlPlane, name: &str) -> Value {
    let object = Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .get_opt(name)
        .await
        .expect("get the hub object");
    status_in(object.as_ref())
}

/// Each member's state and reason, as the hub ConfigMap `name`'s status
/// says.
pub(crate) async fn member_states(
    hub: &ControlPlane,
    name: &str,
) -> BTreeMap<String, (String, String)> {
    states_in(&status_of(hub, name).await)
}

/// Waits, watching the hub ConfigMap `name`, until its status satisfies
/// `that`.
pub(crate) async fn until_status(
    hub: &ControlPlane,
    name: &str,
    what: &str,
    that: impl Fn(&Value) -> bool,
) {
    let api = Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default");
    multicluster_runtime::testing::wait_for_object(&api, name, what, |object| {
        that(&status_in(object))
    })
    .await;
}

/// Waits, watching the hub ConfigMap `name`, until each member's state
/// and reason, as its status says, satisfy `that`.
pub(crate) async fn until_states(
    hub: &ControlPlane,
    name: &str,
    what: &str,
    that: impl Fn(&BTreeMap<String, (String, String)>) -> bool,
) {
    until_status(hub, name, what, |status| that(&states_in(status))).await;
}

/// Waits until every one of `members` is `InSync`, as the hub ConfigMap
/// `name`'s status says.
pub(crate) async fn until_in_sync(hub: &ControlPlane, name: &str, members: &[&str]) {
    until_states(hub, name, "every member in sync", |states| {
        members.iter().all(|member| {
            states
                .get(*member)
                .is_some_and(|(state, _)| state == "InSync")
        })
    })
    .await;
}

/// Makes the namespaces `names` in `member`.
pub(crate) async fn make_namespaces(member: &ControlPlane, names: &[&str]) {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{ObjectMeta, PostParams};
    let namespaces = Api::<Namespace>::all(member.client().await.expect("client"));
    for name in names {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
    }
}

/// A provider with a member named after each of `names`: the namespace of
/// that name in `member`, cached on its own.
pub(crate) async fn namespace_members(member: &ControlPlane, names: &[&str]) -> TestProvider {
    let provider = TestProvider::default();
    let client = member.client().await.expect("client");
    for name in names {
        let cache = Cache::with_options(
            *name,
            client.clone(),
            CacheOptions::default().namespace(Some(name.to_string())),
        );
        provider
            .clusters
            .add(*name, Cluster::with_cache(*name, client.clone(), cache))
            .expect("add");
    }
    provider
}
