//! Starting, stopping and restarting one control plane.

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::config::{ExecConfig, ExecInteractiveMode, Kubeconfig};
use tracing::instrument::WithSubscriber;

use crate::Error;
use crate::binaries::Binaries;
use crate::kubeconfig::{self, Credentials};
use crate::pki::{CertificateAuthority, ServiceAccountKeys};
use crate::process::Process;

/// Options for [`ControlPlane::start`]; create with [`ControlPlane::builder`].
#[derive(Clone, Debug)]
pub struct ControlPlaneBuilder {
    controller_manager: bool,
    start_timeout: Duration,
    binaries: Option<Binaries>,
    api_server_args: Vec<String>,
    audit: bool,
}

/// The audit log's name in the data directory.
const AUDIT_LOG: &str = "audit.log";

impl Default for ControlPlaneBuilder {
    fn default() -> Self {
        Self {
            controller_manager: false,
            start_timeout: Duration::from_secs(60),
            binaries: None,
            api_server_args: Vec::new(),
            audit: false,
        }
    }
}

impl ControlPlaneBuilder {
    /// Also run a `kube-controller-manager` with the namespace, garbage
    /// collector, service-account and Job controllers. Without it a
    /// deleted namespace stays `Terminating` and owner references never
    /// cascade. No kubelet runs: a Job's pods stay `Pending` until a test
    /// sets their phase, as a kubelet would.
    #[must_use]
    pub fn controller_manager(mut self, enabled: bool) -> Self {
        self.controller_manager = enabled;
        self
    }

    /// How long to wait for `/readyz` (default 60 s).
    #[must_use]
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Use these binaries instead of locating them ([`Binaries::locate`]).
    #[must_use]
    pub fn binaries(mut self, binaries: Binaries) -> Self {
        self.binaries = Some(binaries);
        self
    }

    /// Have the API server write an audit record (at the `Metadata`
    /// level) of every request it completes: the server's own account of
    /// what it was asked, read with [`ControlPlane::audit_events`].
    #[must_use]
    pub fn audit(mut self, enabled: bool) -> Self {
        self.audit = enabled;
        self
    }

    /// An extra `kube-apiserver` flag, e.g. `--feature-gates=...`. Later
    /// flags override the defaults.
    #[must_use]
    pub fn api_server_arg(mut self, arg: impl Into<String>) -> Self {
        self.api_server_args.push(arg.into());
        self
    }

