//! What a kubeconfig Secret may make the controller do, with the
//! provider's default options: anyone who may write a Secret in the watched
//! namespace writes these kubeconfigs, so none may run a command, read a
//! file of the controller's, use an auth provider, skip TLS verification or
//! pick a proxy until the operator allows it.

use multicluster_runtime::testing::wait_for_fleet;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::traps::Traps;
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_provider_kubeconfig::{DEFAULT_LABEL, KubeconfigOptions, KubeconfigProvider};
use multicluster_runtime::client::{AllowedPlugin, Allowlist, ExecPolicy, KubeconfigPolicy};
use multicluster_runtime::controller::Request;
use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::{
    recording_manager, run_manager, serve_health, wait_until_unusable,
};
use multicluster_runtime::{Cluster, ClusterName, ManagerOptions};

const NAMESPACE: &str = "fleet";

async fn put_secret(admin: &kube::Client, name: &str, kubeconfig: &kube::config::Kubeconfig) {
    let text = multicluster_envtest::to_yaml(kubeconfig).expect("yaml");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(DEFAULT_LABEL.to_string(), "true".to_string())].into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(text.into_bytes()),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
}

/// A management plane with namespace `fleet` (and a client for it), and
/// a member holding ConfigMap `hello`.
async fn management_and_member() -> (ControlPlane, ControlPlane, kube::Client) {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    member
        .create_config_map("hello", &[])
        .await
        .expect("create");
    management
        .create_namespace(NAMESPACE)
        .await
        .expect("namespace");
    let admin = management.client().await.expect("client");
    (management, member, admin)
}

fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

