//! Clusters from kubeconfig files and directories (Go: `providers/file`).
//!
//! Every context of every kubeconfig found is a cluster named
//! `<path><separator><context>` (separator `+` by default). Sources are
//! explicit files and directories searched with glob patterns (defaults:
//! `kubeconfig.yaml`, `kubeconfig.yml`, `*.kubeconfig`, `*.kubeconfig.yaml`,
//! `*.kubeconfig.yml`). With neither files nor directories: the files in
//! `$KUBECONFIG`, else `~/.kube/config` if it exists, else the working
//! directory as a directory.
//!
//! The parent directory of each file and each directory is watched (with
//! `notify`). Only events that change content count — a file created,
//! written, removed or renamed that is one of the sources — and a burst of
//! them (an editor's save, a tool writing in steps) is read once, after
//! [`FileOptions::debounce`] of quiet. Reading a file is not a change, so
//! the provider never wakes itself up.
//!
//! Each context is fingerprinted by what it resolves to — the context, its
//! cluster and its user with their data, extensions and exec settings
//! ([`multicluster_runtime::client::kubeconfig::Contexts::text`]) — so an edit
//! elsewhere in the file leaves it alone: its client is not rebuilt and its
//! credential plugin does not run. Changed contexts are built concurrently
//! (up to [`FileOptions::max_concurrent_builds`]), each engaged as soon as
//! its client is ready, each retried on its own with backoff when its
//! credentials cannot be obtained (a plugin that fails or hangs past its
//! timeout); none holds up another or the file watch.
//!
//! The files are the operator's, so their kubeconfigs may use what kubectl
//! would (exec plugins, files, auth providers, proxies): the default
//! [`FileOptions::kubeconfig_policy`] is
//! [`KubeconfigPolicy::trusted`]. Tighten it for files written by others
//! (a directory another tool fills).
//!
//! Missing paths are skipped. A file that cannot be read or parsed, and a
//! context that names a cluster or user the file does not have (a file
//! written in two steps looks like this in between), keep the clusters they
//! had until they are fixed or removed: the reason is logged once and
//! listed by [`FileProvider::failures`]. Duplicate names are logged and the
//! first kept. Discovery never contacts a cluster: a server that is down is
//! engaged and reported unreachable by the manager, and holds up nothing.

mod scan;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::controller::{Action, Backoff, Request, WorkQueue};
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::provider::discovery::Discovered;
use multicluster_runtime::provider::lock;
use multicluster_runtime::provider::member::Members;
use multicluster_runtime::{
    ClusterName, Error, InventoryEngaged, ProviderContext, RunnableProvider,
};
use notify::Watcher;
use tokio_util::sync::CancellationToken;

use scan::Desired;

/// The default separator between path and context.
pub const DEFAULT_SEPARATOR: &str = "+";

/// The default patterns searched in directories.
pub const DEFAULT_PATTERNS: [&str; 5] = [
    "kubeconfig.yaml",
    "kubeconfig.yml",
    "*.kubeconfig",
    "*.kubeconfig.yaml",
    "*.kubeconfig.yml",
];

/// How long the files must be quiet after a change before they are read.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(100);

/// Options of the file provider.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FileOptions {
    /// This instance's name (default `file`): the label `provider` of
    /// its metrics, and its controller's name with `-provider` appended
    /// (logs and spans carry it). Give instances in one process (two in a
    /// multi provider, say) different names, so their figures stay apart.
    pub name: String,
    /// Kubeconfig files.
    pub files: Vec<PathBuf>,
    /// Directories searched with `patterns`.
    pub directories: Vec<PathBuf>,
    /// Glob patterns for file names in `directories`.
    pub patterns: Vec<String>,
    /// Between path and context in cluster names.
    pub separator: String,
    /// How long to wait before building a context again whose credentials
    /// could not be obtained (default [`Discovered::DEFAULT_BACKOFF`]: 1 s, doubling up
    /// to 5 min).
    pub retry: Backoff,
    /// How many contexts' clients are built at once (default
    /// [`Discovered::DEFAULT_MAX_CONCURRENT_BUILDS`]).
    pub max_concurrent_builds: usize,
    /// How long the files must be quiet after a change before they are read
    /// (default [`DEFAULT_DEBOUNCE`]); a steady stream of changes is read at
    /// least every ten times this.
    pub debounce: Duration,
    /// How each member's clients and cache are built: the same for every
    /// member, or adjusted per member from the file and context it comes
    /// from ([`Members::per_member`] sees a [`FileContext`]). A
    /// `ClientOptions`, `CacheOptions` or `MemberOptions` converts into it.
    pub members: Members<FileContext>,
    /// What the files' kubeconfigs may use (default
    /// [`KubeconfigPolicy::trusted`]: everything, as kubectl).
    pub kubeconfig_policy: KubeconfigPolicy,
}