    /// Starts etcd and kube-apiserver (and the controller manager when asked)
    /// and waits until the API server is ready.
    pub async fn start(self) -> Result<ControlPlane, Error> {
        let binaries = match self.binaries.clone() {
            Some(binaries) => binaries,
            None => Binaries::locate()?,
        };
        // Ports are chosen by binding to port 0 and releasing it; another
        // process may take one in between. Such a clash shows up as an early
        // exit with "address already in use", and a fresh set of ports fixes it.
        let mut attempt = 1;
        loop {
            match ControlPlane::start_once(&self, &binaries).await {
                Err(err) if attempt < 3 && err.is_port_clash() => {
                    tracing::warn!(attempt, %err, "port clash while starting; retrying with new ports");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }
}

/// A running etcd and kube-apiserver on loopback, with RBAC authorization, a
/// generated CA and an admin identity (`system:masters`).
///
/// Everything is stopped and removed when the value is dropped, also while a
/// failing test unwinds.
///
/// Clients are bound to the tokio runtime they are created in, so create them
/// with [`ControlPlane::client`] in the runtime that uses them.
pub struct ControlPlane {
    // Declared in stop order: fields drop top to bottom, and the data
    // directory must outlive the processes using it.
    controller_manager: Mutex<Option<Process>>,
    api_server: Mutex<Option<Process>>,
    etcd: Mutex<Option<Process>>,
    api_server_command: (PathBuf, Vec<OsString>),
    ca: CertificateAuthority,
    server: String,
    admin: Kubeconfig,
    admin_kubeconfig_path: PathBuf,
    start_timeout: Duration,
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Options for starting a control plane.
    pub fn builder() -> ControlPlaneBuilder {
        ControlPlaneBuilder::default()
    }

    /// Starts a control plane with default options.
    pub async fn start() -> Result<Self, Error> {
        Self::builder().start().await
    }

    /// Long on purpose: the control plane's start in order (certificates, etcd,
    /// the API server, the kubeconfigs, readiness), one step after another with
    /// nothing to choose between.
    async fn start_once(options: &ControlPlaneBuilder, binaries: &Binaries) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("multicluster-envtest-")
            .tempdir()
            .map_err(|source| Error::Io {
                what: "creating the control plane's data directory".into(),
                source,
            })?;
        let root = dir.path();
        let ca = CertificateAuthority::generate()?;
        let serving = ca.serving_pair()?;
        let sa_keys = ServiceAccountKeys::generate()?;
        let admin_cert = ca.client_pair("envtest-admin", Some("system:masters"))?;
        write(root, "ca.crt", ca.cert_pem())?;
        write(root, "apiserver.crt", &serving.cert)?;
        write(root, "apiserver.key", &serving.key)?;
        write(root, "sa.key", &sa_keys.private_pem)?;
        write(root, "sa.pub", &sa_keys.public_pem)?;

        let [etcd_client, etcd_peer, api_port] = free_ports()?;
        let etcd = Process::spawn(
            "etcd",
            &binaries.etcd,
            args([
                "--name=envtest".into(),
                format!("--data-dir={}", root.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-cluster=envtest=http://127.0.0.1:{etcd_peer}"),
                // Test data is thrown away; skipping fsync makes writes fast.
                "--unsafe-no-fsync=true".into(),
                "--quota-backend-bytes=8589934592".into(),
            ]),
            root.join("etcd.log"),
        )?;

        let mut api_server_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", root.join("certs").display()),
            format!("--tls-cert-file={}", root.join("apiserver.crt").display()),
            format!(
                "--tls-private-key-file={}",
                root.join("apiserver.key").display()
            ),
            format!("--client-ca-file={}", root.join("ca.crt").display()),
            format!(
                "--service-account-key-file={}",
                root.join("sa.pub").display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                root.join("sa.key").display()
            ),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            "--enable-priority-and-fairness=false".into(),
            "--storage-backend=etcd3".into(),
        ];
        if options.audit {
            write(
                root,
                "audit-policy.yaml",
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
            )?;
            api_server_args.push(format!(
                "--audit-policy-file={}",
                root.join("audit-policy.yaml").display()
            ));
            api_server_args.push(format!(
                "--audit-log-path={}",
                root.join(AUDIT_LOG).display()
            ));
        }
        api_server_args.extend(options.api_server_args.iter().cloned());
        let api_server_command = (binaries.kube_apiserver.clone(), args(api_server_args));
        let api_server = spawn_api_server(&api_server_command, root)?;

        let server = format!("https://127.0.0.1:{api_port}");
        // Named after the port, so the kubeconfigs of several control
        // planes merge (`KUBECONFIG=a:b`) without clashing contexts.
        let admin = kubeconfig::build(
            &format!("envtest-{api_port}"),
            &server,
            ca.cert_pem(),
            Credentials::Certificate {
                cert_pem: admin_cert.cert,
                key_pem: admin_cert.key,
            },
        );
        let admin_kubeconfig_path = root.join("admin.kubeconfig");
        write(root, "admin.kubeconfig", &kubeconfig::to_yaml(&admin)?)?;

        let control_plane = Self {
            controller_manager: Mutex::new(None),
            api_server: Mutex::new(Some(api_server)),
            etcd: Mutex::new(Some(etcd)),
            api_server_command,
            ca,
            server,
            admin,
            admin_kubeconfig_path,
            start_timeout: options.start_timeout,
            dir,
        };
        control_plane.wait_ready().await?;

        if options.controller_manager {
            control_plane.start_controller_manager(binaries)?;
        }
        Ok(control_plane)
    }

    fn start_controller_manager(&self, binaries: &Binaries) -> Result<(), Error> {
        let root = self.dir.path();
        let process = Process::spawn(
            "kube-controller-manager",
            &binaries.kube_controller_manager,
            args([
                format!("--kubeconfig={}", self.admin_kubeconfig_path.display()),
                "--controllers=namespace-controller,garbage-collector-controller,serviceaccount-controller,clusterrole-aggregation-controller,job-controller".into(),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                format!("--service-account-private-key-file={}", root.join("sa.key").display()),
                format!("--root-ca-file={}", root.join("ca.crt").display()),
            ]),
            root.join("kube-controller-manager.log"),
        )?;
        *lock(&self.controller_manager) = Some(process);
        Ok(())
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The CA certificate (PEM) that signed the serving certificate and that
    /// the API server trusts for client certificates.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The admin kubeconfig (`system:masters`), credentials inline; its
    /// context, cluster and user are named `envtest-<port>`, so the
    /// kubeconfigs of several control planes merge.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.admin
    }

    /// The admin kubeconfig, but trusting `other`'s CA instead of this
    /// control plane's: a client built from it fails TLS verification.
    pub fn kubeconfig_trusting(&self, other: &ControlPlane) -> Kubeconfig {
        let mut kubeconfig = self.admin.clone();
        let other_ca = other.admin.clusters[0]
            .cluster
            .as_ref()
            .and_then(|cluster| cluster.certificate_authority_data.clone());
        for named in &mut kubeconfig.clusters {
            if let Some(cluster) = named.cluster.as_mut() {
                cluster.certificate_authority_data = other_ca.clone();
            }
        }
        kubeconfig
    }

    /// The admin kubeconfig written to a file, for command-line tools.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig_path
    }

    /// How the API server is doing, for a failing test's message: whether
    /// it still runs (or how it ended), and the last lines of its log. The
    /// log goes with the control plane's directory when it is dropped.
    pub fn api_server_report(&self) -> String {
        match lock(&self.api_server).as_mut() {
            Some(process) => {
                let state = match process.exit_status() {
                    Some(status) => format!("exited ({status})"),
                    None => "running".to_string(),
                };
                format!(
                    "kube-apiserver {state}; its log ends:\n{}",
                    process.log_tail()
                )
            }
            None => "kube-apiserver stopped by the test".to_string(),
        }
    }

    /// A new admin client, bound to the current tokio runtime.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        kubeconfig::client_for(&self.admin).await
    }

