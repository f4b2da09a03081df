//! The kind provider against a stand-in `kind` executable that lists
//! clusters from a directory and prints kubeconfigs for a real control
//! plane, for what the real CLI cannot be made to do here: a call that
//! hangs, and a dozen clusters at once (a dozen node containers, each with
//! its own API server, would not fit beside the rest of `make test`).
//! `tests/real_kind.rs` runs the real CLI and podman for the rest.

mod common;

use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::Polled;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use multicluster_envtest::ControlPlane;
use multicluster_provider_kind::{KindOptions, KindProvider};
use multicluster_runtime::controller::Request;
use multicluster_runtime::testing::{eventually, recording_manager, run_manager, wait_until_left};
use multicluster_runtime::{Cluster, ClusterName, Manager, ManagerOptions};
use tokio_util::sync::CancellationToken;

/// A directory standing in for kind's state, and a script reading it:
/// `clusters` lists names, `<name>.kubeconfig` holds each kubeconfig, and a
/// `hang-<name>` file makes that cluster's `get kubeconfig` hang.
struct FakeKind {
    dir: tempfile::TempDir,
}

impl FakeKind {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().display();
        let script = format!(
            r#"#!/bin/sh
state="{state}"
case "$1 $2" in
  "get clusters")
    if [ -s "$state/clusters" ]; then cat "$state/clusters"; else echo "No kind clusters found." >&2; fi ;;
  "get kubeconfig")
    if [ -e "$state/hang-$4" ]; then echo $$ > "$state/hung-pid"; exec sleep 1000; fi
    [ "$3" = "--name" ] && [ -e "$state/$4.kubeconfig" ] || {{ echo "ERROR: could not locate any control plane nodes for cluster named '$4'" >&2; exit 1; }}
    cat "$state/$4.kubeconfig" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"#
        );
        let path = dir.path().join("kind");
        std::fs::write(&path, script).expect("script");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(dir.path().join("clusters"), "").expect("clusters");
        Self { dir }
    }

    fn command(&self) -> PathBuf {
        self.dir.path().join("kind")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn set_clusters(&self, clusters: &[(&str, &str)]) {
        let names: String = clusters
            .iter()
            .map(|(name, _)| format!("{name}\n"))
            .collect();
        for (name, kubeconfig) in clusters {
            self.replace(&format!("{name}.kubeconfig"), kubeconfig);
        }
        self.replace("clusters", &names);
    }

    /// Writes a state file whole: the provider polls every 100 ms, and a
    /// poll reading a file truncated but not yet written would see no
    /// clusters at all (as kind says when there are none) and remove them.
    fn replace(&self, name: &str, contents: &str) {
        let partial = self.path(&format!(".{name}.partial"));
        std::fs::write(&partial, contents).expect("state file");
        std::fs::rename(&partial, self.path(name)).expect("state file");
    }
}

fn options(kind: &Path, prefix: Option<&str>) -> KindOptions {
    KindOptions::default()
        .prefix(prefix.map(str::to_string))
        .poll_interval(Duration::from_millis(100))
        .kind_command(kind.to_path_buf())
}

async fn create(cp: &ControlPlane, name: &str) {
    cp.create_config_map(name, &[]).await.expect("create");
}

fn req(cluster: &str, name: &str) -> Request {
    Request::new(cluster, Some("default"), name)
}

#[tokio::test]
async fn a_missing_kind_cli_is_a_clear_error() {
    let provider = KindProvider::new(options(Path::new("/nonexistent/kind"), None));
    let err = common::start_error(provider).await;
    assert!(err.to_string().contains("kind CLI was not found"), "{err}");
    // The cause travels with it, for callers that look at it.
    let io = std::error::Error::source(&err)
        .and_then(std::error::Error::source)
        .and_then(|cause| cause.downcast_ref::<std::io::Error>())
        .expect("the spawn error is the source's source");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}

#[tokio::test]
async fn a_manager_whose_provider_cannot_start_stops_with_the_providers_error() {
    let provider = Arc::new(KindProvider::new(options(
        Path::new("/nonexistent/kind"),
        None,
    )));
    let local = multicluster_runtime::testing::offline_cluster("local");
    let manager = Manager::builder(local).provider(provider).build();
    // Never cancelled: run() must end by itself.
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        manager.run(CancellationToken::new()),
    )
    .await
    .expect("run() returns when the provider fails");
    let err = result.expect_err("the provider's error");
    assert!(err.to_string().contains("kind CLI was not found"), "{err}");
}

/// A cluster whose `kind get kubeconfig` never returns holds up only itself:
/// clusters listed after it are engaged, one no longer listed is removed,
/// and stopping the provider stops the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_kind_call_hangs_holds_up_only_itself() {
    let cp = ControlPlane::start().await.expect("control plane");
    create(&cp, "hello").await;
    let kubeconfig = multicluster_envtest::to_yaml(cp.kubeconfig()).expect("yaml");
    let kind = FakeKind::new();
    std::fs::write(kind.path("hang-stuck"), "").expect("hang");
    kind.set_clusters(&[("stuck", &kubeconfig), ("before", &kubeconfig)]);

    let provider = Arc::new(KindProvider::new(options(&kind.command(), None)));
    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    recorder.wait_for_more(&req("before", "hello"), 0).await;
    let hung_pid = || {
        std::fs::read_to_string(kind.path("hung-pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok())
    };
    eventually(Polled::OtherProcess, "the hanging call to run", || async {
        hung_pid().is_some_and(multicluster_envtest::plugins::is_running)
    })
    .await;
    let hung = hung_pid().expect("the hanging call's PID");

    kind.set_clusters(&[("stuck", &kubeconfig), ("after", &kubeconfig)]);
    recorder.wait_for_more(&req("after", "hello"), 0).await;
    wait_until_left(&manager, "before").await;
    assert_eq!(provider.names(), [ClusterName::from("after")]);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
    multicluster_envtest::plugins::wait_until_stopped(hung, "the hanging kind call").await;
}

/// The provider says its inventory is engaged (what a sharded replica
/// waits for before it joins its peers) once every cluster of the first
/// listing was looked at: the usable ones engaged, a broken one skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_is_engaged_once_every_listed_cluster_was_looked_at() {
    let cp = ControlPlane::start().await.expect("control plane");
    let kubeconfig = multicluster_envtest::to_yaml(cp.kubeconfig()).expect("yaml");
    let kind = FakeKind::new();
    let names: Vec<String> = (0..12).map(|i| format!("dev-{i}")).collect();
    let mut clusters: Vec<(&str, &str)> = names
        .iter()
        .map(|name| (name.as_str(), kubeconfig.as_str()))
        .collect();
    clusters.push(("dev-broken", "not: [a kubeconfig"));
    kind.set_clusters(&clusters);
    let provider = Arc::new(KindProvider::new(options(&kind.command(), None)));
    let (engaged, started) =
        multicluster_runtime::testing::engaged_when_inventory_is(provider).await;
    let mut expected: Vec<ClusterName> = names
        .iter()
        .map(|name| ClusterName::from(name.as_str()))
        .collect();
    expected.sort();
    assert_eq!(
        engaged, expected,
        "said before every listed cluster was looked at"
    );
    started.stop().await.expect("clean stop");
}
