//! Reading the source files into what each cluster should be.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use multicluster_runtime::ClusterName;
use multicluster_runtime::client::kubeconfig::Contexts;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;

use multicluster_runtime::provider::lock;

use crate::{FileContext, Shared};

/// What the files ask of one cluster.
#[derive(Clone, Debug)]
pub(crate) enum Desired {
    /// Its context, resolved: engage it.
    Context(Box<KubeconfigCluster>),
    /// Its file or context cannot be used right now (unreadable, not
    /// parsable, naming a user or cluster it lacks): keep what is engaged.
    Broken,
}

impl PartialEq for Desired {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Context(one), Self::Context(other)) => {
                one.name == other.name && one.fingerprint() == other.fingerprint()
            }
            (Self::Broken, Self::Broken) => true,
            _ => false,
        }
    }
}

/// Reads every source file and works out what each cluster should be.
/// Problems are recorded in the provider's failures (logged once per
/// reason).
pub(crate) fn scan(shared: &Shared) -> BTreeMap<ClusterName, Desired> {
    let separator = &shared.options.separator;
    let before: Vec<ClusterName> = lock(&shared.desired).keys().cloned().collect();
    let mut found = BTreeMap::new();
    for file in files(shared) {
        let file_key = ClusterName::from(format!("file {}", file.display()));
        let prefix = format!("{}{separator}", file.display());
        // What this file gave before, kept while it cannot be read.
        let keep_all = |found: &mut BTreeMap<ClusterName, Desired>| {
            for name in before
                .iter()
                .filter(|name| name.as_str().starts_with(&prefix))
            {
                found.insert(name.clone(), Desired::Broken);
            }
        };
        let parsed = match read(shared, &file, &file_key) {
            Read::Parsed(parsed) => *parsed,
            Read::Gone => continue,
            Read::Failed => {
                keep_all(&mut found);
                continue;
            }
        };
        add_contexts(shared, &file, &prefix, &parsed, &mut found);
    }
    // Failures of contexts that are gone are no longer news.
    for name in before.iter().filter(|name| !found.contains_key(*name)) {
        shared.fleet.failures().clear(name);
    }
    found
}

/// What reading one source file gave.
enum Read {
    /// Its contexts.
    Parsed(Box<Contexts>),
    /// It is gone: its clusters go with it.
    Gone,
    /// It cannot be read or parsed (recorded): what it gave before is kept.
    Failed,
}

/// Reads and parses `file`, recording why it cannot be under `file_key`.
fn read(shared: &Shared, file: &Path, file_key: &ClusterName) -> Read {
    // A pipe or a device would block the read forever (and a directory
    // cannot be read): only regular files are opened. `metadata` follows
    // symlinks, so a link to a regular file is read.
    if let Ok(meta) = std::fs::metadata(file)
        && !meta.is_file()
    {
        shared.fleet.failures().record(
            file_key,
            format!(
                "file {} is not a regular file (a directory, pipe or device); only regular files are read",
                file.display()
            ),
            "not-a-file",
        );
        return Read::Failed;
    }
    shared.reads.fetch_add(1, Ordering::Relaxed);
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            shared.fleet.failures().clear(file_key);
            return Read::Gone;
        }
        Err(err) => {
            shared.fleet.failures().record(
                file_key,
                format!("file {} cannot be read: {err}", file.display()),
                "unreadable-file",
            );
            return Read::Failed;
        }
    };
    match Contexts::parse(&text, format!("file {}", file.display())) {
        Ok(parsed) => {
            shared.fleet.failures().clear(file_key);
            Read::Parsed(Box::new(parsed))
        }
        Err(err) => {
            shared
                .fleet
                .failures()
                .record(file_key, err.to_string(), "invalid-kubeconfig");
            Read::Failed
        }
    }
}

/// Adds a cluster to `found` for each context of `file` (named
/// `<prefix><context>`), or records why a context is unusable.
fn add_contexts(
    shared: &Shared,
    file: &Path,
    prefix: &str,
    parsed: &Contexts,
    found: &mut BTreeMap<ClusterName, Desired>,
) {
    for context in parsed.names() {
        let name = ClusterName::from(format!("{prefix}{context}"));
        if found.contains_key(&name) {
            tracing::warn!(cluster = %name, "skipping a duplicate cluster name");
            continue;
        }
        let source = format!("file {} context {context:?}", file.display());
        match parsed.text(context) {
            Ok(text) => {
                found.insert(
                    name.clone(),
                    Desired::Context(Box::new(KubeconfigCluster {
                        inventory: Default::default(),
                        name,
                        text,
                        source,
                        policy: shared.options.kubeconfig_policy.clone(),
                        stable_id: None,
                        member: shared.options.members.for_member(&FileContext {
                            file: file.to_path_buf(),
                            context: context.to_string(),
                        }),
                    })),
                );
            }
            Err(err) => {
                shared
                    .fleet
                    .failures()
                    .record(&name, err.to_string(), "invalid-kubeconfig");
                found.insert(name, Desired::Broken);
            }
        }
    }
}

/// The files to read now: explicit files plus directory matches.
fn files(shared: &Shared) -> Vec<PathBuf> {
    let options = &shared.options;
    let mut files = options.files.clone();
    for dir in &options.directories {
        for pattern in &options.patterns {
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
