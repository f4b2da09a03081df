//! kind clusters as `kind create cluster` leaves them, for tests of code
//! that runs the real `kind` CLI: a podman container per cluster named
//! `<name>-control-plane`, labelled as kind labels its nodes
//! (`io.x-k8s.kind.cluster`, `io.x-k8s.kind.role=control-plane`), port 6443
//! published on `127.0.0.1`, and `/etc/kubernetes/admin.conf` holding one
//! user, with a real etcd and kube-apiserver inside (the control plane's
//! binaries, mounted) and a static busybox for the `cat` kind runs. kind's
//! node image cannot be pulled here, so `kind create cluster` itself is not
//! used; `kind get clusters` and `kind get kubeconfig` are, unchanged
//! (`KIND_EXPERIMENTAL_PROVIDER=podman`).
//!
//! Needs `podman` and a static busybox (`/usr/bin/busybox`, Debian's
//! `busybox-static`); `runc` is used where installed (crun refuses hybrid
//! cgroup hierarchies).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kube::config::Kubeconfig;
use tokio::sync::OnceCell;

use crate::kubeconfig::{self, Credentials};
use crate::pki::CertificateAuthority;
use crate::{Binaries, Error};

/// The image every node runs: busybox only (the binaries and the node's
/// files are mounted).
const IMAGE: &str = "localhost/multicluster-envtest-kind-node:busybox";
/// Where a static busybox is looked for.
const BUSYBOX: &str = "/usr/bin/busybox";
/// How long one podman call may take.
const PODMAN_DEADLINE: Duration = Duration::from_secs(120);
/// How long a node's API server has to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(90);

/// One kind cluster's control-plane node. Dropping it removes the
/// container.
pub struct KindNode {
    name: String,
    container: String,
    dir: tempfile::TempDir,
    ca: CertificateAuthority,
    /// `https://127.0.0.1:<published port>`, as `kind get kubeconfig` says.
    server: Option<String>,
}

impl KindNode {
    /// Starts the node of kind cluster `name`, and waits until its API
    /// server is ready.
    pub async fn start(name: &str) -> Result<Self, Error> {
        let binaries = Binaries::locate()?;
        let node = Self::prepared(name)?;
        let pki = node.dir.path().join("pki");
        std::fs::create_dir_all(&pki).map_err(io("creating the node's pki directory"))?;
        let serving = node.ca.serving_pair()?;
        let sa = crate::pki::ServiceAccountKeys::generate()?;
        for (file, contents) in [
            ("ca.crt", node.ca.cert_pem()),
            ("apiserver.crt", serving.cert.as_str()),
            ("apiserver.key", serving.key.as_str()),
            ("sa.key", sa.private_pem.as_str()),
            ("sa.pub", sa.public_pem.as_str()),
        ] {
            write(&pki.join(file), contents)?;
        }
        node.write_admin()?;
        write(&node.dir.path().join("start.sh"), START)?;
        let mounts = [
            (binaries.etcd.as_path(), "/usr/local/bin/etcd"),
            (
                binaries.kube_apiserver.as_path(),
                "/usr/local/bin/kube-apiserver",
            ),
        ];
        node.run(&mounts, &["/bin/sh", "/etc/kubernetes/start.sh"])
            .await?;
        let mut node = node;
        let port = podman(&["port", &node.container, "6443/tcp"]).await?;
        let address = port.lines().next().unwrap_or_default().trim();
        node.server = Some(format!("https://{address}"));
        node.wait_ready().await?;
        Ok(node)
    }

    /// A node whose `admin.conf` is `text` and which runs no API server:
    /// a cluster whose kubeconfig cannot be used.
    pub async fn broken(name: &str, text: &str) -> Result<Self, Error> {
        let node = Self::prepared(name)?;
        write(&node.dir.path().join("admin.conf"), text)?;
        node.run(&[], &["/bin/sleep", "1000000"]).await?;
        Ok(node)
    }

