//! {{project-name}}: a fleet controller on multicluster-runtime. Every
//! ConfigMap labelled `example.com/greet=true`, in every cluster of the
//! fleet, gets the annotation `example.com/greeted-by` naming its cluster.
//!
//! Replace [`reconcile`] with what your controller does; the manager, the
//! provider that finds the clusters and the test stay as they are.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use multicluster_runtime::controller::{Action, Controller, Request, Watch, filters};
use multicluster_runtime::{Cluster, Manager};

/// The controller's name: its field manager, its metrics' label.
pub const NAME: &str = "{{project-name}}";
/// The label that asks for a greeting.
pub const GREET_LABEL: &str = "example.com/greet";
/// The annotation the controller writes: the name of the object's cluster.
pub const GREETED_BY: &str = "example.com/greeted-by";
{%- if provider == "kubeconfig" %}
/// Where the clusters' kubeconfig Secrets live, in the cluster this
/// process runs against (each labelled
/// `sigs.k8s.io/multicluster-runtime-kubeconfig=true`, its kubeconfig under
/// the key `kubeconfig`).
pub const FLEET_NAMESPACE: &str = "fleet";
{%- endif %}

/// Why a reconcile failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the cluster's cache failed.
    #[error("reading {0} from the cache: {1}")]
    Cache(Request, #[source] multicluster_runtime::Error),
    /// Writing the annotation failed.
    #[error("annotating {0}: {1}")]
    Write(Request, #[source] kube::Error),
}

/// The manager of the fleet, on the cluster `local` talks to.
pub fn manager(local: kube::Client) -> Manager {
{%- if provider == "kubeconfig" %}
    use multicluster_provider_kubeconfig::{KubeconfigOptions, KubeconfigProvider};
    // A kubeconfig from a Secret may run no exec plugin and name no local
    // file unless allowed (`.kubeconfig_policy(...)`).
    let provider = KubeconfigProvider::new(
        local.clone(),
        KubeconfigOptions::default().namespace(FLEET_NAMESPACE.to_string()),
    );
{%- else %}
    use multicluster_provider_namespace::{
        NamespaceOptions, NamespaceProvider, without_system_namespaces,
    };
    // Every namespace but those Kubernetes keeps for itself is a cluster.
    let provider = NamespaceProvider::new(
        local.clone(),
        NamespaceOptions::default().namespace_selector(without_system_namespaces()),
    );
{%- endif %}
    Manager::builder(Cluster::local(local))
        .provider(Arc::new(provider))
        .build()
}

/// The controller: labelled ConfigMaps of every cluster, one reconcile per
/// object per cluster.
pub fn controller() -> Result<Controller, multicluster_runtime::Error> {
    Controller::builder(NAME)
        .for_resource(Watch::<ConfigMap>::new().filter(filters::labels(
            [(GREET_LABEL.to_string(), "true".to_string())].into(),
        )))
        .build(reconcile)
}

/// Annotates the ConfigMap of `request` with the name of its cluster.
pub async fn reconcile(request: Request, cluster: Cluster) -> Result<Action, Error> {
    // The cluster's shared cache: no request to its API server.
    let Some(object) = cluster
        .cache()
        .get::<ConfigMap>(request.namespace.as_deref(), &request.name)
        .await
        .map_err(|err| Error::Cache(request.clone(), err))?
    else {
        return Ok(Action::await_change());
    };
    let name = cluster.name().to_string();
    let greeted = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(GREETED_BY));
    if greeted == Some(&name) {
        return Ok(Action::await_change());
    }
    let namespace = request.namespace.as_deref().unwrap_or("default");
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"annotations": {GREETED_BY: name}},
    });
    Api::<ConfigMap>::namespaced(cluster.client(), namespace)
        .patch(
            &request.name,
            &PatchParams::apply(NAME),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|err| Error::Write(request.clone(), err))?;
    tracing::info!(cluster = %request.cluster, %namespace, name = %request.name, "greeted");
    Ok(Action::await_change())
}
