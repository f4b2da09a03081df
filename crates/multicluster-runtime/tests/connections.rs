//! Connections to a member: with HTTP/2 (the default for clients built
//! from kubeconfigs) every list and watch of a cluster shares one
//! connection; over HTTP/1.1 each open watch holds its own. Clusters on one
//! server with one TLS identity share connections.

mod common;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::Cluster;
use multicluster_runtime::client::{self, ClientOptions};
use multicluster_runtime::testing::Polled;
use multicluster_runtime::testing::{connections_to, eventually};

/// A client built from `cp`'s kubeconfig as a provider builds it, once it
/// has had an answer. One request first, as the manager's probe does:
/// requests that race the first connection's TLS handshake cannot know
/// yet that it will be HTTP/2, and may open connections of their own.
async fn answered_client(cp: &ControlPlane, options: &ClientOptions) -> kube::Client {
    let client = client::build(
        cp.kubeconfig(),
        None,
        "the test kubeconfig",
        &Default::default(),
        options,
    )
    .await
    .expect("client");
    client.apiserver_version().await.expect("version");
    client
}

/// A cluster over a client built from `cp`'s kubeconfig, with three
/// informers listed and watching.
async fn watching_three_types(cp: &ControlPlane, options: &ClientOptions) -> Cluster {
    let client = answered_client(cp, options).await;
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

/// Clusters with one server and one TLS identity share connections, as
/// client-go's transports do (a fleet behind a gateway, namespaces of one
/// server as clusters): 100 clusters listing and watching on one API
/// server hold four connections (32 clusters at most share one), not 100.
/// Their caches stopped and the clusters dropped, the connections close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_on_one_server_with_one_identity_share_connections() {
    let cp = ControlPlane::start().await.expect("control plane");
    let port = port_once_quiet(&cp).await;
    let mut clusters = Vec::new();
    for member in 0..100 {
        let client = answered_client(&cp, &ClientOptions::default()).await;
        let cluster = Cluster::new(format!("member-{member}"), client);
        cluster
            .cache()
            .list::<ConfigMap>(None)
            .await
            .expect("configmaps");
        clusters.push(cluster);
    }
    eventually(
        Polled::Kernel,
        "four connections for 100 clusters' lists and watches",
        || async { connections_to(port) == 4 },
    )
    .await;
    for cluster in &clusters {
        cluster.cache().stop();
    }
    drop(clusters);
    eventually(
        Polled::Kernel,
        "the shared connections to close",
        || async { connections_to(port) == 0 },
    )
    .await;
}

/// Clusters sharing a connection share its HTTP/2 flow-control window: a
/// cluster that opens watches and stops reading them (a stuck consumer)
/// must stall only those watches. With hyper's default window (5 MiB for
/// the connection, 2 MiB a stream) three unread streams took the whole
/// connection's window, and every other cluster on it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharing_cluster_that_stops_reading_stalls_only_its_own_watches() {
    use futures::StreamExt;
    use kube::api::{Api, ObjectMeta, PostParams, WatchParams};
    use std::time::Duration;
    let cp = ControlPlane::start().await.expect("control plane");
    let port = port_once_quiet(&cp).await;
    let stuck = answered_client(&cp, &ClientOptions::default()).await;
    let reading = answered_client(&cp, &ClientOptions::default()).await;
    eventually(
        Polled::Kernel,
        "the two clusters on one connection",
        || async { connections_to(port) == 1 },
    )
    .await;

    // Writes go through a client of their own (not the shared connection).
    let admin = cp.client().await.expect("client");
    for name in ["big", "small"] {
        cp.create_namespace(name).await.expect("namespace");
    }
    // Four watches opened and never read, each then sent about 7 MiB.
    let big = Api::<ConfigMap>::namespaced(stuck.clone(), "big");
    let mut unread = Vec::new();
    for _ in 0..4 {
        let events = big
            .watch(&WatchParams::default(), "0")
            .await
            .expect("watch");
        unread.push(Box::pin(events));
    }
    let blob = "x".repeat(900 * 1024);
    for index in 0..8 {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("blob-{index}")),
                ..ObjectMeta::default()
            },
            data: Some([("blob".to_string(), blob.clone())].into()),
            ..ConfigMap::default()
        };
        Api::<ConfigMap>::namespaced(admin.clone(), "big")
            .create(&PostParams::default(), &config_map)
            .await
            .expect("a big ConfigMap");
    }

    // The other cluster lists and watches over the same connection, and
    // so does the stuck one for what it still reads.
    for (who, client) in [("the reading cluster", &reading), ("the stuck one", &stuck)] {
        let small = Api::<ConfigMap>::namespaced(client.clone(), "small");
        let listed = tokio::time::timeout(Duration::from_secs(20), small.list(&Default::default()))
            .await
            .unwrap_or_else(|_| panic!("{who}'s list waited on the unread watches"));
        let version = listed
            .expect("list")
            .metadata
            .resource_version
            .expect("version");
        let mut events = Box::pin(
            small
                .watch(&WatchParams::default(), &version)
                .await
                .expect("watch"),
        );
        let name = format!("note-{}", who.len());
        let note = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        Api::<ConfigMap>::namespaced(admin.clone(), "small")
            .create(&PostParams::default(), &note)
            .await
            .expect("a small ConfigMap");
        let seen = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(event) = events.next().await {
                if let Ok(kube::api::WatchEvent::Added(object)) = event
                    && object.metadata.name.as_deref() == Some(name.as_str())
                {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(seen, Ok(true), "{who}'s watch waited on the unread watches");
    }
    drop(unread);
}
