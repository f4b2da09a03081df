//! Real Kubernetes control planes for integration tests.
//!
//! `multicluster-envtest` starts an `etcd` and a `kube-apiserver` on loopback,
//! the way controller-runtime's envtest does for Go: real HTTPS, a generated
//! CA, RBAC authorization, and an admin identity. Tests talk to it through
//! ordinary kubeconfigs, so what they exercise is what production runs.
//!
//! ```no_run
//! # async fn demo() -> Result<(), multicluster_envtest::Error> {
//! use multicluster_envtest::ControlPlane;
//!
//! let control_plane = ControlPlane::start().await?;
//! let client = control_plane.client().await?;
//! // ... create objects, run a controller against `control_plane.kubeconfig()` ...
//! # drop(client);
//! # Ok(()) }
//! ```
//!
//! Binaries are found as described in [`binaries`]; in this repository
//! `make controlplane` builds and caches them. Several control planes may run
//! at once; each is stopped and its data removed when dropped.
//!
//! Besides starting, a control plane can install CRDs
//! ([`ControlPlane::install_crds`]), mint identities
//! ([`ControlPlane::user_kubeconfig`],
//! [`ControlPlane::service_account_kubeconfig`], exec credential plugins in
//! [`plugins`]), stop and restart its API
//! server for fault tests ([`ControlPlane::restart_api_server`]) and run a
//! `kube-controller-manager` ([`ControlPlaneBuilder::controller_manager`]);
//! [`KubectlProxy`] serves its API over plain HTTP.
//! Upstream CRDs come from the Go module proxy ([`upstream`]). Kubeconfigs
//! that try to run a command, read a file or reach a server, with the
//! traps that tell whether they did, are in [`traps`].

pub mod binaries;
mod control_plane;
mod crds;
mod identity;
pub mod jaeger;
pub mod kind_nodes;
mod kubeconfig;
mod kubectl_proxy;
pub mod monitoring;
pub mod panics;
mod pki;
pub mod played;
pub mod plugins;
mod process;
pub mod tools;
pub mod traps;
pub mod upstream;

use std::time::Duration;

pub use binaries::Binaries;
pub use control_plane::{ControlPlane, ControlPlaneBuilder};
pub use crds::WIDGETS_CRD;
pub use identity::config_map_rules;
pub use kubeconfig::{client_for, to_yaml};
pub use kubectl_proxy::KubectlProxy;
pub use pki::ServingFiles;

/// Why a control plane could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary was not found in any of the places searched.
    #[error(
        "{name} not found (looked in: {tried}); build the test control plane with `{build_command}` or set KUBEBUILDER_ASSETS"
    )]
    BinaryNotFound {
        /// The executable's name.
        name: String,
        /// The places searched.
        tried: String,
        /// The command that builds the binaries.
        build_command: &'static str,
    },
    /// A process could not be started.
    #[error("could not start {name} ({}): {source}", path.display())]
    Spawn {
        /// The process's name.
        name: &'static str,
        /// The executable.
        path: std::path::PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A process could not be paused or resumed.
    #[error("signalling {name}: {source}")]
    Signal {
        /// The process's name.
        name: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A process exited while it should be running.
    #[error("{name} exited ({status}); last lines of its log:\n{log_tail}")]
    Exited {
        /// The process's name.
        name: &'static str,
        /// Its exit status.
        status: String,
        /// The end of its log.
        log_tail: String,
    },
    /// The API server did not become ready in time.
    #[error(
        "kube-apiserver not ready within {timeout:?} (last probe: {last_error}); last lines of its log:\n{log_tail}"
    )]
    NotReady {
        /// The timeout that passed.
        timeout: Duration,
        /// The last readiness probe's error.
        last_error: String,
        /// The end of the API server's log.
        log_tail: String,
    },
    /// Generating certificates or keys failed.
    #[error("generating certificates: {0}")]
    Certificates(String),
    /// A kubeconfig could not be rendered or loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// A client could not be built.
    #[error("building a client: {0}")]
    Client(#[source] kube::Error),
    /// An API call made on the test's behalf failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A CRD could not be installed.
    #[error("installing CRD {name}: {reason}")]
    Crd {
        /// The CRD's name.
        name: String,
        /// Why it failed.
        reason: String,
    },
    /// A container could not be made or used (podman's words).
    #[error("container: {0}")]
    Container(String),
    /// The trace receiver could not be built, started or read.
    #[error("trace receiver: {0}")]
    TraceReceiver(String),
    /// A file of an upstream Go module could not be had.
    #[error("upstream module: {0}")]
    Upstream(String),
    /// A file system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether a process exited because its port was taken meanwhile.
    pub(crate) fn is_port_clash(&self) -> bool {
        matches!(self, Error::Exited { log_tail, .. } | Error::NotReady { log_tail, .. }
            if log_tail.contains("address already in use"))
    }
}
