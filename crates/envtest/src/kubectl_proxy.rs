//! `kubectl proxy` in front of a control plane: the API server over plain
//! HTTP on loopback, authenticated by the proxy with the admin identity.
//! A kubeconfig naming an `http://` server is what a developer gets from
//! it, and the only way to have a real API server answer plain HTTP.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::config::{AuthInfo, Kubeconfig};

use crate::binaries::Binaries;
use crate::process::Process;
use crate::{ControlPlane, Error};

/// How long `kubectl proxy` may take to say where it serves.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `kubectl proxy` for one control plane, stopped when dropped.
pub struct KubectlProxy {
    process: Mutex<Option<Process>>,
    kubectl: PathBuf,
    admin_kubeconfig: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
}

impl KubectlProxy {
    /// Starts `kubectl proxy` on a free loopback port for `control_plane`,
    /// with its admin kubeconfig.
    pub async fn start(control_plane: &ControlPlane) -> Result<Self, Error> {
        let kubectl = Binaries::locate()?.kubectl;
        let dir = tempfile::Builder::new()
            .prefix("multicluster-envtest-kubectl-")
            .tempdir()
            .map_err(|source| Error::Io {
                what: "creating a directory for kubectl proxy's log".into(),
                source,
            })?;
        let mut proxy = Self {
            process: Mutex::new(None),
            kubectl,
            admin_kubeconfig: control_plane.kubeconfig_path().to_path_buf(),
            port: 0,
            dir,
        };
        proxy.port = proxy.spawn(0).await?;
        Ok(proxy)
    }

    /// The proxy's URL, `http://127.0.0.1:<port>`.
    pub fn server(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig for the proxy: its `http://` server and no credentials
    /// (the proxy adds the admin's).
    pub fn kubeconfig(&self) -> Kubeconfig {
        let mut kubeconfig = crate::kubeconfig::build(
            "kubectl-proxy",
            &self.server(),
            "",
            crate::kubeconfig::Credentials::Token(String::new()),
        );
        for named in &mut kubeconfig.clusters {
            if let Some(cluster) = named.cluster.as_mut() {
                cluster.certificate_authority_data = None;
            }
        }
        for named in &mut kubeconfig.auth_infos {
            named.auth_info = Some(AuthInfo::default());
        }
        kubeconfig
    }

    /// Stops the proxy: connections to its port are refused until
    /// [`KubectlProxy::start_again`].
    pub fn stop(&self) {
        self.process
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// Starts a stopped proxy again on the same port. Does nothing to a
    /// running one.
    pub async fn start_again(&self) -> Result<(), Error> {
        let running = self
            .process
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if !running {
            self.spawn(self.port).await?;
        }
        Ok(())
    }

    /// Starts `kubectl proxy` on `port` (0: any free port) and returns the
    /// port it serves on, read from what it prints.
    async fn spawn(&self, port: u16) -> Result<u16, Error> {
        let args: Vec<OsString> = [
            "proxy".to_string(),
            format!("--kubeconfig={}", self.admin_kubeconfig.display()),
            "--address=127.0.0.1".to_string(),
            format!("--port={port}"),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        let mut process = Process::spawn(
            "kubectl",
            &self.kubectl,
            args,
            self.dir.path().join("kubectl-proxy.log"),
        )?;
        let deadline = Instant::now() + START_TIMEOUT;
        let port = loop {
            let tail = process.log_tail();
            if let Some(port) = tail
                .lines()
                .find_map(|line| line.split("Starting to serve on 127.0.0.1:").nth(1))
                .and_then(|port| port.trim().parse::<u16>().ok())
            {
                break port;
            }
            if let Some(status) = process.exit_status() {
                return Err(Error::Exited {
                    name: "kubectl",
                    status: status.to_string(),
                    log_tail: tail,
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::Io {
                    what: format!(
                        "kubectl proxy did not say where it serves within {START_TIMEOUT:?}; its log:\n{tail}"
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        *self.process.lock().unwrap_or_else(|e| e.into_inner()) = Some(process);
        Ok(port)
    }
}
