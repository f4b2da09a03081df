//! The local control plane starts quietly: waiting for its API server is
//! not an error, so a normal start logs none.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-local-control-plane");

/// The control plane's own processes, by name (cut to 15 characters, as
/// the kernel keeps them).
fn children(parent: u32) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...
        let Some((name, rest)) = stat
            .split_once(" (")
            .and_then(|(_, rest)| rest.rsplit_once(") "))
        else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|ppid| ppid.parse::<u32>().ok());
        if ppid == Some(parent) {
            names.push(name.to_string());
        }
    }
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_start_logs_no_error() {
    start_and_stop(&[], &["etcd", "kube-apiserver", "kube-controller"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_controller_manager_it_runs_none() {
    start_and_stop(&["--no-controller-manager"], &["etcd", "kube-apiserver"]).await;
}

/// Starts the control plane with `args`, checks it started quietly with
/// exactly the processes `runs`, and stops it with SIGTERM.
async fn start_and_stop(args: &[&str], runs: &[&str]) {
    let dir = tempfile::tempdir().expect("dir");
    let kubeconfig = dir.path().join("kubeconfig");
    let logs = dir.path().join("stderr");
    let mut control_plane = Command::new(BINARY)
        .args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&logs).expect("log"))
        .kill_on_drop(true)
        .spawn()
        .expect("start");
    let mut stdout = BufReader::new(control_plane.stdout.take().expect("stdout")).lines();
    let mut printed = Vec::new();
    let ready = tokio::time::timeout(Duration::from_secs(120), async {
        while let Ok(Some(line)) = stdout.next_line().await {
            if line.contains("control plane ready") {
                return true;
            }
            printed.push(line);
        }
        false
    })
    .await
    .expect("started in time");
    assert!(ready, "the control plane did not report ready");
    assert!(kubeconfig.exists());
    let printed = printed.join("\n") + &std::fs::read_to_string(&logs).expect("stderr");
    assert!(
        !printed.contains("ERROR"),
        "errors on a normal start:\n{printed}"
    );

    // A child may still be its `setpriv` wrapper for a moment, before it
    // execs the binary: the processes are looked at until they settle.
    let parent = control_plane.id().expect("running");
    let settled = multicluster_runtime::testing::poll_within(
        Duration::from_secs(30),
        multicluster_runtime::testing::Polled::OtherProcess,
        || async {
            let running = children(parent);
            if running == runs {
                Ok(())
            } else {
                Err(format!("{running:?}"))
            }
        },
    )
    .await;
    if let Err(running) = settled {
        panic!("{args:?}: the control plane runs {running}, not {runs:?}");
    }

    let pid = control_plane.id().expect("running").to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    let status = tokio::time::timeout(Duration::from_secs(30), control_plane.wait())
        .await
        .expect("stopped in time")
        .expect("status");
    assert!(status.success(), "{status}");
}
