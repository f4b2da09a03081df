//! The example binary against a real hub and member: a ClusterProfile whose
//! access provider is envtest's token plugin, and the copy controller doing
//! its work in the member.

use multicluster_runtime::testing::Polled;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_example_configmap_sync::SYNC_LABEL;
use multicluster_example_testing::{GRACE, terminate};
use multicluster_runtime::testing::eventually;
use serde_json::json;
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-cluster-inventory-api");

#[tokio::test]
async fn exactly_one_credentials_source_is_required() {
    for args in [
        &[][..],
        &[
            "--consumer",
            "me",
            "--clusterprofile-provider-file",
            "p.json",
        ],
    ] {
        let out = Command::new(BINARY).args(args).output().await.expect("run");
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--consumer"), "{stderr}");
        assert!(
            stderr.contains("--clusterprofile-provider-file"),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn a_bad_provider_file_stops_the_example_with_its_name() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("providers.json");
    std::fs::write(&path, r#"{"providers": []}"#).expect("write");
    let out = Command::new(BINARY)
        .arg("--clusterprofile-provider-file")
        .arg(&path)
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("provider file {}", path.display())),
        "{stderr}"
    );
    assert!(stderr.contains("lists no providers"), "{stderr}");
}

/// A provider file whose plugin reads what profiles write and names no
/// server: the example warns at start that its profiles are refused, and
/// with `--allow-unbound-profile-input` that profile writers may choose
/// whose credential is minted; a provider the flag names that the file
/// does not have stops it.
#[tokio::test]
async fn the_opt_in_flag_names_a_provider_and_is_told_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("providers.json");
    let providers = json!({"providers": [{
        "name": "token",
        "execConfig": {"command": plugins::TOKEN, "provideClusterInfo": true},
    }]});
    std::fs::write(&path, providers.to_string()).expect("write");
    // A hub nobody answers at: the warnings come before it is asked.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n",
    )
    .expect("kubeconfig");
    let start = |extra: &[&str]| {
        Command::new(BINARY)
            .arg("--clusterprofile-provider-file")
            .arg(&path)
            .args(extra)
            .args(["--health-address", "127.0.0.1:0"])
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("example")
    };
    for (extra, says) in [
        (&[][..], "profiles choosing it are refused"),
        (
            &["--allow-unbound-profile-input", "token"][..],
            "whoever may write a ClusterProfile's status can choose whose credential it mints",
        ),
    ] {
        let mut example = start(extra);
        let line = multicluster_example_testing::stderr_line(&mut example, |line| {
            line.contains("WARN") && line.contains("provider=token")
        })
        .await;
        assert!(line.contains(says), "{line}");
    }
    let out = Command::new(BINARY)
        .arg("--clusterprofile-provider-file")
        .arg(&path)
        .args(["--allow-unbound-profile-input", "nope"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("it has no provider \"nope\" (it has \"token\")"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_copies_configmaps_in_a_profiles_cluster() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    let crd = multicluster_envtest::upstream::cluster_profile_crd()
        .await
        .expect("upstream CRD");
    hub.install_crds(&crd).await.expect("CRD");
    hub.create_namespace("inventory").await.expect("namespace");

    // The plugin hands out a token of a cluster-admin service account.
    let state = tempfile::tempdir().expect("state");
    let token = member
        .cluster_admin_token("robots", "example")
        .await
        .expect("token");
    plugins::set_token(state.path(), &token).expect("token");
    let provider_file = state.path().join("providers.json");
    let providers = json!({"providers": [{
        "name": "token",
        "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": plugins::TOKEN,
            "env": [{"name": "STATE_DIR", "value": state.path()}],
        },
        "profileSourcedEnvVarsPolicy": "Replace",
        "profileSourcedEnvVarNames": ["STATE_DIR"],
        // The plugin reads what profiles write: its server named with
        // its CA, as the default asks.
        "servers": [{
            "server": member.server(),
            "certificateAuthorityData": base64::engine::general_purpose::STANDARD.encode(member.ca_pem()),
        }],
    }]});
    std::fs::write(&provider_file, providers.to_string()).expect("provider file");

    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
    ));
    let profiles: Api<DynamicObject> =
        Api::namespaced_with(hub.client().await.expect("client"), "inventory", &resource);

    create_profile(&profiles, "member", &member, json!([])).await;

    let mut example = Command::new(BINARY)
        .arg("--clusterprofile-provider-file")
        .arg(&provider_file)
        .args([
            "--namespace",
            "inventory",
            "--health-address",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", hub.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example");

    let configmaps =
        Api::<ConfigMap>::namespaced(member.client().await.expect("client"), "default");
    let mut source = ConfigMap::default();
    source.metadata.name = Some("settings".into());
    source.metadata.labels = Some([(SYNC_LABEL.to_string(), "true".to_string())].into());
    source.data = Some([("colour".to_string(), "blue".to_string())].into());
    configmaps
        .create(&PostParams::default(), &source)
        .await
        .expect("source");
    eventually(
        Polled::ApiServer,
        "the example to copy the ConfigMap in the member",
        || async {
            configmaps
                .get_opt("settings-copy")
                .await
                .ok()
                .flatten()
                .and_then(|copy| copy.data)
                .is_some_and(|data| data.get("colour").map(String::as_str) == Some("blue"))
        },
    )
    .await;
    assert!(
        example.try_wait().expect("status").is_none(),
        "the example is still running"
    );

    // A profile whose plugin never answers (held until the test ends) does
    // not keep the example from exiting on SIGTERM.
    let held = tempfile::tempdir().expect("state");
    plugins::hold(held.path()).expect("hold");
    create_profile(
        &profiles,
        "held",
        &member,
        json!([{"name": "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs",
                "extension": {"STATE_DIR": held.path()}}]),
    )
    .await;
    let plugin = plugins::first_call_running(held.path()).await;
    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
    plugins::wait_until_stopped(plugin, "the plugin the example ran").await;
}

/// A ready ClusterProfile in `profiles` whose access provider `token`
/// reaches `member`, with extra cluster extensions.
async fn create_profile(
    profiles: &Api<DynamicObject>,
    name: &str,
    member: &ControlPlane,
    extensions: serde_json::Value,
) {
    use base64::Engine;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
    ));
    let mut profile = DynamicObject::new(name, &resource).within("inventory");
    profile.data = json!({"spec": {"clusterManager": {"name": "test"}}});
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .expect("profile");
    let status = json!({"status": {
        "conditions": [{
            "type": "ControlPlaneHealthy", "status": "True", "reason": "Test",
            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
        }],
        "accessProviders": [{"name": "token", "cluster": {
            "server": member.server(),
            "certificate-authority-data":
                base64::engine::general_purpose::STANDARD.encode(member.ca_pem()),
            "extensions": extensions,
        }}],
    }});
    profiles
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("status");
}
