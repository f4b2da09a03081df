//! The example binary with `HTTPS_PROXY` and `NO_PROXY` in its
//! environment, as a Deployment behind a corporate proxy runs it: each
//! member's own server is matched against `NO_PROXY`, and a member reached
//! through the proxy gets the same client as one reached directly.

use std::sync::{Arc, Mutex};

use multicluster_envtest::ControlPlane;
use multicluster_example_testing::{GRACE, terminate_showing_log, wait_for_copy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::{example, management_and_member, put_secrets};

/// An HTTP proxy that answers `CONNECT host:port` by tunnelling to
/// `127.0.0.1:port`, whatever the host (it is this test's name service:
/// a real proxy resolves names its clients cannot), and records each
/// target.
struct ConnectProxy {
    port: u16,
    targets: Arc<Mutex<Vec<String>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl ConnectProxy {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let targets = Arc::new(Mutex::new(Vec::new()));
        let accepting = tokio::spawn({
            let targets = targets.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(tunnel(client, targets.clone()));
                }
            }
        });
        Self {
            port,
            targets,
            accepting,
        }
    }

    fn targets(&self) -> Vec<String> {
        self.targets.lock().expect("lock").clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn tunnel(mut client: tokio::net::TcpStream, targets: Arc<Mutex<Vec<String>>>) {
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
        let _ = client
            .write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            .await;
        return;
    };
    targets.lock().expect("lock").push(target.to_string());
    let port = target.rsplit(':').next().unwrap_or_default();
    let Ok(mut upstream) = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}")).await else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_ok()
    {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

/// `cp`'s kubeconfig naming `host` as its server (same port), the
/// certificate checked for `localhost`, which it is issued for.
fn named(cp: &ControlPlane, host: &str) -> kube::config::Kubeconfig {
    let mut kubeconfig = cp.kubeconfig().clone();
    let cluster = kubeconfig.clusters[0].cluster.as_mut().expect("cluster");
    let port = cp.server().rsplit(':').next().expect("port");
    cluster.server = Some(format!("https://{host}:{port}"));
    cluster.tls_server_name = Some("localhost".into());
    kubeconfig
}

/// Two members, one behind `member-a.proxied.test` (a name only the proxy
/// resolves), one at `0.0.0.0` (which Linux connects to this host) named
/// in `NO_PROXY`. The first is reached through the proxy, over one
/// tunnelled HTTP/2 connection for its watch and its requests; the second
/// directly, never through the proxy. (kube-rs matched `NO_PROXY` against
/// the proxy: the second went through it too. Loopback servers are never
/// proxied, as with client-go, hence `0.0.0.0`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_proxy_names_a_member_reached_directly_and_the_other_goes_through_the_proxy() {
    let ((management, proxied), direct) =
        tokio::join!(management_and_member(), ControlPlane::start());
    let direct = direct.expect("direct");
    let proxy = ConnectProxy::start().await;
    let port = |cp: &ControlPlane| cp.server().rsplit(':').next().expect("port").to_string();
    let (proxied_port, direct_port) = (port(&proxied), port(&direct));
    put_secrets(
        &management,
        &[
            ("proxied", &named(&proxied, "member-a.proxied.test")),
            ("direct", &named(&direct, "0.0.0.0")),
        ],
    )
    .await;

    let log = tempfile::NamedTempFile::new().expect("log");
    let mut example = example(&management)
        .args(["--health-address", "127.0.0.1:0"])
        .env("HTTPS_PROXY", format!("http://127.0.0.1:{}", proxy.port))
        .env("NO_PROXY", "0.0.0.0")
        .stderr(log.reopen().expect("log"))
        .spawn()
        .expect("example");
    tokio::join!(
        wait_for_copy(proxied.client().await.expect("client"), "settings"),
        wait_for_copy(direct.client().await.expect("client"), "settings"),
    );

    let targets = proxy.targets();
    let through_proxy = |port: &str| {
        targets
            .iter()
            .filter(|target| target.ends_with(&format!(":{port}")))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        through_proxy(&proxied_port),
        [format!("member-a.proxied.test:{proxied_port}")],
        "one tunnel carries the proxied member's watch and requests: {targets:?}"
    );
    assert_eq!(
        through_proxy(&direct_port),
        Vec::<String>::new(),
        "NO_PROXY names the direct member: {targets:?}"
    );

    let status = terminate_showing_log(&mut example, GRACE, log.path()).await;
    assert!(status.success(), "{status}");
}

/// A member the proxy cannot reach (nothing listens where it points): the
/// proxy answers the `CONNECT` with 502, and `/clusters` says so, where
/// it read "tunnel error: unsuccessful" before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_refusing_the_tunnel_is_named_with_its_status() {
    let (management, member) = management_and_member().await;
    let proxy = ConnectProxy::start().await;
    let mut gone = named(&member, "member-gone.proxied.test");
    let free = common::free_address().port();
    if let Some(cluster) = gone.clusters[0].cluster.as_mut() {
        cluster.server = Some(format!("https://member-gone.proxied.test:{free}"));
    }
    put_secrets(&management, &[("gone", &gone)]).await;
    let address = common::free_address();
    let log = tempfile::NamedTempFile::new().expect("log");
    let mut example = example(&management)
        .arg("--health-address")
        .arg(address.to_string())
        .env("HTTPS_PROXY", format!("http://127.0.0.1:{}", proxy.port))
        .stderr(log.reopen().expect("log"))
        .spawn()
        .expect("example");
    let line = common::clusters_line(address, "gone\tunreachable").await;
    assert!(
        line.contains("the proxy refused the tunnel: 502 Bad Gateway"),
        "{line}"
    );
    let targets = proxy.targets();
    assert!(
        targets.contains(&format!("member-gone.proxied.test:{free}")),
        "asked through the proxy: {targets:?}"
    );
    let status = terminate_showing_log(&mut example, GRACE, log.path()).await;
    assert!(status.success(), "{status}");
}
