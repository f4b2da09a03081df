//! Credential text never leaves the process: a credential plugin that
//! worked once and then fails, echoing its secret environment and
//! arguments, shows on `/clusters`, in the logs and in errors only by its
//! command, exit status and last stderr line.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_runtime::cache::{Cache, CacheOptions};
use multicluster_runtime::controller::{Action, Controller, Watch};
use multicluster_runtime::provider::kubeconfig::{self, ClientOptions};
use multicluster_runtime::{Cluster, Manager, ManagerOptions};

const SECRET_ENV: &str = "api-key-that-must-not-leak";
const SECRET_ARG: &str = "password-that-must-not-leak";

/// Everything the process logs, at debug level for this crate.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

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
        .with_env_filter("info,multicluster_runtime=debug")
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
    let parsed = kubeconfig::parse(&text, "test kubeconfig").expect("parses");
    let client = kubeconfig::client(&parsed, None, "test kubeconfig", &ClientOptions::default())
        .await
        .expect("client");
    // Watches start again every 2 s, so the failing plugin shows in them.
    let cache = Cache::with_options(
        "member",
        client.clone(),
        CacheOptions::default().watcher(watcher::Config::default().timeout(2)),
    );
    let provider = TestProvider::default();
    provider
        .clusters
        .add(
            "member",
            Cluster::with_cache("member", client.clone(), cache),
        )
        .expect("add");
    let manager = Manager::with_provider(
        cluster_for("local", &member).await,
        Arc::new(provider),
        ManagerOptions::default().unhealthy_after(Duration::from_secs(1)),
    );
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

    // From now on the plugin fails, echoing its secrets on stdout.
    std::fs::remove_file(state.path().join("token")).expect("no more token");
    eventually("the failing plugin to show on /clusters", || async {
        multicluster_runtime::testing::http_get(address, "/clusters")
            .await
            .is_ok_and(|(_, body)| {
                body.lines().any(|line| {
                    line.starts_with("member\t") && line.contains("no token for this cluster")
                })
            })
    })
    .await;
    let (_, clusters) = multicluster_runtime::testing::http_get(address, "/clusters")
        .await
        .expect("/clusters");
    assert!(
        clusters.contains(plugins::TOKEN),
        "names the plugin: {clusters}"
    );
    assert!(clusters.contains("exit status: 1"), "{clusters}");
    assert_no_secret("/clusters", &clusters);

    let err = Api::<ConfigMap>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
        .expect_err("the credential is gone");
    assert_no_secret("the error", &err.to_string());
    assert_no_secret("the error's Debug form", &format!("{err:?}"));
    assert_no_secret(
        "the redacted error",
        &multicluster_runtime::redact::kube_error(&err),
    );

    stop.cancel();
    task.await.expect("task").expect("clean stop");
    let logs = logs.text();
    assert!(
        logs.contains("no token for this cluster"),
        "logged:\n{logs}"
    );
    assert_no_secret("the logs", &logs);
}
