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
//! `notify`); any change re-reads everything: new contexts are added,
//! changed ones replaced, vanished ones removed. Missing paths are skipped;
//! unreadable or unparsable files and unusable contexts are logged (naming
//! file and context, never quoting the file) and skipped — a file that
//! turns bad keeps the clusters it had until it is fixed or removed; duplicate names are
//! logged and the first kept. Discovery never contacts a cluster: a server
//! that is down is engaged and reported unreachable by the manager, and
//! holds up nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use multicluster_runtime::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::controller::Backoff;
use multicluster_runtime::retry::{PROVIDER_BACKOFF, Retries};
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, RunnableProvider, kubeconfig};
use notify::Watcher;
use tokio_util::sync::CancellationToken;

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

/// Options of the file provider.
#[derive(Clone, Debug)]
pub struct FileOptions {
    /// Kubeconfig files.
    pub files: Vec<PathBuf>,
    /// Directories searched with `patterns`.
    pub directories: Vec<PathBuf>,
    /// Glob patterns for file names in `directories`.
    pub patterns: Vec<String>,
    /// Between path and context in cluster names.
    pub separator: String,
    /// How long to wait before reading the files again when some context's
    /// credentials could not be obtained (default [`PROVIDER_BACKOFF`]: 1 s,
    /// doubling up to 5 min).
    pub retry: Backoff,
}

impl Default for FileOptions {
    fn default() -> Self {
        Self {
            files: Vec::new(),
            directories: Vec::new(),
            patterns: DEFAULT_PATTERNS.iter().map(|p| p.to_string()).collect(),
            separator: DEFAULT_SEPARATOR.to_string(),
            retry: PROVIDER_BACKOFF,
        }
    }
}

/// Kubeconfig files and directories as a fleet.
#[derive(Debug)]
pub struct FileProvider {
    options: FileOptions,
    clusters: Clusters,
}

impl FileProvider {
    /// A provider over `options`' sources, or the default sources when it
    /// names none.
    pub fn new(mut options: FileOptions) -> Self {
        if options.files.is_empty() && options.directories.is_empty() {
            default_sources(&mut options);
        }
        Self {
            options,
            clusters: Clusters::new(),
        }
    }

    /// Names of the engaged clusters, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.clusters.names()
    }

    /// The files to read now: explicit files plus directory matches.
    fn files(&self) -> Vec<PathBuf> {
        let mut files = self.options.files.clone();
        for dir in &self.options.directories {
            for pattern in &self.options.patterns {
                let full = dir.join(pattern);
                let Some(full) = full.to_str() else {
                    tracing::warn!(directory = %dir.display(), "skipping a directory whose path is not UTF-8");
                    continue;
                };
                match glob::glob(full) {
                    Ok(paths) => {
                        files.extend(paths.filter_map(Result::ok).filter(|path| path.is_file()))
                    }
                    Err(err) => {
                        tracing::warn!(pattern = %pattern, error = %err, "skipping an invalid pattern")
                    }
                }
            }
        }
        files.sort();
        files.dedup();
        files
    }

    /// Reads every source and brings the cluster set in line with it.
    /// Brings the fleet in line with the files; false when some context's
    /// credentials could not be obtained and another sync should follow.
    async fn sync(&self) -> bool {
        // Name -> the new client and fingerprint, or None when unchanged;
        // BTreeMap keeps the first of duplicates.
        let mut found: BTreeMap<ClusterName, Option<(kube::Client, String)>> = BTreeMap::new();
        let mut complete = true;
        // Files that exist but cannot be read or parsed right now (often: a
        // write in progress) keep the clusters they had, instead of flapping.
        let mut keep_prefixes: Vec<String> = Vec::new();
        for file in self.files() {
            let text = match std::fs::read_to_string(&file) {
                Ok(text) => text,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => {
                    tracing::warn!(file = %file.display(), error = %err, "skipping an unreadable kubeconfig file");
                    keep_prefixes.push(format!("{}{}", file.display(), self.options.separator));
                    continue;
                }
            };
            let source = format!("file {}", file.display());
            let parsed = match kubeconfig::parse(&text, &source) {
                Ok(parsed) => parsed,
                Err(err) => {
                    tracing::warn!(error = %err, "skipping the file");
                    keep_prefixes.push(format!("{}{}", file.display(), self.options.separator));
                    continue;
                }
            };
            for context in kubeconfig::context_names(&parsed) {
                let name = ClusterName::from(format!(
                    "{}{}{context}",
                    file.display(),
                    self.options.separator
                ));
                if found.contains_key(&name) {
                    tracing::warn!(cluster = %name, "skipping a duplicate cluster name");
                    continue;
                }
                let fingerprint = kubeconfig::fingerprint(&format!("{context}\n{text}"));
                // Unchanged: no new client, so no credential plugin run.
                if self.clusters.fingerprint(&name).as_deref() == Some(fingerprint.as_str()) {
                    found.insert(name, None);
                    continue;
                }
                match kubeconfig::client(&parsed, Some(&context), &source, &Default::default())
                    .await
                {
                    Ok(client) => {
                        found.insert(name, Some((client, fingerprint)));
                    }
                    Err(err) if err.is_retryable() => {
                        tracing::warn!(error = %err, "skipping the context for now; trying again later");
                        complete = false;
                    }
                    Err(err) => tracing::warn!(error = %err, "skipping the context"),
                }
            }
        }
        self.clusters.retain(|name| {
            found.contains_key(name)
                || keep_prefixes
                    .iter()
                    .any(|prefix| name.as_str().starts_with(prefix.as_str()))
        });
        for (name, (client, fingerprint)) in found
            .into_iter()
            .filter_map(|(name, new)| Some((name, new?)))
        {
            if self.clusters.add_or_replace(
                name.clone(),
                Cluster::new(name.clone(), client),
                fingerprint,
            ) {
                tracing::info!(cluster = %name, "cluster engaged from its kubeconfig file");
            }
        }
        complete
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
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for FileProvider {
    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        self.clusters.start(shutdown.clone(), aware)?;
        let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<()>();
        // notify calls back on its own thread; a message is all we need.
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok() {
                    let _ = changed_tx.send(());
                }
            })
            .map_err(|err| Error::Other(format!("starting the file watcher: {err}")))?;
        for dir in self.watched_directories() {
            match watcher.watch(&dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => tracing::debug!(directory = %dir.display(), "watching"),
                Err(err) => {
                    tracing::warn!(directory = %dir.display(), error = %err, "cannot watch the directory; changes there are missed")
                }
            }
        }
        // One key: a sync that could not get some credentials is retried.
        let mut retries = Retries::new(self.options.retry);
        let mut complete = self.sync().await;
        loop {
            if complete {
                retries.forget(&());
            } else {
                retries.failed(());
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                event = changed.recv() => if event.is_none() { return Ok(()) },
                () = retries.next() => {}
            }
            // A write is often several events: take them all, then re-read once.
            while changed.try_recv().is_ok() {}
            complete = self.sync().await;
        }
    }
}
