//! Exec credential plugins (client.authentication.k8s.io/v1) for tests,
//! shipped as shell scripts with this crate. Each keeps its state in the
//! directory named by `$STATE_DIR` ([`crate::ControlPlane::exec_kubeconfig`]
//! sets it).

/// Hands out the bearer token in `$STATE_DIR/token` (read at every call, so
/// a test can rotate it; without it the plugin fails the way half-working
/// plugins do: exit 1, its arguments and `$API_KEY` on stdout, "identity
/// service: no token for this cluster" on stderr, and its whole environment
/// as the last stderr line). With `$STATE_DIR/cert` and `$STATE_DIR/key`
/// ([`set_certificate`]) it hands out that client certificate instead. If `$STATE_DIR/ttl`
/// holds a number of seconds, the credential (token or certificate) expires
/// that long after the call, so clients call the plugin again. If `$STATE_DIR/delay` holds a
/// number of seconds, it takes that long to answer; while `$STATE_DIR/hold`
/// exists (up to 2 minutes) it does not answer at all. Every call appends a line to
/// `$STATE_DIR/calls`: `pid=` (its process ID), `args=`, `KEEP=`, `REGION=`
/// and `info=` (the `KUBERNETES_EXEC_INFO` it got), tab-separated.
pub const TOKEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/plugins/token.sh");

/// Always fails: exit 1, its arguments and `$API_KEY` on stdout, its whole
/// environment on stderr, then "identity service: no grant for this
/// cluster" as the last stderr line. Appends a line
/// to `$STATE_DIR/calls` per call when `$STATE_DIR` is set.
pub const REFUSE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/plugins/refuse.sh");

/// The calls a plugin recorded in `state`, one line each.
pub fn calls(state: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(state.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Makes [`TOKEN`] with state directory `state` hand out `token` from its
/// next call on.
pub fn set_token(state: &std::path::Path, token: &str) -> std::io::Result<()> {
    std::fs::write(state.join("token"), token)
}

/// Makes [`TOKEN`] with state directory `state` hand out the client
/// certificate `cert` with its `key` (both PEM) instead of a token from its
/// next call on (see [`crate::ControlPlane::client_certificate`]).
pub fn set_certificate(state: &std::path::Path, cert: &str, key: &str) -> std::io::Result<()> {
    // The key first: the plugin hands out a certificate once `cert` exists.
    std::fs::write(state.join("key"), key)?;
    std::fs::write(state.join("cert"), cert)
}

/// The token [`TOKEN`] with state directory `state` hands out now.
pub fn token(state: &std::path::Path) -> std::io::Result<String> {
    std::fs::read_to_string(state.join("token"))
}

/// Makes [`TOKEN`] with state directory `state` hold every call until
/// [`release`].
pub fn hold(state: &std::path::Path) -> std::io::Result<()> {
    std::fs::write(state.join("hold"), "")
}

/// Lets held calls of [`TOKEN`] with state directory `state` answer.
pub fn release(state: &std::path::Path) -> std::io::Result<()> {
    std::fs::remove_file(state.join("hold"))
}

/// The process IDs of the calls of [`TOKEN`] recorded in `state`, in order.
pub fn pids(state: &std::path::Path) -> Vec<u32> {
    calls(state)
        .iter()
        .filter_map(|call| call.strip_prefix("pid=")?.split('\t').next()?.parse().ok())
        .collect()
}

/// Waits until the first recorded call of [`TOKEN`] with state directory
/// `state` is running, and returns its process ID; panics after a minute.
/// With [`hold`], that call stays running: a plugin that hangs.
pub async fn first_call_running(state: &std::path::Path) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(pid) = pids(state).first().copied().filter(|pid| is_running(*pid)) {
            return pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no running call of the plugin in {}",
            state.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the process `pid` has stopped (a killed process takes a
/// moment to die); panics after ten seconds, naming `what`.
pub async fn wait_until_stopped(pid: u32, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while is_running(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} (process {pid}) is still running"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The processes (not zombies) of process group `group`. Linux only:
/// reads `/proc`.
pub fn group_members(group: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // After the command name: state, ppid, pgrp.
                    let mut fields = stat.rsplit(')').next()?.split_whitespace();
                    let state = fields.next()?;
                    let _ppid = fields.next()?;
                    let pgrp: u32 = fields.next()?.parse().ok()?;
                    Some(state != "Z" && pgrp == group)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Waits until no process of group `group` runs (a plugin run by us
/// leads its own group); panics after `within`, naming `what` and the
/// processes left.
pub async fn wait_until_group_stopped(group: u32, within: std::time::Duration, what: &str) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = group_members(group);
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: processes {left:?} of group {group} still run after {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Whether the process `pid` is running (it exists and is not a zombie
/// waiting to be reaped). Linux only: reads `/proc`.
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the command name, which is in parentheses.
            let state = stat.rsplit(')').next()?.split_whitespace().next()?;
            Some(state != "Z")
        })
        .unwrap_or(false)
}
