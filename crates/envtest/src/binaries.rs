//! Finding the `etcd`, `kube-apiserver`, `kube-controller-manager` and
//! `kubectl` executables.
//!
//! Lookup order, first match wins per binary:
//!
//! 1. `TEST_ASSET_ETCD`, `TEST_ASSET_KUBE_APISERVER`,
//!    `TEST_ASSET_KUBE_CONTROLLER_MANAGER`, `TEST_ASSET_KUBECTL`: a path to
//!    that one binary (the variables controller-runtime's envtest reads);
//! 2. `KUBEBUILDER_ASSETS`: a directory holding the binaries (envtest's
//!    standard variable, so assets installed by `setup-envtest` work as is);
//! 3. the build cache that `hack/controlplane/build.sh` fills:
//!    `$MCR_CACHE_DIR/controlplane/kubernetes-<version>-etcd-<version>`, where
//!    `MCR_CACHE_DIR` defaults to `$XDG_CACHE_HOME/multicluster-runtime` or
//!    `~/.cache/multicluster-runtime`.

use std::path::{Path, PathBuf};

use crate::Error;

/// The Kubernetes release the cached binaries are built from. Kept equal to
/// `hack/controlplane/go.mod` (a unit test checks).
pub const KUBERNETES_VERSION: &str = "v1.35.4";
/// The etcd release the cached binaries are built from.
pub const ETCD_VERSION: &str = "v3.6.5";

/// The command that fills the binary cache, named in errors.
pub(crate) const BUILD_COMMAND: &str = "make controlplane (or hack/controlplane/build.sh)";

/// Paths of the control plane executables.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// The `etcd` executable.
    pub etcd: PathBuf,
    /// The `kube-apiserver` executable.
    pub kube_apiserver: PathBuf,
    /// The `kube-controller-manager` executable, needed only by control planes
    /// started with [`crate::ControlPlaneBuilder::controller_manager`].
    pub kube_controller_manager: PathBuf,
    /// The `kubectl` executable, needed only by [`crate::KubectlProxy`].
    pub kubectl: PathBuf,
}

impl Binaries {
    /// Finds the binaries from the environment and the build cache.
    ///
    /// `kube-controller-manager` and `kubectl` are looked up but not
    /// required here; starting what needs them checks that they exist.
    pub fn locate() -> Result<Self, Error> {
        let assets = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from);
        let cache = cache_dir();
        let find = |name: &str, variable: &str| -> Result<PathBuf, Error> {
            let mut tried = Vec::new();
            if let Some(path) = std::env::var_os(variable).map(PathBuf::from) {
                if is_executable(&path) {
                    return Ok(path);
                }
                tried.push(format!("${variable}={}", path.display()));
            }
            for dir in assets.iter().chain(cache.iter()) {
                let path = dir.join(name);
                if is_executable(&path) {
                    return Ok(path);
                }
                tried.push(path.display().to_string());
            }
            Err(Error::BinaryNotFound {
                name: name.to_string(),
                tried: tried.join(", "),
                build_command: BUILD_COMMAND,
            })
        };
        let etcd = find("etcd", "TEST_ASSET_ETCD")?;
        let kube_apiserver = find("kube-apiserver", "TEST_ASSET_KUBE_APISERVER")?;
        // Default to the directory kube-apiserver came from, where a build
        // places it; the start of a control plane reports it if absent.
        let kube_controller_manager = find(
            "kube-controller-manager",
            "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
        )
        .unwrap_or_else(|_| sibling(&kube_apiserver, "kube-controller-manager"));
        let kubectl = find("kubectl", "TEST_ASSET_KUBECTL")
            .unwrap_or_else(|_| sibling(&kube_apiserver, "kubectl"));
        Ok(Self {
            etcd,
            kube_apiserver,
            kube_controller_manager,
            kubectl,
        })
    }
}

/// The cache directory `hack/controlplane/build.sh` writes for the pinned
/// versions, or `None` when no home or cache directory is known.
pub fn cache_dir() -> Option<PathBuf> {
    let root = match std::env::var_os("MCR_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("XDG_CACHE_HOME") {
            Some(dir) => PathBuf::from(dir).join("multicluster-runtime"),
            None => PathBuf::from(std::env::var_os("HOME")?)
                .join(".cache")
                .join("multicluster-runtime"),
        },
    };
    Some(root.join("controlplane").join(format!(
        "kubernetes-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"
    )))
}

fn sibling(path: &Path, name: &str) -> PathBuf {
    path.parent()
        .map(|dir| dir.join(name))
        .unwrap_or_else(|| PathBuf::from(name))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The crate and the build script must agree on versions, or the crate
    /// looks for binaries in a directory the script never fills.
    #[test]
    fn versions_match_the_pinned_go_module() {
        let go_mod = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/controlplane/go.mod");
        let Ok(text) = std::fs::read_to_string(&go_mod) else {
            // Published crate: the workspace's hack/ directory is not shipped.
            assert!(!go_mod.parent().is_some_and(Path::exists));
            return;
        };
        let version_of = |module: &str| {
            text.lines()
                .map(str::split_whitespace)
                .find_map(|mut words| (words.next() == Some(module)).then(|| words.next()))
                .flatten()
                .map(str::to_string)
        };
        assert_eq!(
            version_of("k8s.io/kubernetes").as_deref(),
            Some(KUBERNETES_VERSION)
        );
        assert_eq!(
            version_of("go.etcd.io/etcd/server/v3").as_deref(),
            Some(ETCD_VERSION)
        );
    }
}
