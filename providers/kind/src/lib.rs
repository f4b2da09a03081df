//! Local kind clusters as a fleet (Go: `providers/kind`).
//!
//! The provider runs the `kind` CLI: `kind get clusters` to list clusters and
//! `kind get kubeconfig --name <name>` for each one's kubeconfig. It polls
//! (every 2 s by default; the first poll at once), engages new clusters,
//! replaces a cluster whose kubeconfig changed (it was recreated), and
//! removes clusters no longer listed. The cluster name is the kind name; an
//! optional prefix selects clusters without being stripped.
//!
//! A failing first listing fails [`RunnableProvider::start`] (with the reason
//! — e.g. `kind` not installed); later failures are logged and polling goes
//! on. A cluster whose kubeconfig cannot be read or used is logged and
//! skipped; the others are unaffected.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use multicluster_runtime::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::{Aware, ClusterName, Error, RunnableProvider};
use tokio_util::sync::CancellationToken;

/// Options of the kind provider.
#[derive(Clone, Debug)]
pub struct KindOptions {
    /// Only clusters whose name starts with this prefix (kept in the name).
    pub prefix: Option<String>,
    /// Time between polls (default 2 s).
    pub poll_interval: Duration,
    /// The `kind` executable (default `kind`, found on `PATH`).
    pub kind_command: PathBuf,
}

impl Default for KindOptions {
    fn default() -> Self {
        Self {
            prefix: None,
            poll_interval: Duration::from_secs(2),
            kind_command: PathBuf::from("kind"),
        }
    }
}

/// kind clusters found through the `kind` CLI.
#[derive(Debug)]
pub struct KindProvider {
    options: KindOptions,
    clusters: Clusters,
}

impl KindProvider {
    /// A provider with `options`.
    pub fn new(options: KindOptions) -> Self {
        Self {
            options,
            clusters: Clusters::new(),
        }
    }

    /// Names of the engaged clusters, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.clusters.names()
    }

    /// Runs `kind` with `args` off the async threads; stdout on success.
    async fn kind(&self, args: Vec<String>) -> Result<String, Error> {
        let program = self.options.kind_command.clone();
        let shown = format!("{} {}", program.display(), args.join(" "));
        let output = tokio::task::spawn_blocking(move || {
            duct::cmd(program, args)
                .stdout_capture()
                .stderr_capture()
                .unchecked()
                .run()
        })
        .await
        .map_err(|err| Error::Other(format!("running `{shown}`: {err}")))?
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => Error::Other(format!(
                "running `{shown}`: the kind CLI was not found; install kind or set its path in KindOptions::kind_command"
            )),
            _ => Error::Other(format!("running `{shown}`: {err}")),
        })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(Error::Other(format!(
                "`{shown}` failed ({}): {}",
                output.status,
                stderr.trim()
            )));
        }
        String::from_utf8(output.stdout)
            .map_err(|_| Error::Other(format!("`{shown}` printed something that is not UTF-8")))
    }

    /// One poll: list, then add, replace and remove clusters.
    async fn sync(&self) -> Result<(), Error> {
        let listed = self.kind(vec!["get".into(), "clusters".into()]).await?;
        let names: Vec<String> = listed
            .lines()
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .filter(|name| {
                self.options
                    .prefix
                    .as_deref()
                    .is_none_or(|prefix| name.starts_with(prefix))
            })
            .map(str::to_string)
            .collect();
        for name in &names {
            if let Err(err) = self.refresh(name).await {
                tracing::warn!(cluster = %name, error = %err, "skipping kind cluster");
            }
        }
        self.clusters.retain(|name| {
            let keep = names.iter().any(|listed| listed == name.as_str());
            if !keep {
                tracing::info!(cluster = %name, "kind cluster is gone");
            }
            keep
        });
        Ok(())
    }

    async fn refresh(&self, name: &str) -> Result<(), Error> {
        let text = self
            .kind(vec![
                "get".into(),
                "kubeconfig".into(),
                "--name".into(),
                name.to_string(),
            ])
            .await?;
        let source = format!("`kind get kubeconfig --name {name}`");
        if self
            .clusters
            .add_or_replace_from_kubeconfig(name, &text, &source, &Default::default())
            .await?
        {
            tracing::info!(cluster = %name, "kind cluster engaged");
        }
        Ok(())
    }
}

impl ClusterSetProvider for KindProvider {
    fn cluster_set(&self) -> &Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for KindProvider {
    async fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        self.clusters.start(shutdown.clone(), aware)?;
        self.sync().await?;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.options.poll_interval) => {}
            }
            if let Err(err) = self.sync().await {
                tracing::warn!(error = %err, "listing kind clusters failed; trying again at the next poll");
            }
        }
    }
}