    /// A kubeconfig for a user authenticated by a client certificate with
    /// common name `user` and, optionally, organisation `group`. The user has
    /// no permissions until RBAC grants some.
    pub fn user_kubeconfig(&self, user: &str, group: Option<&str>) -> Result<Kubeconfig, Error> {
        let pair = self.ca.client_pair(user, group)?;
        Ok(kubeconfig::build(
            user,
            &self.server,
            self.ca.cert_pem(),
            Credentials::Certificate {
                cert_pem: pair.cert,
                key_pem: pair.key,
            },
        ))
    }

    /// A client certificate and its key (both PEM) for the user `user`
    /// (common name) in `group` (organisation), signed by the CA the API
    /// server trusts and valid for `valid_for` from now: what a credential
    /// plugin that hands out short-lived certificates gives.
    pub fn client_certificate(
        &self,
        user: &str,
        group: Option<&str>,
        valid_for: Duration,
    ) -> Result<(String, String), Error> {
        let pair = self
            .ca
            .client_pair_valid_for(user, group, Some(valid_for))?;
        Ok((pair.cert, pair.key))
    }

    /// A kubeconfig holding `token` as a bearer token for this API server.
    pub fn token_kubeconfig(&self, name: &str, token: String) -> Kubeconfig {
        kubeconfig::build(
            name,
            &self.server,
            self.ca.cert_pem(),
            Credentials::Token(token),
        )
    }

    /// A kubeconfig whose user is the exec credential plugin `command`
    /// (see [`crate::plugins`]) run non-interactively with `STATE_DIR=<state>`
    /// in its environment.
    pub fn exec_kubeconfig(&self, name: &str, command: &str, state: &Path) -> Kubeconfig {
        let exec = ExecConfig {
            api_version: Some("client.authentication.k8s.io/v1".into()),
            command: Some(command.into()),
            env: Some(vec![
                [
                    ("name".to_string(), "STATE_DIR".to_string()),
                    ("value".to_string(), state.display().to_string()),
                ]
                .into(),
            ]),
            interactive_mode: Some(ExecInteractiveMode::Never),
            ..ExecConfig::default()
        };
        kubeconfig::build(
            name,
            &self.server,
            self.ca.cert_pem(),
            Credentials::Exec(Box::new(exec)),
        )
    }

    /// The directory holding the data, certificates and process logs.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The audit events the API server wrote so far, one per completed
    /// request (started with [`ControlPlaneBuilder::audit`]; none
    /// otherwise). A line not yet complete is left out.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join(AUDIT_LOG))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Stops the API server, keeping etcd and its data. Clients see
    /// connection errors until [`ControlPlane::start_api_server`].
    pub fn stop_api_server(&self) {
        lock(&self.api_server).take();
    }

    /// Starts the API server again on the same port with the same data and
    /// waits until it is ready. Does nothing to a running API server.
    pub async fn start_api_server(&self) -> Result<(), Error> {
        {
            let mut slot = lock(&self.api_server);
            if slot.is_none() {
                *slot = Some(spawn_api_server(&self.api_server_command, self.dir.path())?);
            }
        }
        self.wait_ready().await
    }

