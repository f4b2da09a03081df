//! Files of upstream Go modules (CRDs, mostly), taken from the Go module
//! proxy as the control plane's binaries are, so tests run against the
//! schemas the real projects publish rather than hand-written ones.
//!
//! ```no_run
//! # async fn demo(control_plane: &multicluster_envtest::ControlPlane) -> Result<(), multicluster_envtest::Error> {
//! use multicluster_envtest::upstream::CLUSTER_API;
//!
//! let crd = CLUSTER_API.file("core/config/crd/bases/cluster.x-k8s.io_clusters.yaml").await?;
//! control_plane.install_crds(&crd).await?;
//! # Ok(()) }
//! ```
//!
//! The module is downloaded once with `go mod download` (into the Go
//! module cache, `go env GOMODCACHE`) and read from there afterwards. The
//! installed Go toolchain is used as is (`GOTOOLCHAIN=local`).

use std::path::PathBuf;

use crate::Error;

/// A Go module at one version.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// Its path, e.g. `sigs.k8s.io/cluster-api`.
    pub path: &'static str,
    /// Its version, e.g. `v1.14.2`.
    pub version: &'static str,
}

/// Cluster API, whose `Cluster` CRD (v1beta1 and v1beta2) the Cluster API
/// provider reads.
pub const CLUSTER_API: Module = Module {
    path: "sigs.k8s.io/cluster-api",
    version: "v1.14.2",
};

/// The Cluster Inventory API (KEP-4322, KEP-5339): the `ClusterProfile`
/// and `PlacementDecision` CRDs (`multicluster.x-k8s.io/v1alpha1`) and the
/// credential plugins. v0.1.3 is its newest release; upstream's main
/// branch adds `v1alpha2`, which no release carries yet (see
/// [`cluster_profile_crd`]).
pub const CLUSTER_INVENTORY_API: Module = Module {
    path: "sigs.k8s.io/cluster-inventory-api",
    version: "v0.1.3",
};

/// The prometheus-operator, whose `ServiceMonitor` CRD
/// (`monitoring.coreos.com/v1`, under `example/prometheus-operator-crd/`)
/// the Helm chart's ServiceMonitor is installed against. v0.85.0 is the
/// newest version of the root module the module proxy serves.
pub const PROMETHEUS_OPERATOR: Module = Module {
    path: "github.com/prometheus-operator/prometheus-operator",
    version: "v0.85.0",
};

