//! The control plane is real: kube-rs and kubectl talk to it over HTTPS, RBAC
//! is enforced, data survives an API server restart, and nothing is left
//! behind when it is dropped.

use std::collections::BTreeMap;
mod common;

use std::time::Duration;

use common::{eventually, until_object};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use multicluster_envtest::{Binaries, ControlPlane, Error};

const DEADLINE: Duration = Duration::from_secs(30);

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("key".to_string(), value.to_string())])),
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn config_maps_can_be_created_listed_and_watched() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let api = Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default");

    // Start watching first so the creation below must arrive as an event.
    let mut events = watcher(
        api.clone(),
        watcher::Config::default().fields("metadata.name=watched"),
    )
    .applied_objects()
    .boxed();
    api.create(&PostParams::default(), &config_map("watched", "one"))
        .await
        .expect("create");

    let listed = api.list(&ListParams::default()).await.expect("list");
    assert!(
        listed
            .items
            .iter()
            .any(|cm| cm.metadata.name.as_deref() == Some("watched"))
    );

    let seen = tokio::time::timeout(DEADLINE, events.try_next())
        .await
        .expect("watch event before the deadline")
        .expect("watch stream healthy")
        .expect("stream not ended");
    assert_eq!(
        seen.data.and_then(|d| d.get("key").cloned()).as_deref(),
        Some("one")
    );
}

#[tokio::test]
async fn kubectl_with_the_admin_kubeconfig_sees_the_same_objects() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let api = Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default");
    api.create(&PostParams::default(), &config_map("from-rust", "hello"))
        .await
        .expect("create");

    let output = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args([
            "get",
            "configmap",
            "from-rust",
            "-n",
            "default",
            "-o",
            "jsonpath={.data.key}",
        ])
        .output()
        .await
        .expect("kubectl runs (install the kubernetes-client package)");
    assert!(
        output.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello");
}

#[tokio::test]
async fn rbac_limits_a_restricted_user_to_what_a_role_grants() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let admin = cp.client().await.expect("client");
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("team-a".into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .expect("namespace");
    let role = Role {
        metadata: ObjectMeta {
            name: Some("read-config".into()),
            namespace: Some("team-a".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["get".into(), "list".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), "team-a")
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("alice-reads-config".into()),
            namespace: Some("team-a".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "read-config".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: "alice".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, "team-a")
        .create(&PostParams::default(), &binding)
        .await
        .expect("role binding");

    let alice =
        multicluster_envtest::client_for(&cp.user_kubeconfig("alice", None).expect("kubeconfig"))
            .await
            .expect("client");
    let allowed = Api::<ConfigMap>::namespaced(alice.clone(), "team-a")
        .list(&ListParams::default())
        .await;
    assert!(allowed.is_ok(), "alice may list in team-a: {allowed:?}");
    let denied = Api::<ConfigMap>::namespaced(alice.clone(), "default")
        .list(&ListParams::default())
        .await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(status)) if status.code == 403),
        "alice may not list in default: {denied:?}"
    );
    let write = Api::<ConfigMap>::namespaced(alice, "team-a")
        .create(&PostParams::default(), &config_map("nope", "x"))
        .await;
    assert!(
        matches!(&write, Err(kube::Error::Api(status)) if status.code == 403),
        "alice may not write: {write:?}"
    );
}