    /// Pauses the API server (`SIGSTOP`): it keeps its connections and
    /// accepts new ones but answers nothing, as a hung server does, until
    /// [`ControlPlane::resume_api_server`]. Does nothing to a stopped one.
    pub fn pause_api_server(&self) -> Result<(), Error> {
        self.signal_api_server(true)
    }

    /// Resumes a paused API server (`SIGCONT`).
    pub fn resume_api_server(&self) -> Result<(), Error> {
        self.signal_api_server(false)
    }

    fn signal_api_server(&self, paused: bool) -> Result<(), Error> {
        match lock(&self.api_server).as_ref() {
            Some(process) => process.pause(paused).map_err(|source| Error::Signal {
                name: "kube-apiserver",
                source,
            }),
            None => Ok(()),
        }
    }

    /// Stops and starts the API server.
    pub async fn restart_api_server(&self) -> Result<(), Error> {
        self.stop_api_server();
        self.start_api_server().await
    }

    /// Stops every process and removes the data directory. Dropping the
    /// control plane does the same; this makes the point explicit.
    pub fn stop(self) {}

    /// Waits until `/readyz` answers OK and the `default` namespace exists,
    /// failing early if a process exits.
    async fn wait_ready(&self) -> Result<(), Error> {
        let deadline = Instant::now() + self.start_timeout;
        let client = self.client().await?;
        loop {
            self.check_processes()?;
            // An API server that is still starting answers 500 or nothing;
            // kube-rs logs that as an error, but here it is expected.
            let probe =
                probe_ready(&client).with_subscriber(tracing::subscriber::NoSubscriber::new());
            let Err(last_error) = probe.await else {
                return Ok(());
            };
            tracing::debug!(%last_error, "the API server is not ready yet");
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    timeout: self.start_timeout,
                    last_error,
                    log_tail: lock(&self.api_server)
                        .as_ref()
                        .map(Process::log_tail)
                        .unwrap_or_default(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn check_processes(&self) -> Result<(), Error> {
        for slot in [&self.etcd, &self.api_server] {
            if let Some(process) = lock(slot).as_mut()
                && let Some(status) = process.exit_status()
            {
                return Err(Error::Exited {
                    name: process.name(),
                    status: status.to_string(),
                    log_tail: process.log_tail(),
                });
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server", &self.server)
            .field("data_dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

async fn probe_ready(client: &kube::Client) -> Result<(), String> {
    let readyz = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|err| err.to_string())?;
    client
        .request_text(readyz)
        .await
        .map_err(|err| err.to_string())?;
    // The API server creates `default` shortly after it first reports ready;
    // tests expect to write there at once.
    let namespace = http::Request::get("/api/v1/namespaces/default")
        .body(Vec::new())
        .map_err(|err| err.to_string())?;
    client
        .request_text(namespace)
        .await
        .map_err(|err| err.to_string())?;
    Ok(())
}

fn spawn_api_server(command: &(PathBuf, Vec<OsString>), root: &Path) -> Result<Process, Error> {
    Process::spawn(
        "kube-apiserver",
        &command.0,
        command.1.clone(),
        root.join("kube-apiserver.log"),
    )
}

fn args(list: impl IntoIterator<Item = String>) -> Vec<OsString> {
    list.into_iter().map(OsString::from).collect()
}

fn write(dir: &Path, name: &str, contents: &str) -> Result<(), Error> {
    std::fs::write(dir.join(name), contents).map_err(|source| Error::Io {
        what: format!("writing {}", dir.join(name).display()),
        source,
    })
}

/// A poisoned lock only means another test thread panicked while holding it;
/// the process handle inside is still valid.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Distinct free loopback ports. Ports handed out earlier in this process
/// are never handed out again, so parallel tests in one binary cannot clash.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut handed_out = lock(&HANDED_OUT);
    let mut ports = [0u16; N];
    let mut listeners = Vec::with_capacity(N);
    let mut filled = 0;
    while filled < N {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
            what: "finding a free loopback port".into(),
            source,
        })?;
        let port = listener.local_addr().map_err(|source| Error::Io {
            what: "finding a free loopback port".into(),
            source,
        })?;
        if !handed_out.contains(&port.port()) {
            handed_out.push(port.port());
            ports[filled] = port.port();
            filled += 1;
        }
        // Held until all are chosen so the kernel cannot return one twice.
        listeners.push(listener);
    }
    Ok(ports)
}
