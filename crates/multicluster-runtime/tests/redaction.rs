//! Credential text never leaves the process: a credential plugin that
//! worked once and then fails, echoing its secret arguments on stdout and
//! its whole environment (the kubeconfig's `env:` entries) on stderr, shows
//! on `/clusters`, in the logs (at trace level) and in errors only by its
//! command and exit status, and the cluster whose requests fail for want of
//! a credential is degraded.

mod common;

use multicluster_runtime::testing::{Polled, eventually_some};
use std::sync::Arc;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_runtime::Manager;
use multicluster_runtime::controller::{Action, Controller, Watch};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;

const SECRET_ENV: &str = "api-key-that-must-not-leak";
const SECRET_ARG: &str = "password-that-must-not-leak";

fn assert_no_secret(what: &str, text: &str) {
    for secret in [SECRET_ENV, SECRET_ARG] {
        assert!(!text.contains(secret), "{what} leaks {secret}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_credential_plugin_leaks_nothing_anywhere() {
    let logs = Logs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("trace")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let member = ControlPlane::start().await.expect("member");
    create_config_map(&member, "seen", &[]).await;
    let state = tempfile::tempdir().expect("state");
    let token = member
        .cluster_admin_token("robots", "plugged")
        .await
        .expect("token");
    plugins::set_token(state.path(), &token).expect("token");
    // Short-lived: the client runs the plugin again every couple of seconds.
    std::fs::write(state.path().join("ttl"), "4").expect("ttl");
    let mut identity = member.exec_kubeconfig("plugged", plugins::TOKEN, state.path());
    let exec = identity.auth_infos[0]
        .auth_info
        .as_mut()
        .and_then(|auth| auth.exec.as_mut())
        .expect("exec");
    exec.args = Some(vec![format!("--password={SECRET_ARG}")]);
    exec.env.get_or_insert_default().push(
        [
            ("name".to_string(), "API_KEY".to_string()),
            ("value".to_string(), SECRET_ENV.to_string()),
        ]
        .into(),
    );
    let text = multicluster_envtest::to_yaml(&identity).expect("yaml");
    // Built as providers build clusters, with the default options.
    let cluster = KubeconfigCluster {
        inventory: Default::default(),
        policy: multicluster_runtime::client::KubeconfigPolicy::trusted(),
        name: "member".into(),
        text,
        source: "test kubeconfig".into(),
        stable_id: None,
        member: MemberOptions::default(),
    }
    .build()
    .await
    .expect("cluster");
    let client = cluster.client();
    let provider = TestProvider::default();
    provider.clusters.add("member", cluster).expect("add");
    let manager = Manager::builder(cluster_for("local", &member).await)
        .provider(Arc::new(provider))
        .metrics(multicluster_runtime::metrics::Metrics::new(true))
        .build();
    let recorder = Recorder::default();
    let controller = {
        let recorder = recorder.clone();
        Controller::builder("recording")
            .for_resource(Watch::<ConfigMap>::new())
            .build(move |request, _| {
                let recorder = recorder.clone();
                async move {
                    recorder.record(&request);
                    Ok::<_, kube::Error>(Action::await_change())
                }
            })
            .expect("controller")
    };
    manager.add_controller(controller).expect("add");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, task) = run_manager(&manager);
    manager.serve_health(listener, stop.clone());
    recorder.wait_for_more(&req("member", "seen"), 0).await;

    // From now on the plugin fails, echoing its secrets. Every request
    // the cluster's client makes fails once its token has expired: the
    // cluster is degraded, its reason naming the plugin, not its output.
    std::fs::remove_file(state.path().join("token")).expect("no more token");
    let api = Api::<ConfigMap>::namespaced(client, "default");
    // The token's expiry is the API server's business, not an event of
    // this process.
    let err = eventually_some(
        Polled::ApiServer,
        "a request refused once the token is removed",
        || async { api.list(&ListParams::default()).await.err() },
    )
    .await;
    assert_no_secret("the error", &err.to_string());
    assert_no_secret("the error's Debug form", &format!("{err:?}"));
    assert_no_secret(
        "the redacted error",
        &multicluster_runtime::redact::Redacted::kube(&err),
    );
    // Each look sends the request that makes the client run its plugin
    // again: the state waited for comes from asking, not from a signal.
    eventually(
        Polled::Unsignalled,
        "the member to be degraded by its failing plugin",
        || async {
            let _ = api.list(&ListParams::default()).await;
            matches!(
                manager.cluster_state(&"member".into()),
                Some(ClusterState::Degraded(reason))
                    if reason.contains(plugins::TOKEN) && reason.contains("exit status: 1")
            )
        },
    )
    .await;
    for path in [
        "/clusters",
        "/clusters?format=json",
        "/metrics",
        "/healthz",
        "/readyz",
    ] {
        let (_, body) = multicluster_runtime::testing::http_get(address, path)
            .await
            .expect(path);
        assert_no_secret(path, &body);
        if path == "/clusters" {
            assert!(
                body.lines()
                    .any(|line| line.starts_with("member\tdegraded: ")
                        && line.contains("stderr is withheld")),
                "{body}"
            );
        }
        if path == "/clusters?format=json" {
            let report: serde_json::Value = serde_json::from_str(&body).expect("JSON");
            let member = report["clusters"]
                .as_array()
                .expect("clusters")
                .iter()
                .find(|cluster| cluster["name"] == "member")
                .expect("the member");
            assert_eq!(member["state"], "degraded", "{body}");
            assert!(
                member["reason"]
                    .as_str()
                    .is_some_and(|reason| reason.contains("stderr is withheld")),
                "{body}"
            );
        }
    }

    stop.cancel();
    task.await.expect("task").expect("clean stop");
    let logs = logs.text();
    assert!(
        logs.contains("renewing a credential failed") && logs.contains("stderr is withheld"),
        "logged:\n{logs}"
    );
    assert!(
        !logs.contains("no token for this cluster"),
        "stderr is not logged:\n{logs}"
    );
    assert_no_secret("the logs", &logs);
}
