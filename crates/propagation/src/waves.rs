//! The order in which a member gets a hub object's objects: in waves by
//! kind, each wave applied once every object of the one before is
//! available, so a custom resource never meets a member whose definition
//! is not established yet and a quota never a namespace not made yet.
//!
//! | wave | kinds |
//! |---|---|
//! | 0 | `Namespace`, `CustomResourceDefinition` |
//! | 1 | `ServiceAccount`, `Role`, `ClusterRole`, `RoleBinding`, `ClusterRoleBinding` |
//! | 2 | `ConfigMap`, `Secret`, `ResourceQuota`, `LimitRange`, `PersistentVolumeClaim`, `Service`, `PriorityClass`, `StorageClass` |
//! | 3 | everything else: workloads, custom resources |
//!
//! A desired object with the annotation [`WAVE_ANNOTATION`] (a number)
//! goes in that wave instead. Within a wave, objects keep the order
//! `desired` gave them. Letting go goes the other way: the latest wave
//! first, an earlier one once those after it are gone.

use kube::api::ApiResource;

use crate::Desired;

/// Annotation on a desired object naming its wave (`"0"`, `"5"`, ...),
/// instead of the one its kind gives it.
pub const WAVE_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/wave";

/// The wave `object` goes in.
pub(super) fn wave_of(object: &Desired) -> u32 {
    let named = object
        .object
        .pointer("/metadata/annotations")
        .and_then(|annotations| annotations.get(WAVE_ANNOTATION))
        .and_then(serde_json::Value::as_str);
    wave_named_or_by_kind(named, &object.resource)
}

/// The wave of an object of `resource` with `annotations` (as a member
/// holds it: the desired object's annotations are applied with it).
pub(super) fn wave_for(
    resource: &ApiResource,
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> u32 {
    let named = annotations
        .and_then(|annotations| annotations.get(WAVE_ANNOTATION))
        .map(String::as_str);
    wave_named_or_by_kind(named, resource)
}

fn wave_named_or_by_kind(named: Option<&str>, resource: &ApiResource) -> u32 {
    if let Some(wave) = named.and_then(|wave| wave.trim().parse().ok()) {
        return wave;
    }
    match (resource.group.as_str(), resource.kind.as_str()) {
        ("", "Namespace") | ("apiextensions.k8s.io", "CustomResourceDefinition") => 0,
        ("", "ServiceAccount")
        | (
            "rbac.authorization.k8s.io",
            "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding",
        ) => 1,
        (
            "",
            "ConfigMap"
            | "Secret"
            | "ResourceQuota"
            | "LimitRange"
            | "PersistentVolumeClaim"
            | "Service",
        )
        | ("scheduling.k8s.io", "PriorityClass")
        | ("storage.k8s.io", "StorageClass") => 2,
        _ => 3,
    }
}

/// `desired` in waves, in order; each wave's objects in the order given.
pub(super) fn in_waves(desired: Vec<Desired>) -> Vec<Vec<Desired>> {
    let mut waves: std::collections::BTreeMap<u32, Vec<Desired>> = Default::default();
    for object in desired {
        waves.entry(wave_of(&object)).or_default().push(object);
    }
    waves.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
    use kube::api::ObjectMeta;

    fn named<T: Default + kube::Resource<DynamicType = ()> + serde::Serialize>(
        name: &str,
        annotations: Option<(&str, &str)>,
    ) -> Desired {
        let mut object = T::default();
        *object.meta_mut() = ObjectMeta {
            name: Some(name.to_string()),
            annotations: annotations
                .map(|(k, v)| [(k.to_string(), v.to_string())].into_iter().collect()),
            ..ObjectMeta::default()
        };
        Desired::new(&object).expect("desired")
    }

    #[test]
    fn namespaces_come_before_what_goes_in_them_whatever_the_order_given() {
        let waves = in_waves(vec![
            named::<ResourceQuota>("q", None),
            named::<Namespace>("n", None),
            named::<ResourceQuota>("late", Some((WAVE_ANNOTATION, "7"))),
        ]);
        let kinds: Vec<Vec<String>> = waves
            .iter()
            .map(|wave| {
                wave.iter()
                    .map(|d| d.name().unwrap_or_default().to_string())
                    .collect()
            })
            .collect();
        assert_eq!(kinds, vec![vec!["n"], vec!["q"], vec!["late"]]);
    }
}
