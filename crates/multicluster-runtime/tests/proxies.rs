//! Members reached through the proxies client-go supports besides plain
//! HTTP ones (those are in `examples/kubeconfig/tests/proxy.rs`): an HTTPS
//! proxy, whose certificate is checked against the kubeconfig's CA bundle,
//! and a SOCKS 5 proxy with a user and password. Both get the library's
//! own stack, so a member's watch and requests share one tunnelled HTTP/2
//! connection (kube-rs's stack, which these members got before, opened an
//! HTTP/1.1 connection per watch and logged an ERROR line per failed
//! request). The proxies are written here: each resolves any name to
//! loopback, as a real proxy resolves names its clients cannot, and
//! records what it was asked for.

mod common;

use std::sync::{Arc, Mutex};

use base64::Engine;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use multicluster_envtest::{ControlPlane, ServingFiles};
use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::controller::Watch;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use multicluster_runtime::testing::{Recorder, recording_controller, wait_until_ready};
use multicluster_runtime::{Cluster, Manager};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A user and password a proxy was given.
type Credentials = Option<(String, String)>;

/// What a test proxy was asked: each tunnel's target and the user and
/// password it was given, if any.
#[derive(Clone, Default)]
struct Asked(Arc<Mutex<Vec<(String, Credentials)>>>);

impl Asked {
    fn push(&self, target: String, credentials: Credentials) {
        self.0.lock().expect("lock").push((target, credentials));
    }

    fn all(&self) -> Vec<(String, Credentials)> {
        self.0.lock().expect("lock").clone()
    }
}