/// Where a member of the file provider comes from: what
/// [`Members::per_member`] is shown for it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileContext {
    /// The kubeconfig file.
    pub file: PathBuf,
    /// The context in it.
    pub context: String,
}

multicluster_runtime::option_setters!(FileOptions {
    name: impl Into<String>,
    files: impl Into<Vec<PathBuf>>,
    directories: impl Into<Vec<PathBuf>>,
    patterns: impl Into<Vec<String>>,
    separator: impl Into<String>,
    retry: Backoff,
    max_concurrent_builds: usize,
    debounce: Duration,
    members: impl Into<Members<FileContext>>,
    kubeconfig_policy: KubeconfigPolicy,
});

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            name: "file".to_string(),
            files: Vec::new(),
            directories: Vec::new(),
            patterns: DEFAULT_PATTERNS.iter().map(|p| p.to_string()).collect(),
            separator: DEFAULT_SEPARATOR.to_string(),
            retry: Discovered::DEFAULT_BACKOFF,
            max_concurrent_builds: Discovered::DEFAULT_MAX_CONCURRENT_BUILDS,
            debounce: DEFAULT_DEBOUNCE,
            members: Members::default(),
            kubeconfig_policy: KubeconfigPolicy::trusted(),
        }
    }
}

/// Kubeconfig files and directories as a fleet.
#[derive(Debug)]
pub struct FileProvider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: FileOptions,
    fleet: Discovered,
    /// What the last reading of the files asks for, per cluster name.
    desired: std::sync::Mutex<BTreeMap<ClusterName, Desired>>,
    /// Builds, one key per cluster name.
    builds: WorkQueue,
    /// Kubeconfig files read so far.
    reads: AtomicU64,
    /// Fired once the files were read the first time.
    read_once: CancellationToken,
}

impl FileProvider {
    /// A provider over `options`' sources, or the default sources when it
    /// names none.
    pub fn new(mut options: FileOptions) -> Self {
        if options.files.is_empty() && options.directories.is_empty() {
            default_sources(&mut options);
        }
        let builds = WorkQueue::builder(format!("{}-provider", options.name))
            .max_concurrent(options.max_concurrent_builds)
            .backoff(options.retry)
            .build();
        Self {
            shared: Arc::new(Shared {
                fleet: Discovered::new(options.name.as_str(), None),
                options,
                desired: std::sync::Mutex::default(),
                builds,
                reads: AtomicU64::new(0),
                read_once: CancellationToken::new(),
            }),
        }
    }

    /// Contexts (by cluster name) and files (by path) that cannot be used
    /// now, each with the reason; the clusters they had stay engaged.
    pub fn failures(&self) -> BTreeMap<ClusterName, String> {
        self.shared.fleet.failures().current()
    }

