//! CRD installation and the optional kube-controller-manager.

mod common;

use std::time::Duration;

use common::until_object;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Resource;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, PostParams,
};
use multicluster_envtest::ControlPlane;

const DEADLINE: Duration = Duration::from_secs(60);

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.test
spec:
  group: example.test
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.test
spec:
  group: example.test
  scope: Cluster
  names: {plural: gadgets, singular: gadget, kind: Gadget, listKind: GadgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

#[tokio::test]
async fn installed_crds_are_served_immediately() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let names = cp.install_crds(WIDGET_CRD).await.expect("install");
    assert_eq!(names, ["widgets.example.test", "gadgets.example.test"]);

    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("example.test", "v1", "Widget"));
    let widgets = Api::<DynamicObject>::namespaced_with(
        cp.client().await.expect("client"),
        "default",
        &resource,
    );
    let mut widget = DynamicObject::new("w1", &resource);
    widget.data = serde_json::json!({"spec": {"size": 3}});
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("create widget");
    let stored = widgets.get("w1").await.expect("get widget");
    assert_eq!(stored.data["spec"]["size"], 3);

    // Installing again is idempotent.
    cp.install_crds(WIDGET_CRD).await.expect("reinstall");
}

#[tokio::test]
async fn crd_yaml_that_is_not_a_crd_is_a_clear_error() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let err = cp
        .install_crds("apiVersion: v1\nkind: CustomResourceDefinition\nmetadata: {}\nspec: {}\n")
        .await
        .expect_err("invalid CRD");
    assert!(err.to_string().contains("CRD"), "{err}");
}

#[tokio::test]
async fn the_controller_manager_finalizes_namespaces_and_collects_garbage() {
    let cp = ControlPlane::builder()
        .controller_manager(true)
        .start()
        .await
        .expect("control plane starts");
    let client = cp.client().await.expect("client");

    // Garbage collection: deleting the owner removes the dependent.
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let owner = config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("owner");
    let owner_ref = owner.controller_owner_ref(&()).expect("owner reference");
    config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("dependent".into()),
                    owner_references: Some(vec![owner_ref]),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("dependent");
    config_maps
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete owner");
    until_object(
        DEADLINE,
        &config_maps,
        "dependent",
        "the dependent to be collected",
        |dependent| dependent.is_none(),
    )
    .await;

    // Namespace finalization: a deleted namespace with content goes away.
    let namespaces = Api::<Namespace>::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("doomed".into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .expect("namespace");
    Api::<ConfigMap>::namespaced(client, "doomed")
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("content".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("content");
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete namespace");
    until_object(
        DEADLINE,
        &namespaces,
        "doomed",
        "the namespace to be finalized",
        |namespace| namespace.is_none(),
    )
    .await;
}
