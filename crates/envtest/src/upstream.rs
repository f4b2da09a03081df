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
/// and `PlacementDecision` CRDs and the credential plugins. v0.1.2 is the
/// newest release the module proxy serves (v0.2.0, with
/// `multicluster.x-k8s.io/v1alpha2`, is refused: 403).
pub const CLUSTER_INVENTORY_API: Module = Module {
    path: "sigs.k8s.io/cluster-inventory-api",
    version: "v0.1.2",
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

/// The `ClusterProfile` CRD (`multicluster.x-k8s.io/v1alpha1`) as the
/// Cluster Inventory API publishes it.
pub async fn cluster_profile_crd() -> Result<String, Error> {
    CLUSTER_INVENTORY_API
        .file("config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml")
        .await
}

/// The `PlacementDecision` CRD (`multicluster.x-k8s.io/v1alpha1`) as the
/// Cluster Inventory API publishes it.
pub async fn placement_decision_crd() -> Result<String, Error> {
    CLUSTER_INVENTORY_API
        .file("config/crd/bases/multicluster.x-k8s.io_placementdecisions.yaml")
        .await
}

/// The Cluster API `Cluster` CRD (v1beta1 and v1beta2, v1beta2 stored) as
/// Cluster API publishes it: without the conversion webhook that a real
/// installation adds, so v1beta1 objects keep only the fields v1beta2 has.
pub async fn cluster_api_cluster_crd() -> Result<String, Error> {
    CLUSTER_API
        .file("core/config/crd/bases/cluster.x-k8s.io_clusters.yaml")
        .await
}
