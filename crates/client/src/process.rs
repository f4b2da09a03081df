//! Running external commands — exec credential plugins, CLIs such as
//! `kind` — so that one that hangs holds up nothing but its own caller.
//!
//! [`output`] runs a command on tokio's process driver (no thread blocks on
//! it), in a process group of its own, with a deadline. When the deadline
//! passes, or the caller stops waiting (its future is dropped: a cancelled
//! reconcile, a shutdown), the whole group is killed, so neither the command
//! nor anything it started outlives the call.

use std::process::{Output, Stdio};
use std::time::Duration;

/// Why a command gave no output. The messages name neither the command's
/// arguments nor its environment (they can hold credentials); callers add
/// the command's name.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// It could not be started (not found, not executable, ...).
    #[error("could not be started: {0}")]
    Start(#[source] std::io::Error),
    /// It did not finish in time, and was killed.
    #[error("did not finish within {0:?} and was stopped")]
    TimedOut(Duration),
    /// Waiting for it or reading its output failed.
    #[error("failed while running: {0}")]
    Wait(#[source] std::io::Error),
}

/// Runs `command` until it exits or `timeout` passes, with an empty stdin
/// and its stdout and stderr captured. A non-zero exit status is not an
/// error here: the caller reads it from the [`Output`].
///
/// The command runs in a new process group that is killed when the
/// deadline passes or the returned future is dropped before the command
/// finished.
pub async fn output(
    mut command: tokio::process::Command,
    timeout: Duration,
) -> Result<Output, ProcessError> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run(command, timeout).await
}

/// Like [`output`], for a command that may ask its user something: stdin
/// and stderr are this process's own, only stdout is captured.
pub(crate) async fn output_interactive(
    mut command: tokio::process::Command,
    timeout: Duration,
) -> Result<Output, ProcessError> {
    command
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    run(command, timeout).await
}

async fn run(
    mut command: tokio::process::Command,
    timeout: Duration,
) -> Result<Output, ProcessError> {
    command.kill_on_drop(true);
    #[cfg(unix)]
    command.process_group(0);
    let child = command.spawn().map_err(ProcessError::Start)?;
    let mut group = GroupGuard(child.id());
    let result = tokio::time::timeout(timeout, child.wait_with_output()).await;
    match result {
        Ok(Ok(output)) => {
            // It exited by itself; whatever it left running is not ours to
            // end (and its group number may be reused by now).
            group.0 = None;
            Ok(output)
        }
        Ok(Err(err)) => Err(ProcessError::Wait(err)),
        Err(_) => Err(ProcessError::TimedOut(timeout)),
    }
}

/// Kills the process group it names when dropped.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self.0.take() {
            // Group 1 would be every process we may signal: never that.
            if let Some(group) = i32::try_from(pid)
                .ok()
                .filter(|pid| *pid > 1)
                .and_then(rustix::process::Pid::from_raw)
            {
                // Gone already is fine: there is nothing left to stop.
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use multicluster_envtest::plugins::is_running as alive;

    use super::*;

    /// A shell that starts a long sleep in the background (a grandchild),
    /// writes that sleep's PID to `pid_file`, then waits for it.
    fn hanging(pid_file: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("sh");
        command.arg("-c").arg(format!(
            "sleep 1000 & echo $! > {}; wait",
            pid_file.display()
        ));
        command
    }

    async fn pid_from(file: &Path) -> u32 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = std::fs::read_to_string(file)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                return pid;
            }
            assert!(tokio::time::Instant::now() < deadline, "no PID written");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn wait_until_gone(pid: u32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "process {pid} is still running"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn output_and_exit_status_are_returned() {
        let mut command = tokio::process::Command::new("sh");
        command.arg("-c").arg("echo out; echo err >&2; exit 3");
        let output = output(command, Duration::from_secs(10))
            .await
            .expect("runs");
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");
        assert_eq!(output.status.code(), Some(3));
    }

    #[tokio::test]
    async fn a_command_past_its_deadline_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().expect("dir");
        let pid_file = dir.path().join("pid");
        let run = tokio::spawn(output(hanging(&pid_file), Duration::from_millis(500)));
        let grandchild = pid_from(&pid_file).await;
        let err = run.await.expect("task").expect_err("times out");
        assert!(matches!(err, ProcessError::TimedOut(_)), "{err}");
        wait_until_gone(grandchild).await;
    }

    #[tokio::test]
    async fn dropping_the_call_kills_the_command() {
        let dir = tempfile::tempdir().expect("dir");
        let pid_file = dir.path().join("pid");
        let run = tokio::spawn(output(hanging(&pid_file), Duration::from_secs(3600)));
        let grandchild = pid_from(&pid_file).await;
        assert!(alive(grandchild));
        run.abort();
        let _ = run.await;
        wait_until_gone(grandchild).await;
    }

    #[tokio::test]
    async fn a_missing_command_cannot_be_started() {
        let command = tokio::process::Command::new("/nonexistent/plugin");
        let err = output(command, Duration::from_secs(1))
            .await
            .expect_err("missing");
        assert!(matches!(err, ProcessError::Start(_)), "{err}");
    }
}