    /// How many times a kubeconfig file has been read: once per source file
    /// at start and once per file after each change, never more. For the
    /// provider's own tests, which show that an idle provider reads nothing.
    #[doc(hidden)]
    pub fn file_reads(&self) -> u64 {
        self.shared.reads.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn desired(&self, name: &ClusterName) -> Option<Desired> {
        lock(&self.desired).get(name).cloned()
    }

    /// Reads every source and queues a build (or removal) of every cluster
    /// whose context changed. The reading runs on a blocking thread: a large
    /// file takes a while to parse, and a file on a network mount can hang.
    async fn read_files(self: &Arc<Self>) {
        let shared = self.clone();
        let found = match tokio::task::spawn_blocking(move || scan::scan(&shared)).await {
            Ok(found) => found,
            Err(error) => {
                tracing::error!(%error, "reading the kubeconfig files failed; keeping what was read before");
                return;
            }
        };
        let mut desired = lock(&self.desired);
        let changed: Vec<ClusterName> = desired
            .iter()
            .filter(|(name, before)| found.get(*name) != Some(*before))
            .map(|(name, _)| name.clone())
            .chain(
                found
                    .keys()
                    .filter(|name| !desired.contains_key(*name))
                    .cloned(),
            )
            .collect();
        *desired = found;
        drop(desired);
        for name in changed {
            self.builds.enqueue(Request::new(name, None, ""));
        }
    }

    /// Brings one cluster in line with its context.
    async fn reconcile(&self, name: ClusterName) -> Result<Action, Error> {
        match self.desired(&name) {
            None => {
                self.fleet.remove(&name, "its context is gone");
                Ok(Action::await_change())
            }
            // Keeps whatever it had until its file is fixed.
            Some(Desired::Broken) => Ok(Action::await_change()),
            Some(Desired::Context(wanted)) => {
                let now = || match self.desired(&name) {
                    Some(Desired::Context(now)) => Some(*now),
                    _ => None,
                };
                self.fleet.engage(*wanted, now).await
            }
        }
    }

    /// Whether a file system event can change what the sources hold.
    fn matters(&self, event: &notify::Event, patterns: &[glob::Pattern]) -> bool {
        use notify::EventKind::{Create, Modify, Remove};
        use notify::event::{AccessKind, AccessMode, ModifyKind};
        let changes_content = match event.kind {
            Create(_) | Remove(_) => true,
            Modify(ModifyKind::Metadata(_)) => false,
            Modify(_) => true,
            // A file closed after writing: the write is complete.
            notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
            _ => false,
        };
        changes_content
            && event.paths.iter().any(|path| {
                let path = canonical(path);
                self.options
                    .files
                    .iter()
                    .any(|file| canonical(file) == path)
                    || (path.parent().is_some_and(|dir| {
                        self.options
                            .directories
                            .iter()
                            .any(|watched| canonical(watched) == dir)
                    }) && path
                        .file_name()
                        .and_then(|name| name.to_str())
                        .is_some_and(|name| patterns.iter().any(|p| p.matches(name))))
            })
    }

    /// Waits for the files to be quiet for [`FileOptions::debounce`] (a
    /// write is often several events), but at most ten times that; false
    /// when the provider stops meanwhile.
    async fn quiet_after(
        &self,
        changed: &mut tokio::sync::mpsc::UnboundedReceiver<notify::Event>,
        shutdown: &CancellationToken,
    ) -> bool {
        let debounce = self.options.debounce;
        let give_up = tokio::time::Instant::now() + debounce * 10;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(debounce) => return true,
                () = tokio::time::sleep_until(give_up) => return true,
                event = changed.recv() => if event.is_none() { return false },
            }
        }
    }

    /// Directories whose changes matter: each directory and each file's
    /// parent (the file itself may not exist yet, or be replaced).
    fn watched_directories(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = self.options.directories.clone();
        dirs.extend(self.options.files.iter().map(|file| {
            file.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf()
        }));
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// Reads the files once, then again after every burst of changes, until
    /// `shutdown` fires.
    async fn watch(self: &Arc<Self>, shutdown: CancellationToken) -> Result<(), Error> {
        let patterns: Vec<glob::Pattern> = self
            .options
            .patterns
            .iter()
            .filter_map(|pattern| match glob::Pattern::new(pattern) {
                Ok(pattern) => Some(pattern),
                Err(err) => {
                    tracing::warn!(%pattern, error = %err, "skipping an invalid pattern");
                    None
                }
            })
            .collect();
        let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<notify::Event>();
        // notify calls back on its own thread; the event is all we need.
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if let Ok(event) = event {
                    let _ = changed_tx.send(event);
                }
            })
            .map_err(|err| Error::Watch {
                what: "the kubeconfig files".to_string(),
                source: Box::new(err),
            })?;
        for dir in self.watched_directories() {
            match watcher.watch(&dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => tracing::debug!(directory = %dir.display(), "watching"),
                Err(err) => {
                    tracing::warn!(directory = %dir.display(), error = %err, "cannot watch the directory; changes there are missed")
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = self.read_files() => {}
        }
        self.read_once.cancel();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                event = changed.recv() => match event {
                    Some(event) if self.matters(&event, &patterns) => {}
                    Some(_) => continue,
                    None => return Ok(()),
                },
            }
            if !self.quiet_after(&mut changed, &shutdown).await {
                return Ok(());
            }
            // A read hung on a network mount must not hold up shutdown.
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = self.read_files() => {}
            }
        }
    }
}

