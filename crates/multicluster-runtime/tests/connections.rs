//! Connections to a member: with HTTP/2 (the default for clients built
//! from kubeconfigs) every list and watch of a cluster shares one
//! connection; over HTTP/1.1 each open watch holds its own.

mod common;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Cluster;
use multicluster_runtime::client::{self, ClientOptions};
use multicluster_runtime::testing::Polled;
use multicluster_runtime::testing::{connections_to, eventually};

/// A cluster over a client built from `cp`'s kubeconfig, with three
/// informers listed and watching.
async fn watching_three_types(cp: &ControlPlane, options: &ClientOptions) -> Cluster {
    let client = client::build(
        cp.kubeconfig(),
        None,
        "the test kubeconfig",
        &Default::default(),
        options,
    )
    .await
    .expect("client");
    // One request first, as the manager's probe does: requests that race
    // the first connection's TLS handshake cannot know yet that it will be
    // HTTP/2, and may open connections of their own.
    client.apiserver_version().await.expect("version");
    let cluster = Cluster::new("member", client);
    let cache = cluster.cache();
    cache.list::<ConfigMap>(None).await.expect("configmaps");
    cache.list::<Secret>(None).await.expect("secrets");
    cache
        .list::<ServiceAccount>(None)
        .await
        .expect("service accounts");
    cluster
}

/// `cp`'s API server port, once this process holds no connection to it.
/// The start-up readiness client's connections close on their own time;
/// counting from a baseline they leave later made the counts flaky.
async fn port_once_quiet(cp: &ControlPlane) -> u16 {
    let port: u16 = cp
        .server()
        .rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .expect("port");
    eventually(Polled::Kernel, "start-up connections to close", || async {
        connections_to(port) == 0
    })
    .await;
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_shares_one_connection_per_cluster_http1_holds_one_per_watch() {
    let cp = ControlPlane::start().await.expect("control plane");
    let port = port_once_quiet(&cp).await;
    let before = 0;

    let shared = watching_three_types(&cp, &ClientOptions::default()).await;
    eventually(
        Polled::Kernel,
        "one connection for lists and three watches",
        || async { connections_to(port) == before + 1 },
    )
    .await;
    shared.cache().stop();
    drop(shared);
    eventually(Polled::Kernel, "the HTTP/2 connection to close", || async {
        connections_to(port) == before
    })
    .await;

    let separate = watching_three_types(&cp, &ClientOptions::default().http2(false)).await;
    eventually(
        Polled::Kernel,
        "a connection per watch over HTTP/1.1",
        || async { connections_to(port) >= before + 3 },
    )
    .await;
    separate.cache().stop();
}

/// How long hyper-util's pool keeps a connection it has not handed out
/// (its default `pool_idle_timeout`), and a little more.
const LONGER_THAN_THE_POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(95);

/// A cluster's HTTP/2 connection outlives quiet spells: its open watches
/// keep it busy, so a request after a minute and a half without one goes
/// over it, not over a new connection with a TLS handshake of its own (a
/// quiet fleet would otherwise reconnect every cluster at each re-watch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_after_a_quiet_spell_goes_over_the_watching_connection() {
    let cp = ControlPlane::start().await.expect("control plane");
    let port = port_once_quiet(&cp).await;
    let cluster = watching_three_types(&cp, &ClientOptions::default()).await;
    eventually(
        Polled::Kernel,
        "one connection for lists and three watches",
        || async { connections_to(port) == 1 },
    )
    .await;

    // The quiet spell is what is tested: nothing is sent meanwhile.
    tokio::time::sleep(LONGER_THAN_THE_POOL_IDLE_TIMEOUT).await;
    cluster
        .client()
        .apiserver_version()
        .await
        .expect("version after the quiet spell");
    assert_eq!(connections_to(port), 1, "a second connection was opened");
    cluster.cache().stop();
}

/// A member whose API server does not serve HTTP/2 is reached over
/// HTTP/1.1 all the same (the TLS handshake settles it), and a burst of
/// requests leaves at most two idle connections behind besides those of the
/// open watches: the pool keeps its connections however quiet, so it must
/// not keep every one a burst opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_http2_is_reached_over_http1_and_a_burst_leaves_two_idle_connections() {
    let cp = ControlPlane::builder()
        .api_server_arg("--disable-http2-serving")
        .start()
        .await
        .expect("control plane");
    let port = port_once_quiet(&cp).await;
    let cluster = watching_three_types(&cp, &ClientOptions::default()).await;
    eventually(Polled::Kernel, "a connection per watch", || async {
        connections_to(port) == 3
    })
    .await;

    let client = cluster.client();
    let burst = futures::future::join_all((0..10).map(|_| client.apiserver_version())).await;
    assert!(burst.iter().all(Result::is_ok), "{burst:?}");
    eventually(
        Polled::Kernel,
        "the burst's extra connections to close",
        || async { connections_to(port) <= 3 + 2 },
    )
    .await;
    cluster.cache().stop();
}
