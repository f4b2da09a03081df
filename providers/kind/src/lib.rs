//! Local kind clusters as a fleet (Go: `providers/kind`).
//!
//! The provider runs the `kind` CLI: `kind get clusters` to list clusters and
//! `kind get kubeconfig --name <name>` for each one's kubeconfig. It polls
//! (every 2 s by default; the first poll at once), engages new clusters,
//! replaces a cluster whose kubeconfig changed (it was recreated), and
//! removes clusters no longer listed. The cluster name is the kind name; an
//! optional prefix selects clusters without being stripped.
//!
//! Every CLI call has a deadline ([`KindOptions::command_timeout`]) and is
//! stopped, with whatever it started, when it passes or the provider stops.
//! Each cluster's kubeconfig is fetched and built on its own (on a
//! [`WorkQueue`]), so a cluster whose call hangs holds up neither the others
//! nor the next poll.
//!
//! A failing first listing fails [`RunnableProvider::start`] (with the reason
//! — e.g. `kind` not installed); later failures are logged and polling goes
//! on. A cluster whose kubeconfig cannot be read or used is logged and
//! skipped; the others are unaffected.

use multicluster_runtime::provider::lock;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::controller::{Action, Request, WorkQueue};
use multicluster_runtime::process::{self, ProcessError};
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::provider::discovery::Discovered;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::Members;
use multicluster_runtime::{
    ClusterName, Error, InventoryEngaged, ProviderContext, RunnableProvider,
};

/// Options of the kind provider.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct KindOptions {
    /// This instance's name (default `kind`): the label `provider` of
    /// its metrics, and its controller's name with `-provider` appended
    /// (logs and spans carry it). Give instances in one process (two in a
    /// multi provider, say) different names, so their figures stay apart.
    pub name: String,
    /// Only clusters whose name starts with this prefix (kept in the name).
    pub prefix: Option<String>,
    /// Time between polls (default 2 s).
    pub poll_interval: Duration,
    /// The `kind` executable (default `kind`, found on `PATH`).
    pub kind_command: PathBuf,
    /// How long one `kind` call may take before it is stopped and counts as
    /// failed (default 30 s).
    pub command_timeout: Duration,
    /// Variables each `kind` call gets besides the process's own (default
    /// none), e.g. `KIND_EXPERIMENTAL_PROVIDER=podman` for clusters kind
    /// made with podman, or `DOCKER_HOST`.
    pub kind_env: Vec<(String, String)>,
    /// How each member's clients and cache are built: the same for every
    /// member, or adjusted per member from its kind cluster name
    /// ([`Members::per_member`]). A `ClientOptions`, `CacheOptions` or
    /// `MemberOptions` converts into it.
    pub members: Members<ClusterName>,
    /// What the kubeconfigs `kind get kubeconfig` prints may use (default
    /// [`KubeconfigPolicy::trusted`]: the kind CLI is the operator's).
    pub kubeconfig_policy: KubeconfigPolicy,
}

multicluster_runtime::option_setters!(KindOptions {
    name: impl Into<String>,
    prefix: impl Into<Option<String>>,
    poll_interval: Duration,
    kind_command: impl Into<PathBuf>,
    command_timeout: Duration,
    kind_env: Vec<(String, String)>,
    members: impl Into<Members<ClusterName>>,
    kubeconfig_policy: KubeconfigPolicy,
});

impl Default for KindOptions {
    fn default() -> Self {
        Self {
            name: "kind".to_string(),
            prefix: None,
            poll_interval: Duration::from_secs(2),
            kind_command: PathBuf::from("kind"),
            command_timeout: Duration::from_secs(30),
            kind_env: Vec::new(),
            members: Members::default(),
            kubeconfig_policy: KubeconfigPolicy::trusted(),
        }
    }
}

/// kind clusters found through the `kind` CLI.
#[derive(Debug)]
pub struct KindProvider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: KindOptions,
    fleet: Discovered,
    /// The names the last listing gave.
    listed: Mutex<BTreeSet<String>>,
    /// One key per listed (or no longer listed) cluster.
    refreshes: WorkQueue,
}