/// One spelling for every path that names a file, so that sources and
/// file system events can be compared: absolute (notify reports absolute
/// paths for relative watches), with `.`, `..` and symbolic links in the
/// directory resolved. The file itself is not resolved: it may not exist
/// (yet, or any more), and a link in its place is the source. A directory
/// that does not exist keeps its absolute spelling.
fn canonical(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if let Ok(resolved) = std::fs::canonicalize(&absolute)
        && resolved.is_dir()
    {
        return resolved;
    }
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .unwrap_or_else(|_| parent.to_path_buf())
            .join(name),
        _ => absolute,
    }
}

fn default_sources(options: &mut FileOptions) {
    if let Some(paths) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        options.files = std::env::split_paths(&paths)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        return;
    }
    if let Some(home) = std::env::var_os("HOME") {
        let config = PathBuf::from(home).join(".kube").join("config");
        if config.exists() {
            options.files = vec![config];
            return;
        }
    }
    options.directories = vec![PathBuf::from(".")];
}

impl ClusterSetProvider for FileProvider {
    fn cluster_set(&self) -> &Clusters {
        self.shared.fleet.clusters()
    }
}

#[async_trait::async_trait]
impl RunnableProvider for FileProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        self.shared.fleet.start(&context)?;
        let shutdown = context.shutdown.clone();
        let shared = self.shared.clone();
        let stop_builds = shutdown.child_token();
        // Builds still running at the end are dropped at once, which stops
        // their plugins: nobody will use the clients.
        let builds = self
            .shared
            .builds
            .run(stop_builds.clone(), Duration::ZERO, move |key| {
                let shared = shared.clone();
                async move { shared.reconcile(key.cluster).await }
            });
        tokio::pin!(builds);
        // The first read queued every context: once each was tried, the
        // inventory is engaged.
        let first_pass = async {
            self.shared.read_once.cancelled().await;
            self.shared.builds.idle().await;
        };
        let watching = self.shared.watch(shutdown);
        tokio::pin!(watching);
        let engaged = tokio::select! {
            () = first_pass => context.inventory_engaged(),
            watched = &mut watching => {
                stop_builds.cancel();
                builds.await;
                watched?;
                return Ok(context.stopped_before_engaged());
            }
            // Only at shutdown.
            () = &mut builds => return Ok(context.stopped_before_engaged()),
        };
        tokio::select! {
            watched = watching => {
                stop_builds.cancel();
                builds.await;
                watched?;
            }
            // Only at shutdown.
            () = &mut builds => {}
        }
        Ok(engaged)
    }
}

#[cfg(test)]
mod tests {
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, ModifyKind, RenameMode};
    use notify::{Event, EventKind};

    use super::*;

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn only_content_changes_of_the_sources_matter() {
        let provider = FileProvider::new(
            FileOptions::default()
                .files(vec![PathBuf::from("fleet.yaml")])
                .directories(vec![PathBuf::from("/etc/fleet")]),
        );
        let patterns: Vec<glob::Pattern> = DEFAULT_PATTERNS
            .iter()
            .map(|p| glob::Pattern::new(p).expect("pattern"))
            .collect();
        let matters = |kind, path| provider.shared.matters(&event(kind, path), &patterns);
        let written = EventKind::Modify(ModifyKind::Data(DataChange::Content));
        // The explicit file, reported through the directory it is watched in.
        assert!(matters(written, "./fleet.yaml"));
        assert!(matters(written, "fleet.yaml"));
        assert!(matters(
            EventKind::Create(CreateKind::File),
            "/etc/fleet/a.kubeconfig"
        ));
        assert!(matters(
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            "/etc/fleet/b.kubeconfig"
        ));
        assert!(matters(
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            "/etc/fleet/b.kubeconfig"
        ));
        // Reads are no change, and neither are other files.
        assert!(!matters(
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            "./fleet.yaml"
        ));
        assert!(!matters(
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            "/etc/fleet/a.kubeconfig"
        ));
        let absolute = std::env::current_dir()
            .expect("working directory")
            .join("fleet.yaml")
            .display()
            .to_string();
        assert!(
            matters(written, &absolute),
            "notify reports a relative source by its absolute path"
        );
        assert!(!matters(written, "./other.yaml"));
        assert!(!matters(written, "/etc/fleet/notes.txt"));
        assert!(!matters(written, "/etc/fleet/sub/a.kubeconfig"));
    }
}
