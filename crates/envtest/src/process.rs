//! Child processes that cannot outlive the test that started them.
//!
//! Each process is killed and reaped when its handle is dropped, which also
//! happens while a panicking test unwinds. A process that is killed outright
//! (SIGKILL, `abort`) never runs destructors, so children are additionally
//! started under `setpriv --pdeathsig KILL` when `setpriv` (util-linux) is
//! installed: the kernel kills them as soon as their parent dies.
//!
//! The parent-death signal fires when the *thread* that forked the child
//! exits, not the process. Test harnesses run each test on its own thread
//! and tokio retires idle blocking threads, so all children are forked from
//! one spawner thread that lives as long as the process.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use crate::Error;

/// A running child process whose output goes to a log file.
pub(crate) struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, sending stdout and stderr to `log`.
    pub(crate) fn spawn(
        name: &'static str,
        program: &Path,
        args: Vec<OsString>,
        log: PathBuf,
    ) -> Result<Self, Error> {
        let spawn_error = |source: std::io::Error| Error::Spawn {
            name,
            path: program.to_path_buf(),
            source,
        };
        // Under setpriv a missing program would only show up as setpriv's
        // exit status, so check here and report the path itself.
        std::fs::metadata(program).map_err(spawn_error)?;
        let out = File::create(&log).map_err(spawn_error)?;
        let err = out.try_clone().map_err(spawn_error)?;
        let mut command = match setpriv() {
            Some(setpriv) => {
                let mut command = Command::new(setpriv);
                command.args(["--pdeathsig", "KILL", "--"]).arg(program);
                command
            }
            None => Command::new(program),
        };
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = spawner().spawn(command).map_err(spawn_error)?;
        tracing::debug!(name, pid = child.id(), log = %log.display(), "started");
        Ok(Self { name, child, log })
    }

    /// The exit status if the process has ended.
    pub(crate) fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last lines the process wrote, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        log_tail(&self.log, 25)
    }

    /// Pauses (`SIGSTOP`) or resumes (`SIGCONT`) the process: a paused
    /// server keeps its connections and accepts new ones, but answers
    /// nothing, as a hung server does.
    pub(crate) fn pause(&self, paused: bool) -> std::io::Result<()> {
        let pid = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| std::io::Error::other("no process ID"))?;
        let signal = if paused {
            rustix::process::Signal::STOP
        } else {
            rustix::process::Signal::CONT
        };
        rustix::process::kill_process(pid, signal).map_err(std::io::Error::from)
    }

    /// The process's name, as used in messages.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Killing an exited-but-unreaped child is harmless; `wait` reaps it
        // either way, so no zombie is left behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
        tracing::debug!(name = self.name, "stopped");
    }
}

/// The last `lines` lines of a log file.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn setpriv() -> Option<&'static Path> {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    SETPRIV
        .get_or_init(|| {
            let found = ["/usr/bin/setpriv", "/bin/setpriv"]
                .into_iter()
                .map(PathBuf::from)
                .find(|path| path.exists());
            if found.is_none() {
                tracing::warn!(
                    "setpriv not found: control plane processes are stopped on drop, \
                     but would outlive a test process that is killed outright"
                );
            }
            found
        })
        .as_deref()
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

struct Spawner(Mutex<mpsc::Sender<SpawnRequest>>);

impl Spawner {
    fn spawn(&self, command: Command) -> std::io::Result<Child> {
        let (reply, answer) = mpsc::channel();
        let gone = || std::io::Error::other("the process spawner thread is gone");
        self.0
            .lock()
            .map_err(|_| gone())?
            .send((command, reply))
            .map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

fn spawner() -> &'static Spawner {
    static SPAWNER: OnceLock<Spawner> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        // The thread ends only with the process; see the module docs.
        std::thread::Builder::new()
            .name("envtest-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(|err| tracing::error!(%err, "could not start the spawner thread"));
        Spawner(Mutex::new(requests))
    })
}