impl KindProvider {
    /// A provider with `options`.
    pub fn new(options: KindOptions) -> Self {
        let refreshes = WorkQueue::builder(format!("{}-provider", options.name))
            .max_concurrent(Discovered::DEFAULT_MAX_CONCURRENT_BUILDS)
            .backoff(Discovered::DEFAULT_BACKOFF)
            .build();
        Self {
            shared: Arc::new(Shared {
                fleet: Discovered::new(options.name.as_str(), None),
                options,
                listed: Mutex::default(),
                refreshes,
            }),
        }
    }
}

impl Shared {
    /// Runs `kind` with `args`; its stdout on success.
    async fn kind(&self, args: &[&str]) -> Result<String, Error> {
        let program = &self.options.kind_command;
        let shown = format!("{} {}", program.display(), args.join(" "));
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(self.options.kind_env.iter().cloned());
        let output = process::output(command, self.options.command_timeout)
            .await
            .map_err(|err| match err {
                ProcessError::Start(io) if io.kind() == std::io::ErrorKind::NotFound => {
                    Error::Command {
                        command: shown.clone(),
                        reason: "could not run: the kind CLI was not found; install kind or set its path in KindOptions::kind_command".to_string(),
                        source: Some(ProcessError::Start(io)),
                    }
                }
                other => Error::Command {
                    command: shown.clone(),
                    reason: other.to_string(),
                    source: Some(other),
                },
            })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(Error::Command {
                command: shown,
                reason: format!("failed ({}): {}", output.status, stderr.trim()),
                source: None,
            });
        }
        String::from_utf8(output.stdout).map_err(|_| Error::Command {
            command: shown,
            reason: "printed something that is not UTF-8".to_string(),
            source: None,
        })
    }

    /// One poll: list, then queue a refresh of every listed cluster and of
    /// every cluster no longer listed.
    async fn poll(&self) -> Result<(), Error> {
        let listed = self.kind(&["get", "clusters"]).await?;
        let names: BTreeSet<String> = listed
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
        let gone: Vec<String> = {
            let mut before = lock(&self.listed);
            let gone = before.difference(&names).cloned().collect();
            *before = names.clone();
            gone
        };
        for name in names.into_iter().chain(gone) {
            self.refreshes.enqueue(Request::new(name, None, ""));
        }
        Ok(())
    }

    /// Brings one cluster in line with kind.
    async fn refresh(&self, name: ClusterName) -> Result<Action, Error> {
        let listed = lock(&self.listed).contains(name.as_str());
        if !listed {
            self.fleet.remove(&name, "kind no longer lists it");
            return Ok(Action::await_change());
        }
        let text = self
            .kind(&["get", "kubeconfig", "--name", name.as_str()])
            .await?;
        let wanted = KubeconfigCluster {
            inventory: Default::default(),
            source: format!("`kind get kubeconfig --name {name}`"),
            policy: self.options.kubeconfig_policy.clone(),
            member: self.options.members.for_member(&name),
            name,
            text,
            stable_id: None,
        };
        // Nothing else changes what a name asks for while it is fetched.
        let now = Some(wanted.clone());
        self.fleet.engage(wanted, || now).await
    }
}

impl ClusterSetProvider for KindProvider {
    fn cluster_set(&self) -> &Clusters {
        self.shared.fleet.clusters()
    }
}

#[async_trait::async_trait]
impl RunnableProvider for KindProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        let shared = &self.shared;
        shared.fleet.start(&context)?;
        let shutdown = context.shutdown.clone();
        tokio::select! {
            () = shutdown.cancelled() => return Ok(context.stopped_before_engaged()),
            first = shared.poll() => first?,
        }
        // The first list queued every cluster: once each was tried, the
        // inventory is engaged.
        let first_pass = async {
            shared.refreshes.idle().await;
            context.inventory_engaged()
        };
        let refresher = shared.clone();
        // Calls still running at shutdown are stopped at once.
        let refreshes = shared
            .refreshes
            .run(shutdown.clone(), Duration::ZERO, move |key| {
                let shared = refresher.clone();
                async move { shared.refresh(key.cluster).await }
            });
        let polls = async {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(shared.options.poll_interval) => {}
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    polled = shared.poll() => if let Err(err) = polled {
                        tracing::warn!(error = %err, "listing kind clusters failed; trying again at the next poll");
                    },
                }
            }
        };
        let ((), (), engaged) = tokio::join!(refreshes, polls, first_pass);
        Ok(engaged)
    }
}
