//! Installing CustomResourceDefinitions and waiting until they are served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};

use crate::{ControlPlane, Error};

/// A CRD of the tests' own, not an upstream type: `widgets.example.com`,
/// version `v1`, kind `Widget`, namespaced, with an integer `spec.size`.
/// For a member that serves a resource another lacks.
pub const WIDGETS_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
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
"#;

/// How long a CRD may take to become established.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);

impl ControlPlane {
    /// Applies every CustomResourceDefinition in `yaml` (one or more
    /// `---`-separated documents) and waits until each is established, so
    /// its resources can be used at once. Returns the CRD names.
    pub async fn install_crds(&self, yaml: &str) -> Result<Vec<String>, Error> {
        let crds: Vec<CustomResourceDefinition> =
            serde_saphyr::from_str_multiple(yaml).map_err(|err| Error::Crd {
                name: "<yaml>".into(),
                reason: format!("not a list of CustomResourceDefinitions: {err}"),
            })?;
        let api = Api::<CustomResourceDefinition>::all(self.client().await?);
        let mut names = Vec::with_capacity(crds.len());
        for crd in &crds {
            let name = crd.metadata.name.clone().ok_or_else(|| Error::Crd {
                name: "<unnamed>".into(),
                reason: "metadata.name is missing".into(),
            })?;
            api.patch(
                &name,
                &PatchParams::apply("multicluster-envtest").force(),
                &Patch::Apply(crd),
            )
            .await
            .map_err(|err| Error::Crd {
                name: name.clone(),
                reason: err.to_string(),
            })?;
            names.push(name);
        }
        for name in &names {
            let established = await_condition(api.clone(), name, conditions::is_crd_established());
            match tokio::time::timeout(ESTABLISH_TIMEOUT, established).await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => {
                    return Err(Error::Crd {
                        name: name.clone(),
                        reason: err.to_string(),
                    });
                }
                Err(_) => {
                    return Err(Error::Crd {
                        name: name.clone(),
                        reason: format!("not established within {ESTABLISH_TIMEOUT:?}"),
                    });
                }
            }
        }
        Ok(names)
    }
}
