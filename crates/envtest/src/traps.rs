//! Kubeconfigs that try to make whoever builds a client from them run a
//! command, read a local file or reach a server, and the traps that tell
//! whether any of it happened: for tests of what a kubeconfig read from a
//! cluster object may do.
//!
//! Every trap kubeconfig names the same server, a TCP listener on loopback
//! that counts the connections it is offered. Its files sit in one
//! directory watched with inotify (through `notify`), which reports every
//! open. Its exec plugin is [`crate::plugins::TOKEN`], which records each
//! call in the directory. [`Traps::assert_untouched`] checks all three.
//!
//! ```no_run
//! # async fn demo(member: &multicluster_envtest::ControlPlane) {
//! let traps = multicluster_envtest::traps::Traps::set().await.expect("traps");
//! for trap in traps.kubeconfigs(member.ca_pem()) {
//!     // ... store `trap.kubeconfig` where the code under test reads it ...
//! #   let _ = trap;
//! }
//! // ... wait until the code under test has looked at every one ...
//! traps.assert_untouched().await;
//! # }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::config::{
    AuthInfo, AuthProviderConfig, Cluster, Context, ExecConfig, ExecInteractiveMode, Kubeconfig,
    NamedAuthInfo, NamedCluster, NamedContext,
};
use notify::event::{AccessKind, EventKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use secrecy::SecretString;

/// What a trap kubeconfig would make its reader do, and the fields a
/// kubeconfig policy should refuse in it.
#[derive(Clone, Debug)]
pub struct Trap {
    /// A short name, usable as an object name (`exec`, `token-file`, ...).
    pub name: &'static str,
    /// The refused fields, as a kubeconfig spells them
    /// (`users["trap"].user.tokenFile`).
    pub fields: Vec<&'static str>,
    /// The kubeconfig.
    pub kubeconfig: Kubeconfig,
    /// Whether a kubeconfig policy refuses it (and names the policy field
    /// that would allow it), or nothing could allow it, and what the
    /// refusal says then.
    pub refused: Why,
}

/// Why a trap kubeconfig is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// A kubeconfig policy does not allow it; the reason names the
    /// policy field that would.
    Policy,
    /// Nothing allows it (a credential that cannot be sent in a header, a
    /// server no request can be made on); the reason says this.
    Never(&'static str),
}

impl Trap {
    /// Panics unless `reason` is a refusal of this trap's kubeconfig, read
    /// from `origin` (`Secret fleet/x key "kubeconfig"`): it names each
    /// refused field and the policy field that would allow it, and quotes
    /// no value (the trap files' paths).
    pub fn assert_refused(&self, reason: &str, origin: &str, traps: &Traps) {
        assert!(
            reason.starts_with(&format!("kubeconfig from {origin} refused")),
            "{}: {reason}",
            self.name
        );
        for field in &self.fields {
            assert!(
                reason.contains(field),
                "{} names {field}: {reason}",
                self.name
            );
        }
        match self.refused {
            Why::Policy => assert!(reason.contains("KubeconfigPolicy::"), "{reason}"),
            Why::Never(says) => assert!(reason.contains(says), "{}: {reason}", self.name),
        }
        for value in ["trap-value", "X-Injected"] {
            assert!(!reason.contains(value), "quotes a value: {reason}");
        }
        assert!(
            !reason.contains(&traps.dir().display().to_string()),
            "quotes a path: {reason}"
        );
    }
}

/// A directory of files nobody may open, a plugin nobody may run and a
/// listener nobody may connect to. Dropping it removes them.
pub struct Traps {
    dir: tempfile::TempDir,
    port: u16,
    connections: Arc<AtomicUsize>,
    opened: Arc<Mutex<Vec<PathBuf>>>,
    _watcher: RecommendedWatcher,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for Traps {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// The file [`Traps::assert_untouched`] opens itself, to know that opens
/// are seen.
const SENTINEL: &str = "sentinel";

impl Traps {
    /// Sets the traps: writes the files, starts watching them and starts
    /// the listener.
    pub async fn set() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        for (file, content) in [
            ("token", "the-controllers-own-token"),
            ("client.crt", "-----BEGIN CERTIFICATE-----\n"),
            ("client.key", "-----BEGIN PRIVATE KEY-----\n"),
            ("ca.crt", "-----BEGIN CERTIFICATE-----\n"),
            (SENTINEL, ""),
        ] {
            std::fs::write(dir.path().join(file), content)?;
        }
        // The plugin hands out this token if it runs.
        crate::plugins::set_token(dir.path(), "from-the-trap-plugin")?;
        let opened = Arc::new(Mutex::new(Vec::new()));
        let mut watcher = notify::recommended_watcher({
            let opened = opened.clone();
            move |event: notify::Result<notify::Event>| {
                if let Ok(event) = event
                    && matches!(event.kind, EventKind::Access(AccessKind::Open(_)))
                {
                    lock(&opened).extend(event.paths);
                }
            }
        })
        .map_err(std::io::Error::other)?;
        watcher
            .watch(dir.path(), RecursiveMode::NonRecursive)
            .map_err(std::io::Error::other)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(AtomicUsize::new(0));
        let accepting = tokio::spawn({
            let connections = connections.clone();
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    drop(stream);
                }
            }
        });
        Ok(Self {
            dir,
            port,
            connections,
            opened,
            _watcher: watcher,
            accepting,
        })
    }

    /// The listener every trap names as its server.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The directory of the trap files and of the plugin's record.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// How many connections the listener was offered.
    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// One kubeconfig per thing a kubeconfig can make its reader do beyond
    /// reaching its server with inline credentials: run a command, read a
    /// token file, a client certificate and key, or a CA file, use an auth
    /// provider, skip TLS verification, go through a proxy. Each names
    /// [`Traps::server`] and has the inline CA data of `ca_pem`, so that
    /// everything but the trap is as a real member's kubeconfig would be.
    // Long by design: a table of traps, one entry each.
    pub fn kubeconfigs(&self, ca_pem: &str) -> Vec<Trap> {
        let file = |name: &str| self.dir.path().join(name).display().to_string();
        let token = || Some(SecretString::from("inline-token".to_string()));
        let exec = ExecConfig {
            api_version: Some("client.authentication.k8s.io/v1".into()),
            command: Some(crate::plugins::TOKEN.into()),
            env: Some(vec![
                [
                    ("name".to_string(), "STATE_DIR".to_string()),
                    ("value".to_string(), self.dir.path().display().to_string()),
                ]
                .into(),
            ]),
            interactive_mode: Some(ExecInteractiveMode::Never),
            ..ExecConfig::default()
        };
        let trap = |name, fields, cluster: Cluster, user: AuthInfo| Trap {
            name,
            fields,
            kubeconfig: single(
                Cluster {
                    server: Some(self.server()),
                    certificate_authority_data: Some(base64(ca_pem)),
                    ..cluster
                },
                user,
            ),
            refused: Why::Policy,
        };
        vec![
            trap(
                "exec",
                vec![r#"users["trap"].user.exec"#],
                Cluster::default(),
                AuthInfo {
                    exec: Some(exec),
                    ..AuthInfo::default()
                },
            ),
            trap(
                "token-file",
                vec![r#"users["trap"].user.tokenFile"#],
                Cluster::default(),
                AuthInfo {
                    token_file: Some(file("token")),
                    ..AuthInfo::default()
                },
            ),
            trap(
                "client-certificate",
                vec![
                    r#"users["trap"].user.client-certificate"#,
                    r#"users["trap"].user.client-key"#,
                ],
                Cluster::default(),
                AuthInfo {
                    client_certificate: Some(file("client.crt")),
                    client_key: Some(file("client.key")),
                    ..AuthInfo::default()
                },
            ),
            trap(
                "certificate-authority",
                vec![r#"clusters["trap"].cluster.certificate-authority"#],
                Cluster {
                    certificate_authority: Some(file("ca.crt")),
                    ..Cluster::default()
                },
                AuthInfo {
                    token: token(),
                    ..AuthInfo::default()
                },
            ),
            trap(
                "auth-provider",
                vec![r#"users["trap"].user.auth-provider"#],
                Cluster::default(),
                AuthInfo {
                    auth_provider: Some(AuthProviderConfig {
                        name: "oidc".into(),
                        config: [
                            ("id-token".to_string(), "inline-id-token".to_string()),
                            ("idp-issuer-url".to_string(), self.server()),
                        ]
                        .into(),
                        other: Default::default(),
                    }),
                    ..AuthInfo::default()
                },
            ),
            trap(
                "insecure",
                vec![r#"clusters["trap"].cluster.insecure-skip-tls-verify"#],
                Cluster {
                    insecure_skip_tls_verify: Some(true),
                    ..Cluster::default()
                },
                AuthInfo {
                    token: token(),
                    ..AuthInfo::default()
                },
            ),
            trap(
                "proxy-url",
                vec![r#"clusters["trap"].cluster.proxy-url"#],
                Cluster {
                    proxy_url: Some(format!("http://127.0.0.1:{}", self.port)),
                    ..Cluster::default()
                },
                AuthInfo {
                    token: token(),
                    ..AuthInfo::default()
                },
            ),
            // The token would travel in the clear.
            Trap {
                name: "plain-http",
                fields: vec![r#"clusters["trap"].cluster.server"#],
                kubeconfig: single(
                    Cluster {
                        server: Some(format!("http://127.0.0.1:{}", self.port)),
                        ..Cluster::default()
                    },
                    AuthInfo {
                        token: token(),
                        ..AuthInfo::default()
                    },
                ),
                refused: Why::Policy,
            },
        ]
    }

    /// Kubeconfigs whose credentials cannot be sent in an HTTP header (a
    /// token with CR and LF, one with NUL, a basic-auth password with CR
    /// and LF), which kube-rs would panic on or send without credentials:
    /// refused whatever the policy. Each names [`Traps::server`] with the
    /// inline CA data of `ca_pem`; their values hold `trap-value` (or
    /// `X-Injected`), which no reason may quote.
    pub fn broken_credentials(&self, ca_pem: &str) -> Vec<Trap> {
        let broken = |name, field, user: AuthInfo| Trap {
            name,
            fields: vec![field],
            kubeconfig: single(
                Cluster {
                    server: Some(self.server()),
                    certificate_authority_data: Some(base64(ca_pem)),
                    ..Cluster::default()
                },
                user,
            ),
            refused: Why::Never("cannot be sent in an HTTP header"),
        };
        let secret = |value: &str| Some(SecretString::from(value.to_string()));
        vec![
            broken(
                "token-crlf",
                r#"users["trap"].user.token"#,
                AuthInfo {
                    token: secret("trap-value\r\nX-Injected: 1"),
                    ..AuthInfo::default()
                },
            ),
            broken(
                "token-nul",
                r#"users["trap"].user.token"#,
                AuthInfo {
                    token: secret("trap-value\0more"),
                    ..AuthInfo::default()
                },
            ),
            broken(
                "password-crlf",
                r#"users["trap"].user.password"#,
                AuthInfo {
                    username: Some("admin".into()),
                    password: secret("trap-value\r\nX-Injected: 1"),
                    ..AuthInfo::default()
                },
            ),
        ]
    }

    /// Kubeconfigs whose `server` no request can be made on, which
    /// kube-rs would take and panic on at the first request (no scheme:
    /// the listener's address alone, or `//` and it), or fail on (user
    /// info, port 0): refused whatever the policy. Each has an inline
    /// token and the inline CA data of `ca_pem`; user info holds
    /// `trap-value`, which no reason may quote.
    pub fn broken_servers(&self, ca_pem: &str) -> Vec<Trap> {
        let broken = |name, server: String| Trap {
            name,
            fields: vec![r#"clusters["trap"].cluster.server"#],
            kubeconfig: single(
                Cluster {
                    server: Some(server),
                    certificate_authority_data: Some(base64(ca_pem)),
                    ..Cluster::default()
                },
                AuthInfo {
                    token: Some(SecretString::from("inline-token".to_string())),
                    ..AuthInfo::default()
                },
            ),
            refused: Why::Never("so no request can be made on it"),
        };
        let port = self.port;
        vec![
            broken("server-no-scheme", format!("127.0.0.1:{port}")),
            broken("server-scheme-relative", format!("//127.0.0.1:{port}")),
            broken(
                "server-user-info",
                format!("https://trap-value:x@127.0.0.1:{port}"),
            ),
            broken("server-port-zero", "https://127.0.0.1:0".to_string()),
        ]
    }

    /// The files a reader opened so far (the sentinel aside).
    pub fn opened(&self) -> Vec<PathBuf> {
        lock(&self.opened)
            .iter()
            .filter(|path| !path.ends_with(SENTINEL))
            .cloned()
            .collect()
    }

    /// Panics unless nothing fell into a trap: the plugin never ran, no
    /// file was opened, no connection was made. Opens a file of its own
    /// first and waits (up to 10 s) until the watch reports it, so that
    /// every open before it has been reported too.
    pub async fn assert_untouched(&self) {
        let sentinel = self.dir.path().join(SENTINEL);
        drop(std::fs::File::open(&sentinel).expect("the sentinel opens"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !lock(&self.opened).iter().any(|path| path == &sentinel) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the file watch never reported the sentinel's open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            crate::plugins::calls(self.dir.path()),
            Vec::<String>::new(),
            "the trap plugin ran"
        );
        assert_eq!(
            self.opened(),
            Vec::<PathBuf>::new(),
            "trap files were opened"
        );
        assert_eq!(self.connections(), 0, "the trap server was reached");
    }
}

fn single(cluster: Cluster, user: AuthInfo) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: "trap".into(),
            cluster: Some(cluster),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "trap".into(),
            auth_info: Some(user),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: "trap".into(),
            context: Some(Context {
                cluster: "trap".into(),
                user: Some("trap".into()),
                ..Context::default()
            }),
            other: BTreeMap::default(),
        }],
        current_context: Some("trap".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Kubeconfig::default()
    }
}

fn base64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