#[tokio::test]
async fn service_account_tokens_authenticate_until_the_account_is_deleted() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let kubeconfig = cp
        .service_account_kubeconfig("robots", "robot", Duration::from_secs(3600))
        .await
        .expect("service account kubeconfig");
    let robot = multicluster_envtest::client_for(&kubeconfig)
        .await
        .expect("client");
    // Authenticated but without RBAC: a 403 proves the token was accepted.
    let before = Api::<ConfigMap>::namespaced(robot.clone(), "default")
        .list(&ListParams::default())
        .await;
    assert!(
        matches!(&before, Err(kube::Error::Api(status)) if status.code == 403),
        "token accepted, access denied: {before:?}"
    );

    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
        cp.client().await.expect("client"),
        "robots",
    )
    .delete("robot", &DeleteParams::default())
    .await
    .expect("delete service account");
    // Revocation is checked per request; poll because the authenticator
    // caches briefly.
    eventually(DEADLINE, "the token to be rejected", || {
        let robot = robot.clone();
        async move {
            match Api::<ConfigMap>::namespaced(robot, "default")
                .list(&ListParams::default())
                .await
            {
                Err(kube::Error::Api(status)) if status.code == 401 => Some(()),
                _ => None,
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_restarted_api_server_keeps_its_data_and_port() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let api = Api::<ConfigMap>::namespaced(cp.client().await.expect("client"), "default");
    api.create(&PostParams::default(), &config_map("durable", "kept"))
        .await
        .expect("create");
    let server = cp.server().to_string();
    let report = cp.api_server_report();
    assert!(
        report.starts_with("kube-apiserver running; its log ends:\n"),
        "{report}"
    );
    assert!(report.lines().count() > 2, "the log's last lines: {report}");

    cp.stop_api_server();
    assert_eq!(cp.api_server_report(), "kube-apiserver stopped by the test");
    let while_down = api.get("durable").await;
    assert!(
        while_down.is_err(),
        "no answer while stopped: {while_down:?}"
    );

    cp.start_api_server().await.expect("restart");
    assert_eq!(cp.server(), server);
    let after = until_object(
        DEADLINE,
        &api,
        "durable",
        "the object after restart",
        |durable| durable.is_some(),
    )
    .await
    .expect("the object");
    assert_eq!(
        after.data.and_then(|d| d.get("key").cloned()).as_deref(),
        Some("kept")
    );
}

#[tokio::test]
async fn control_planes_run_side_by_side_with_separate_data() {
    let (first, second) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (first, second) = (first.expect("first starts"), second.expect("second starts"));
    assert_ne!(first.server(), second.server());
    // Their kubeconfigs merge: no context, cluster or user name is shared.
    let names = |cp: &ControlPlane| {
        let kubeconfig = cp.kubeconfig();
        [
            kubeconfig.current_context.clone().unwrap_or_default(),
            kubeconfig.clusters[0].name.clone(),
            kubeconfig.auth_infos[0].name.clone(),
        ]
    };
    let (ours, theirs) = (names(&first), names(&second));
    assert!(
        ours.iter().all(|name| !theirs.contains(name)),
        "{ours:?} {theirs:?}"
    );
    Api::<ConfigMap>::namespaced(first.client().await.expect("client"), "default")
        .create(&PostParams::default(), &config_map("only-in-first", "1"))
        .await
        .expect("create");
    let in_second = Api::<ConfigMap>::namespaced(second.client().await.expect("client"), "default")
        .get_opt("only-in-first")
        .await
        .expect("get");
    assert!(in_second.is_none());
}

#[tokio::test]
async fn dropping_a_control_plane_stops_its_processes_and_removes_its_data() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let data_dir = cp.data_dir().to_path_buf();
    let address = cp.server().trim_start_matches("https://").to_string();
    assert!(std::net::TcpStream::connect(&address).is_ok());

    drop(cp);
    assert!(!data_dir.exists(), "{} removed", data_dir.display());
    assert!(
        std::net::TcpStream::connect(&address).is_err(),
        "nothing listens on {address} any more"
    );
}

#[tokio::test]
async fn a_missing_binary_is_a_clear_error() {
    let missing = std::path::PathBuf::from("/nonexistent/kube-apiserver");
    let mut binaries = Binaries::locate().expect("binaries are built");
    binaries.kube_apiserver = missing.clone();
    let err = ControlPlane::builder()
        .binaries(binaries)
        .start()
        .await
        .expect_err("cannot start without kube-apiserver");
    assert!(
        matches!(&err, Error::Spawn { path, .. } if *path == missing),
        "{err}"
    );
    assert!(
        err.to_string().contains("/nonexistent/kube-apiserver"),
        "{err}"
    );
}

#[test]
fn a_panicking_test_still_stops_its_control_plane() {
    let (found, place) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let cp = ControlPlane::start().await.expect("control plane starts");
            found
                .send((
                    cp.data_dir().to_path_buf(),
                    cp.server().trim_start_matches("https://").to_string(),
                ))
                .expect("send");
            panic!("the test fails while the control plane runs");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let (data_dir, address) = place.recv().expect("the control plane had started");
    assert!(!data_dir.exists(), "{} removed", data_dir.display());
    assert!(
        std::net::TcpStream::connect(&address).is_err(),
        "{address} closed"
    );
}

/// Run by `a_killed_test_process_takes_its_control_plane_with_it` in a child
/// process; not a test on its own.
#[tokio::test]
#[ignore = "helper run in a child process"]
async fn helper_start_then_abort() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    println!("ADDRESS={}", cp.server().trim_start_matches("https://"));
    println!("DATA_DIR={}", cp.data_dir().display());
    use std::io::Write;
    std::io::stdout().flush().expect("flush");
    // No destructors run: only the parent-death signal can stop the children.
    std::process::abort();
}

#[tokio::test]
async fn a_killed_test_process_takes_its_control_plane_with_it() {
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "helper_start_then_abort",
            "--ignored",
            "--nocapture",
        ])
        .output()
        .expect("run helper");
    assert!(!output.status.success(), "the helper aborted");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let address = stdout
        .lines()
        .find_map(|line| line.strip_prefix("ADDRESS="))
        .unwrap_or_else(|| panic!("helper printed its address: {stdout}"))
        .to_string();
    // The orphaned API server is another process: polled until its port
    // refuses.
    eventually(DEADLINE, "kube-apiserver to exit with its parent", || {
        let address = address.clone();
        async move {
            tokio::net::TcpStream::connect(&address)
                .await
                .is_err()
                .then_some(())
        }
    })
    .await;
    // The aborted process could not remove its data directory; tidy up.
    if let Some(dir) = stdout
        .lines()
        .find_map(|line| line.strip_prefix("DATA_DIR="))
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}