impl Module {
    /// The directory the module is unpacked in, downloading it first if
    /// needed.
    pub async fn dir(&self) -> Result<PathBuf, Error> {
        let what = format!("go mod download {}@{}", self.path, self.version);
        let output = tokio::process::Command::new("go")
            .args(["mod", "download", "-json"])
            .arg(format!("{}@{}", self.path, self.version))
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=mod")
            // Outside any module of ours: the download needs none.
            .current_dir(std::env::temp_dir())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|source| Error::Io {
                what: what.clone(),
                source,
            })?;
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Downloaded {
            dir: Option<String>,
            error: Option<String>,
        }
        let downloaded: Downloaded = serde_json::from_slice(&output.stdout).map_err(|_| {
            Error::Upstream(format!(
                "{what} printed no module description ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        })?;
        match (downloaded.dir, downloaded.error) {
            (Some(dir), None) => Ok(PathBuf::from(dir)),
            (_, Some(error)) => Err(Error::Upstream(format!("{what}: {error}"))),
            (None, None) => Err(Error::Upstream(format!("{what}: no directory given"))),
        }
    }

    /// The text of `path` in the module.
    pub async fn file(&self, path: &str) -> Result<String, Error> {
        let file = self.dir().await?.join(path);
        std::fs::read_to_string(&file).map_err(|source| Error::Io {
            what: format!("reading {} of {}@{}", path, self.path, self.version),
            source,
        })
    }
}

/// The `ClusterProfile` CRD as upstream's main branch serves it: v1alpha1
/// exactly as the released module publishes it (still the storage version,
/// now deprecated with a warning) and v1alpha2 beside it, written from
/// upstream's type file (`upstream/clusterprofile-v1alpha2.yaml` names the
/// commit), no conversion webhook between them.
pub async fn cluster_profile_crd() -> Result<String, Error> {
    with_v1alpha2(
        released_cluster_profile_crd().await?,
        include_str!("../upstream/clusterprofile-v1alpha2.yaml"),
        Some("multicluster"),
    )
}

/// The `ClusterProfile` CRD of the released module: v1alpha1 only, as an
/// inventory installed from a release serves it.
pub async fn released_cluster_profile_crd() -> Result<String, Error> {
    CLUSTER_INVENTORY_API
        .file("config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml")
        .await
}

/// The `PlacementDecision` CRD as upstream's main branch serves it: the
/// released v1alpha1 (storage, deprecated) and v1alpha2 beside it (see
/// `upstream/placementdecision-v1alpha2.yaml` for what it follows).
pub async fn placement_decision_crd() -> Result<String, Error> {
    with_v1alpha2(
        released_placement_decision_crd().await?,
        include_str!("../upstream/placementdecision-v1alpha2.yaml"),
        None,
    )
}

/// The `PlacementDecision` CRD of the released module: v1alpha1 only.
pub async fn released_placement_decision_crd() -> Result<String, Error> {
    CLUSTER_INVENTORY_API
        .file("config/crd/bases/multicluster.x-k8s.io_placementdecisions.yaml")
        .await
}

/// `released` (a one-version v1alpha1 CRD) with the v1alpha2 entry
/// `v1alpha2` served beside it: v1alpha1 stays the storage version and is
/// marked deprecated, as upstream's main marks it; `category`, if given,
/// is added to the CRD's categories. Returned as JSON, which
/// [`crate::ControlPlane::install_crds`] reads as YAML.
fn with_v1alpha2(
    released: String,
    v1alpha2: &str,
    category: Option<&str>,
) -> Result<String, Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinition, CustomResourceDefinitionVersion,
    };
    let invalid = |what: &str, err: &dyn std::fmt::Display| {
        Error::Upstream(format!(
            "{what} of {}@{}: {err}",
            CLUSTER_INVENTORY_API.path, CLUSTER_INVENTORY_API.version
        ))
    };
    let mut crd: CustomResourceDefinition =
        serde_saphyr::from_str(&released).map_err(|err| invalid("the released CRD", &err))?;
    let v1alpha2: CustomResourceDefinitionVersion = serde_saphyr::from_str(v1alpha2)
        .map_err(|err| invalid("the v1alpha2 version entry", &err))?;
    let kind = crd.spec.names.kind.clone();
    let Some(v1alpha1) = crd
        .spec
        .versions
        .iter_mut()
        .find(|version| version.name == "v1alpha1")
    else {
        return Err(invalid("the released CRD", &"it has no v1alpha1"));
    };
    v1alpha1.deprecated = Some(true);
    v1alpha1.deprecation_warning = Some(format!(
        "multicluster.x-k8s.io/v1alpha1 {kind} is deprecated; use multicluster.x-k8s.io/v1alpha2 {kind}"
    ));
    crd.spec.versions.push(v1alpha2);
    if let Some(category) = category {
        crd.spec
            .names
            .categories
            .get_or_insert_default()
            .push(category.to_string());
    }
    serde_json::to_string(&crd).map_err(|err| invalid("the merged CRD", &err))
}

/// The Cluster API `Cluster` CRD (v1beta1 and v1beta2, v1beta2 stored) as
/// Cluster API publishes it: without the conversion webhook that a real
/// installation adds, so v1beta1 objects keep only the fields v1beta2 has.
pub async fn cluster_api_cluster_crd() -> Result<String, Error> {
    CLUSTER_API
        .file("core/config/crd/bases/cluster.x-k8s.io_clusters.yaml")
        .await
}