    fn prepared(name: &str) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("multicluster-envtest-kind-")
            .tempdir()
            .map_err(io("creating the node's directory"))?;
        Ok(Self {
            name: name.to_string(),
            container: format!("{name}-control-plane"),
            dir,
            ca: CertificateAuthority::generate()?,
            server: None,
        })
    }

    /// Runs the node's container with `command`, the node's directory as
    /// `/etc/kubernetes` and `mounts` (host file, container path) read-only.
    async fn run(&self, mounts: &[(&Path, &str)], command: &[&str]) -> Result<(), Error> {
        image().await?;
        let cluster_label = format!("io.x-k8s.kind.cluster={}", self.name);
        let etc = format!("{}:/etc/kubernetes", self.dir.path().display());
        let mut args: Vec<String> = ["run", "--detach", "--replace", "--name", &self.container]
            .iter()
            .map(|arg| arg.to_string())
            .collect();
        if runc().is_some() {
            args.extend(["--runtime".into(), "runc".into()]);
        }
        args.extend(
            [
                "--label",
                &cluster_label,
                "--label",
                "io.x-k8s.kind.role=control-plane",
                // This machine's limits are below podman's defaults.
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "--publish",
                "127.0.0.1::6443",
                "--volume",
                &etc,
            ]
            .iter()
            .map(|arg| arg.to_string()),
        );
        for (host, inside) in mounts {
            args.push("--volume".into());
            args.push(format!("{}:{inside}:ro", host.display()));
        }
        args.push(IMAGE.into());
        args.extend(command.iter().map(|arg| arg.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        podman(&args).await.map(drop)
    }

    /// kind's name of the cluster.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The admin kubeconfig as `kind get kubeconfig` prints it (the server
    /// is the published port).
    pub fn kubeconfig(&self) -> Result<Kubeconfig, Error> {
        let text = std::fs::read_to_string(self.dir.path().join("admin.conf"))
            .map_err(io("reading admin.conf"))?;
        let mut config: Kubeconfig = serde_saphyr::from_str(&text)
            .map_err(|err| Error::Kubeconfig(format!("admin.conf: {err}")))?;
        for cluster in &mut config.clusters {
            if let Some(cluster) = cluster.cluster.as_mut() {
                cluster.server = self.server.clone();
            }
        }
        Ok(config)
    }

    /// A client for the node's API server, as its admin.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        crate::client_for(&self.kubeconfig()?).await
    }

    /// Writes `admin.conf` again with a new admin certificate, as a
    /// cluster recreated under the same name would have.
    pub fn rotate_admin(&self) -> Result<(), Error> {
        self.write_admin()
    }

    fn write_admin(&self) -> Result<(), Error> {
        let admin = self
            .ca
            .client_pair("kubernetes-admin", Some("system:masters"))?;
        let config = kubeconfig::build(
            &format!("kind-{}", self.name),
            // What kind writes inside the node; `kind get kubeconfig`
            // rewrites it to the published port.
            &format!("https://{}:6443", self.container),
            self.ca.cert_pem(),
            Credentials::Certificate {
                cert_pem: admin.cert,
                key_pem: admin.key,
            },
        );
        // Written whole: `kind get kubeconfig` may read it meanwhile.
        let partial = self.dir.path().join(".admin.conf.partial");
        write(&partial, &kubeconfig::to_yaml(&config)?)?;
        std::fs::rename(&partial, self.dir.path().join("admin.conf"))
            .map_err(io("replacing admin.conf"))
    }

    async fn wait_ready(&self) -> Result<(), Error> {
        let client = self.client().await?;
        // Ready as ControlPlane::start is: the API server answers and has
        // made the `default` namespace.
        let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
        let deadline = tokio::time::Instant::now() + READY_DEADLINE;
        loop {
            let last = match namespaces.get("default").await {
                Ok(_) => return Ok(()),
                Err(err) => err.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                let logs = podman(&["logs", "--tail", "20", &self.container])
                    .await
                    .unwrap_or_default();
                return Err(Error::NotReady {
                    timeout: READY_DEADLINE,
                    last_error: last,
                    log_tail: logs,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for KindNode {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman")
            .args(["rm", "--force", "--time", "0", &self.container])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Starts etcd, then runs the API server in its place.
const START: &str = r#"#!/bin/sh
mkdir -p /var/lib/etcd /var/log /tmp
/usr/local/bin/etcd --name=node --data-dir=/var/lib/etcd \
  --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
  --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
  --initial-cluster=node=http://127.0.0.1:2380 --unsafe-no-fsync=true > /var/log/etcd.log 2>&1 &
exec /usr/local/bin/kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --advertise-address=127.0.0.1 --secure-port=6443 --cert-dir=/tmp/certs \
  --tls-cert-file=/etc/kubernetes/pki/apiserver.crt --tls-private-key-file=/etc/kubernetes/pki/apiserver.key \
  --client-ca-file=/etc/kubernetes/pki/ca.crt \
  --service-account-key-file=/etc/kubernetes/pki/sa.pub \
  --service-account-signing-key-file=/etc/kubernetes/pki/sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.0.0.0/24 --authorization-mode=RBAC \
  --enable-priority-and-fairness=false --storage-backend=etcd3
"#;

/// `runc`, if installed.
fn runc() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("runc"))
            .find(|candidate| candidate.is_file())
    })
}

/// Imports the node image, unless podman has it from an earlier run (a
/// new import each time would leave the old one behind, untagged).
async fn image() -> Result<(), Error> {
    static IMPORTED: OnceCell<()> = OnceCell::const_new();
    IMPORTED
        .get_or_try_init(|| async {
            if podman(&["image", "exists", IMAGE]).await.is_ok() {
                return Ok(());
            }
            let root = tempfile::tempdir().map_err(io("creating the node image's root"))?;
            let bin = root.path().join("bin");
            std::fs::create_dir_all(&bin).map_err(io("creating the node image's bin"))?;
            std::fs::copy(BUSYBOX, bin.join("busybox")).map_err(|source| Error::Io {
                what: format!(
                    "copying {BUSYBOX} into the kind node image (install busybox-static)"
                ),
                source,
            })?;
            for applet in ["sh", "cat", "sleep", "mkdir"] {
                std::os::unix::fs::symlink("busybox", bin.join(applet))
                    .map_err(io("linking busybox applets"))?;
            }
            let tar = root.path().with_extension("tar");
            let packed = tokio::process::Command::new("tar")
                .arg("-C")
                .arg(root.path())
                .arg("-cf")
                .arg(&tar)
                .arg(".")
                .status()
                .await
                .map_err(io("packing the kind node image"))?;
            if !packed.success() {
                return Err(Error::Container(format!(
                    "tar of the node image failed ({packed})"
                )));
            }
            let result = podman(&["import", "--quiet", &tar.to_string_lossy(), IMAGE]).await;
            let _ = std::fs::remove_file(&tar);
            result.map(drop)
        })
        .await
        .map(drop)
}

/// Runs `podman` with `args` (within [`PODMAN_DEADLINE`]); its stdout.
async fn podman(args: &[&str]) -> Result<String, Error> {
    let shown = format!("podman {}", args.first().copied().unwrap_or_default());
    let output = tokio::time::timeout(
        PODMAN_DEADLINE,
        tokio::process::Command::new("podman")
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| Error::Container(format!("{shown} ran past {PODMAN_DEADLINE:?}")))?
    .map_err(|source| Error::Io {
        what: format!("running {shown} (install podman)"),
        source,
    })?;
    if !output.status.success() {
        return Err(Error::Container(format!(
            "{shown} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::Io {
        what: format!("writing {}", path.display()),
        source,
    })
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io {
        what: what.to_string(),
        source,
    }
}