/// One Secret per thing a kubeconfig can make its reader do (an exec
/// plugin that leaves a mark, a token file, a client certificate and key,
/// a CA file, an auth provider, skipping TLS verification, a proxy), each
/// naming a listener as its server, beside a Secret of a real member. With
/// `KubeconfigOptions::default()`: the plugin never runs, no file is
/// opened, the listener is never reached, every trap is listed refused
/// (naming the Secret, the field and the policy field that would allow
/// it) in the provider's failures, on `/clusters` and in the metrics, and
/// the member works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_that_would_run_read_or_dial_are_refused_with_the_default_options() {
    let (_management, member, admin) = management_and_member().await;
    let traps = Traps::set().await.expect("traps");
    let panics = multicluster_envtest::panics::Panics::count();
    let kubeconfigs = [
        traps.kubeconfigs(member.ca_pem()),
        traps.broken_credentials(member.ca_pem()),
        traps.broken_servers(member.ca_pem()),
    ]
    .concat();
    for trap in &kubeconfigs {
        put_secret(&admin, trap.name, &trap.kubeconfig).await;
    }
    put_secret(&admin, "member", member.kubeconfig()).await;

    let provider = Arc::new(KubeconfigProvider::new(
        admin.clone(),
        KubeconfigOptions::default(),
    ));
    let (manager, recorder) = recording_manager(
        Cluster::local(admin.clone()),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    let address = serve_health(&manager, shutdown.clone()).await;
    recorder
        .wait_for_more(&req("fleet/member", "hello"), 0)
        .await;
    let names: Vec<_> = kubeconfigs
        .iter()
        .map(|trap| ClusterName::from(format!("{NAMESPACE}/{}", trap.name)))
        .collect();
    let reasons = wait_until_unusable(&manager, address, &names).await;
    for (trap, name) in kubeconfigs.iter().zip(&names) {
        let origin = format!("Secret {NAMESPACE}/{} key \"kubeconfig\"", trap.name);
        trap.assert_refused(&reasons[name], &origin, &traps);
        assert_eq!(provider.failures()[name], reasons[name]);
    }
    assert_eq!(provider.names(), [ClusterName::from("fleet/member")]);
    let metrics = manager.metrics().encode();
    assert!(
        metrics.lines().any(|line| line
            == format!(
                "mcr_cluster_engagement_failures_total{{provider=\"kubeconfig\",reason=\"refused-kubeconfig\"}} {}",
                kubeconfigs.len()
            )),
        "{metrics}"
    );
    traps.assert_untouched().await;
    assert_eq!(panics.since(), 0, "panicked: {:?}", panics.messages());

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The plugin the trap ran nothing with: refused with the defaults (it
/// never runs), then allowlisted by the operator with the one variable its
/// kubeconfig sets, it runs and its cluster is engaged; a kubeconfig that
/// also sets a variable the operator did not name (`HTTPS_PROXY`, which
/// would steer the plugin's own credential traffic) is refused, and the
/// plugin is never run for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlisted_plugin_runs_and_its_cluster_is_engaged() {
    let (_management, member, admin) = management_and_member().await;
    let state = tempfile::tempdir().expect("state");
    let token = member
        .cluster_admin_token("robots", "plugged")
        .await
        .expect("token");
    plugins::set_token(state.path(), &token).expect("token");
    put_secret(
        &admin,
        "plugged",
        &member.exec_kubeconfig("plugged", plugins::TOKEN, state.path()),
    )
    .await;
    let steered_state = tempfile::tempdir().expect("state");
    plugins::set_token(steered_state.path(), &token).expect("token");
    let mut steered = member.exec_kubeconfig("steered", plugins::TOKEN, steered_state.path());
    steered.auth_infos[0]
        .auth_info
        .as_mut()
        .and_then(|user| user.exec.as_mut())
        .and_then(|exec| exec.env.as_mut())
        .expect("env")
        .push(
            [
                ("name".to_string(), "HTTPS_PROXY".to_string()),
                ("value".to_string(), "http://127.0.0.1:9".to_string()),
            ]
            .into(),
        );
    put_secret(&admin, "steered", &steered).await;

    let run = |options: KubeconfigOptions| {
        let provider = Arc::new(KubeconfigProvider::new(admin.clone(), options));
        let (manager, recorder) = recording_manager(
            Cluster::local(admin.clone()),
            provider.clone(),
            ManagerOptions::default(),
        );
        let (shutdown, task) = run_manager(&manager);
        (provider, manager, recorder, shutdown, task)
    };

    let (provider, manager, _, shutdown, task) = run(KubeconfigOptions::default());
    // Both Secrets are refused under the default policy, in either order.
    wait_for_fleet(&manager, "the plugged Secret to be refused", || {
        provider
            .failures()
            .contains_key(&ClusterName::from("fleet/plugged"))
    })
    .await;
    let reason = &provider.failures()[&ClusterName::from("fleet/plugged")];
    assert!(
        reason.contains(r#"users["plugged"].user.exec runs a command"#),
        "{reason}"
    );
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
    assert!(plugins::calls(state.path()).is_empty(), "it ran");

    let allowed = KubeconfigPolicy::untrusted().exec(ExecPolicy::Allowlist(
        Allowlist::of([AllowedPlugin::new(plugins::TOKEN)
            .expect("an absolute path")
            .env(["STATE_DIR"])
            .expect("a plain variable")])
        .expect("one plugin"),
    ));
    let (provider, manager, recorder, shutdown, task) =
        run(KubeconfigOptions::default().kubeconfig_policy(allowed));
    recorder
        .wait_for_more(&req("fleet/plugged", "hello"), 0)
        .await;
    wait_for_fleet(&manager, "the steered Secret to be refused", || {
        provider
            .failures()
            .contains_key(&ClusterName::from("fleet/steered"))
    })
    .await;
    let failures = provider.failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    let reason = &failures[&ClusterName::from("fleet/steered")];
    assert!(
        reason.contains(r#"users["steered"].user.exec.env sets "HTTPS_PROXY""#)
            && reason.contains("AllowedPlugin::env"),
        "{reason}"
    );
    assert!(!reason.contains("127.0.0.1:9"), "{reason}");
    assert_eq!(plugins::calls(state.path()).len(), 1);
    assert!(
        plugins::calls(steered_state.path()).is_empty(),
        "the plugin ran with a variable the operator did not name"
    );
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
