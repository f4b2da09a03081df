//! Client certificates handed out by exec credential plugins are renewed as
//! client-go renews them: before they expire, and after the server refuses
//! the credential, also when the plugin switches from tokens to
//! certificates. The cluster is never built again: its client and cache
//! stay, and so do its watches.

mod common;

use multicluster_runtime::testing::Polled;
use std::time::Duration;

use common::*;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_runtime::Cluster;
use multicluster_runtime::testing::eventually;

/// A cluster of `cp` built as providers build it, authenticated by the
/// test plugin with state directory `state`.
async fn plugged_cluster(cp: &ControlPlane, state: &std::path::Path) -> Cluster {
    let identity = cp.exec_kubeconfig("plugged", plugins::TOKEN, state);
    from_kubeconfig(
        "member",
        &identity,
        multicluster_runtime::client::KubeconfigPolicy::trusted(),
    )
    .await
}

/// Who the API server takes the client for.
async fn user_of(client: &kube::Client) -> kube::Result<String> {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review
        .status
        .and_then(|status| status.user_info)
        .and_then(|user| user.username)
        .unwrap_or_default())
}

/// The cluster manager switches a member from a token to a client
/// certificate and revokes the token: the plugin's certificate is taken up
/// at the next renewal, through the same client, and the cluster's cache
/// keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_switches_from_a_token_to_a_certificate_keeps_its_cluster() {
    let member = ControlPlane::start().await.expect("member");
    let state = tempfile::tempdir().expect("state");
    let token = member
        .cluster_admin_token("robots", "plugged")
        .await
        .expect("token");
    plugins::set_token(state.path(), &token).expect("token");
    let cluster = plugged_cluster(&member, state.path()).await;
    let client = cluster.client();
    assert_eq!(
        user_of(&client).await.expect("review"),
        "system:serviceaccount:robots:plugged"
    );
    cluster
        .cache()
        .list::<ConfigMap>(Some("default"))
        .await
        .expect("the cache syncs");

    // The switch: a certificate from now on, and the token revoked.
    let (cert, key) = member
        .client_certificate(
            "plugged-by-certificate",
            Some("system:masters"),
            Duration::from_secs(3600),
        )
        .expect("certificate");
    plugins::set_certificate(state.path(), &cert, &key).expect("certificate");
    std::fs::remove_file(state.path().join("token")).expect("no more token");
    Api::<ServiceAccount>::namespaced(member.client().await.expect("admin"), "robots")
        .delete("plugged", &DeleteParams::default())
        .await
        .expect("revoke the token");

    // A refused request (401) makes the next one run the plugin again.
    eventually(
        Polled::ApiServer,
        "requests to work with the certificate",
        || async {
            user_of(&client)
                .await
                .is_ok_and(|user| user == "plugged-by-certificate")
        },
    )
    .await;
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &config_map("written-after", &[]))
        .await
        .expect("a write with the certificate");
    // A cache tells the controllers watching it of new objects, not a
    // reader.
    eventually(
        Polled::Unsignalled,
        "the cache to see the write",
        || async {
            cluster
                .cache()
                .get::<ConfigMap>(Some("default"), "written-after")
                .await
                .is_ok_and(|found| found.is_some())
        },
    )
    .await;
}

/// A plugin that hands out certificates valid for a few seconds (with
/// their `expirationTimestamp`) is asked again before each expires:
/// requests keep working long past the first certificate's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lived_plugin_certificate_is_renewed_before_it_expires() {
    const LIFE: Duration = Duration::from_secs(6);
    let member = ControlPlane::start().await.expect("member");
    let state = tempfile::tempdir().expect("state");
    let issue = |member: &ControlPlane, state: &std::path::Path| {
        let (cert, key) = member
            .client_certificate("short-lived", Some("system:masters"), LIFE)
            .expect("certificate");
        plugins::set_certificate(state, &cert, &key).expect("certificate");
    };
    issue(&member, state.path());
    std::fs::write(state.path().join("ttl"), LIFE.as_secs().to_string()).expect("ttl");
    let cluster = plugged_cluster(&member, state.path()).await;
    let client = cluster.client();

    // The cluster manager issues a fresh certificate every second; each
    // one the plugin hands out expires LIFE after it was issued.
    // (The second between issues is the scenario's clock, not a wait for
    // anything: certificates must expire under the client.)
    let started = tokio::time::Instant::now();
    let mut requests = 0;
    while started.elapsed() < LIFE * 3 {
        issue(&member, state.path());
        assert_eq!(
            user_of(&client)
                .await
                .expect("a request with a current certificate"),
            "short-lived"
        );
        requests += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Three lifetimes of requests that all worked took at least three
    // certificates; the plugin is asked before expiry, not per request.
    let calls = plugins::calls(state.path()).len();
    assert!(calls >= 3, "{calls} certificates over three lifetimes");
    assert!(
        calls < requests,
        "the plugin ran for {calls} of {requests} requests"
    );
}
