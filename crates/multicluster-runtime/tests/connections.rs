//! Connections to a member: with HTTP/2 (the default for clients built
//! from kubeconfigs) every list and watch of a cluster shares one
//! connection; over HTTP/1.1 each open watch holds its own.

mod common;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Cluster;
use multicluster_runtime::provider::kubeconfig::{self, ClientOptions};
use multicluster_runtime::testing::{connections_to, eventually};

/// A cluster over a client built from `cp`'s kubeconfig, with three
/// informers listed and watching.
async fn watching_three_types(cp: &ControlPlane, options: &ClientOptions) -> Cluster {
    let client = kubeconfig::client(cp.kubeconfig(), None, "the test kubeconfig", options)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_shares_one_connection_per_cluster_http1_holds_one_per_watch() {
    let cp = ControlPlane::start().await.expect("control plane");
    let port: u16 = cp
        .server()
        .rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .expect("port");
    // The start-up readiness client's connections close on their own time;
    // counting from a baseline they leave later made this flaky.
    eventually("start-up connections to close", || async {
        connections_to(port) == 0
    })
    .await;
    let before = 0;

    let shared = watching_three_types(&cp, &ClientOptions::default()).await;
    eventually("one connection for lists and three watches", || async {
        connections_to(port) == before + 1
    })
    .await;
    shared.cache().stop();
    drop(shared);
    eventually("the HTTP/2 connection to close", || async {
        connections_to(port) == before
    })
    .await;

    let separate = watching_three_types(&cp, &ClientOptions::default().http2(false)).await;
    eventually("a connection per watch over HTTP/1.1", || async {
        connections_to(port) >= before + 3
    })
    .await;
    separate.cache().stop();
}