/// A proxy on a loopback port, serving each connection with `serve`.
struct Proxy {
    port: u16,
    asked: Asked,
    accepting: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start<F, Fut>(serve: F) -> Self
    where
        F: Fn(TcpStream, Asked) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let asked = Asked::default();
        let accepting = tokio::spawn({
            let asked = asked.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(serve(client, asked.clone()));
                }
            }
        });
        Self {
            port,
            asked,
            accepting,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Connects to `127.0.0.1` on `target`'s port and joins the two streams.
async fn join_to<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    target: &str,
    established: &[u8],
) {
    let port = target.rsplit(':').next().unwrap_or_default();
    let Ok(mut upstream) = TcpStream::connect(format!("127.0.0.1:{port}")).await else {
        return;
    };
    if client.write_all(established).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

/// An HTTPS proxy: TLS with `tls`, then `CONNECT host:port`, its
/// `Proxy-Authorization` decoded.
async fn https_connect(client: TcpStream, asked: Asked, tls: tokio_rustls::TlsAcceptor) {
    let Ok(mut client) = tls.accept(client).await else {
        return;
    };
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match client.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let Some(target) = head
        .strip_prefix("CONNECT ")
        .and_then(|rest| rest.split(' ').next())
    else {
        return;
    };
    let credentials = head
        .lines()
        .find_map(|line| line.strip_prefix("Proxy-Authorization: Basic "))
        .and_then(|encoded| {
            base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok()
        })
        .and_then(|decoded| String::from_utf8(decoded).ok())
        .and_then(|pair| {
            pair.split_once(':')
                .map(|(user, password)| (user.to_string(), password.to_string()))
        });
    asked.push(target.to_string(), credentials);
    join_to(
        client,
        target,
        b"HTTP/1.1 200 Connection established\r\n\r\n",
    )
    .await;
}

/// A SOCKS 5 proxy (RFC 1928) that asks for a user and password (RFC 1929)
/// and takes the target as a name.
async fn socks5(mut client: TcpStream, asked: Asked) {
    async fn serve(client: &mut TcpStream, asked: &Asked) -> std::io::Result<String> {
        let mut header = [0u8; 2];
        client.read_exact(&mut header).await?;
        let mut methods = vec![0u8; usize::from(header[1])];
        client.read_exact(&mut methods).await?;
        if header[0] != 5 || !methods.contains(&2) {
            client.write_all(&[5, 0xff]).await?;
            return Err(std::io::Error::other("no user and password offered"));
        }
        client.write_all(&[5, 2]).await?;
        let read_field = async |client: &mut TcpStream| -> std::io::Result<String> {
            let mut length = [0u8; 1];
            client.read_exact(&mut length).await?;
            let mut field = vec![0u8; usize::from(length[0])];
            client.read_exact(&mut field).await?;
            Ok(String::from_utf8_lossy(&field).to_string())
        };
        let mut version = [0u8; 1];
        client.read_exact(&mut version).await?;
        let user = read_field(client).await?;
        let password = read_field(client).await?;
        client.write_all(&[1, 0]).await?;
        let mut request = [0u8; 4];
        client.read_exact(&mut request).await?;
        if request[..2] != [5, 1] || request[3] != 3 {
            return Err(std::io::Error::other("not a CONNECT to a name"));
        }
        let host = read_field(client).await?;
        let mut port = [0u8; 2];
        client.read_exact(&mut port).await?;
        let target = format!("{host}:{}", u16::from_be_bytes(port));
        asked.push(target.clone(), Some((user, password)));
        Ok(target)
    }
    if let Ok(target) = serve(&mut client, &asked).await {
        join_to(client, &target, &[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await;
    }
}

/// `cp`'s kubeconfig naming `host` as its server (same port), its
/// certificate checked for `localhost`, reached through `proxy_url`, and
/// trusting `extra_ca` besides `cp`'s own CA.
fn through(cp: &ControlPlane, host: &str, proxy_url: &str, extra_ca: Option<&str>) -> String {
    let mut kubeconfig = cp.kubeconfig().clone();
    let cluster = kubeconfig.clusters[0].cluster.as_mut().expect("cluster");
    let port = cp.server().rsplit(':').next().expect("port");
    cluster.server = Some(format!("https://{host}:{port}"));
    cluster.tls_server_name = Some("localhost".into());
    cluster.proxy_url = Some(proxy_url.to_string());
    if let Some(extra) = extra_ca {
        let bundle = format!("{}{extra}", cp.ca_pem());
        cluster.certificate_authority_data =
            Some(base64::engine::general_purpose::STANDARD.encode(bundle));
    }
    multicluster_envtest::to_yaml(&kubeconfig).expect("yaml")
}

async fn member(name: &str, text: String) -> Cluster {
    KubeconfigCluster {
        inventory: Default::default(),
        // The operator lets these kubeconfigs name their proxy.
        policy: KubeconfigPolicy::untrusted().proxy_url(true),
        name: name.into(),
        text,
        source: format!("test kubeconfig of {name}"),
        stable_id: None,
        member: MemberOptions::default(),
    }
    .build()
    .await
    .expect("cluster")
}

/// A member behind an HTTPS proxy (its certificate from a CA that only the
/// kubeconfig's bundle trusts, its user and password percent-encoded in
/// the URL) and one behind a SOCKS 5 proxy are engaged and reconciled,
/// each over one tunnel that its watch and requests share, and each proxy
/// was given its credentials decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_behind_https_and_socks5_proxies_are_reconciled_over_one_tunnel_each() {
    let cp = ControlPlane::start().await.expect("control plane");
    let dir = tempfile::tempdir().expect("dir");
    let serving = ServingFiles::generate(dir.path()).expect("certificates");
    let proxy_ca = std::fs::read_to_string(&serving.ca).expect("proxy CA");
    let certificates = CertificateDer::pem_file_iter(&serving.cert)
        .expect("certificate")
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate");
    let key = PrivateKeyDer::from_pem_file(&serving.key).expect("key");
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certificates, key)
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let https =
        Proxy::start(move |client, asked| https_connect(client, asked, acceptor.clone())).await;
    let socks = Proxy::start(socks5).await;

    let provider = TestProvider::default();
    let mut members = Vec::new();
    let https_url = format!("https://robot:p%40ss@localhost:{}", https.port);
    let socks_url = format!("socks5://robot:p%40ss@127.0.0.1:{}", socks.port);
    for (name, text) in [
        (
            "behind-https",
            through(&cp, "member-a.proxied.test", &https_url, Some(&proxy_ca)),
        ),
        (
            "behind-socks",
            through(&cp, "member-b.proxied.test", &socks_url, None),
        ),
    ] {
        let cluster = member(name, text).await;
        members.push(cluster.clone());
        provider.clusters.add(name, cluster).expect("add");
    }
    let manager = Manager::builder(cluster_for("local", &cp).await)
        .provider(Arc::new(provider))
        .build();
    let recorder = Recorder::default();
    manager
        .add_controller(
            recording_controller("recorder", Watch::<ConfigMap>::new(), &recorder)
                .expect("controller"),
        )
        .expect("add");
    let (stop, task) = run_manager(&manager);
    create_config_map(&cp, "through-a-proxy", &[]).await;
    for name in ["behind-https", "behind-socks"] {
        wait_until_ready(&manager, name).await;
        recorder
            .wait_until("the member's object to be reconciled", |recorder| {
                recorder.count(&req(name, "through-a-proxy")) > 0
            })
            .await;
    }

    // A request while the watch is open: over HTTP/1.1 it would need a
    // connection (a tunnel) of its own.
    for cluster in &members {
        Api::<Namespace>::all(cluster.client())
            .list(&Default::default())
            .await
            .expect("a request beside the watch");
    }
    let port = cp.server().rsplit(':').next().expect("port").to_string();
    let credentials = Some(("robot".to_string(), "p@ss".to_string()));
    assert_eq!(
        https.asked.all(),
        [(format!("member-a.proxied.test:{port}"), credentials.clone())],
        "one tunnel through the HTTPS proxy"
    );
    assert_eq!(
        socks.asked.all(),
        [(format!("member-b.proxied.test:{port}"), credentials)],
        "one tunnel through the SOCKS proxy, the name resolved by the proxy"
    );
    stop.cancel();
    task.await.expect("task").expect("clean stop");
}
