//! Leader election with a warm standby: one replica works on the whole
//! fleet, the others stand by ready to take over.
//!
//! Every replica runs the provider and sees every cluster. The replica that
//! holds the Lease `<namespace>/<lease name>` engages its components (its
//! controllers reconcile); the others only [warm](multicluster_runtime::Aware::warm) each
//! cluster, which starts the informers their controllers read and keeps
//! them in sync. A takeover therefore costs one Lease write and a replay of
//! caches already in memory, not a cold list of the whole fleet.
//!
//! - **Standing by.** A replica tries to take the Lease every
//!   `retry_period`. It gets it once the holder has released it or let it
//!   lapse (`lease_duration` after its last renewal), so a leader that was
//!   killed is replaced within `lease_duration + retry_period`.
//! - **Leading.** The leader renews the Lease every `retry_period`. When no
//!   renewal has succeeded for `renew_deadline` (a failing or hung API
//!   server), all work stops at once, before the Lease can lapse for the
//!   others, and the replica stands by again with its caches still warm.
//!   Reconciles already running when leadership is lost are not waited for.
//! - **Stopping.** A leader that stops releases the Lease once its running
//!   reconciles have finished, so a standby takes over within one
//!   `retry_period`.
//!
//! The Lease carries the same fields client-go's leader election writes
//! (holder, duration, acquire and renew times, transitions), so
//! `kubectl get lease` shows the leader. Replicas need RBAC to get, list,
//! watch, create and update Leases in the namespace (a standby watches the
//! Lease so that it can take it the moment it is released).
//!
//! To share the work instead of keeping replicas idle, see
//! [`sharding`](crate::sharding).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::fence::{Attempt, Fence, Timing};
use crate::lease::live_holder;
use crate::lock;
use multicluster_runtime::Aware;
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::Error;
use multicluster_runtime::coordinator::work_until as child_until;
use multicluster_runtime::coordinator::{Coordinator, add_components, engage_each};
use multicluster_runtime::engagements::{Arrival, Engagements};

/// Leader election settings: [`LeaderElectionOptions::new`], then the
/// setters. The durations are client-go's defaults.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LeaderElectionOptions {
    /// The Lease's name: one per controller (replicas of one controller
    /// share it).
    pub lease_name: String,
    /// The Lease's namespace (default `kube-system`).
    pub namespace: String,
    /// This replica's identity in the Lease (default: the host name, which
    /// is the pod name in Kubernetes, plus a suffix unique to this process,
    /// so two processes on one host never both think they lead).
    pub identity: Option<String>,
    /// How long the Lease holds after its last renewal (default 15 s).
    pub lease_duration: Duration,
    /// How long the leader may fail to renew before it stops working
    /// (default 10 s). Below `lease_duration`.
    pub renew_deadline: Duration,
    /// How often the leader renews, and a standby tries to take the Lease
    /// (default 2 s). Below `renew_deadline`.
    pub retry_period: Duration,
}

multicluster_runtime::option_setters!(LeaderElectionOptions {
    namespace: impl Into<String>,
    identity: impl Into<Option<String>>,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
});

impl LeaderElectionOptions {
    /// The defaults, with the Lease named `lease_name`.
    pub fn new(lease_name: impl Into<String>) -> Self {
        Self {
            lease_name: lease_name.into(),
            namespace: "kube-system".to_string(),
            identity: None,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The defaults, with the Lease named after the running program: the
    /// file name of its path made a valid object name (lowercase, `a-z 0-9
    /// - .` only), `unknown` when nothing is left.
    pub fn for_program() -> Self {
        let program = std::env::args_os()
            .next()
            .and_then(|path| {
                std::path::Path::new(&path)
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
            })
            .unwrap_or_default();
        let mut name = crate::dns1123(&program);
        name.truncate(253);
        let name = name.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        Self::new(if name.is_empty() { "unknown" } else { name })
    }

    fn check(&self) -> Result<(), Error> {
        let invalid = |reason: String| {
            Err(Error::InvalidOptions {
                component: "leader election options".to_string(),
                reason,
            })
        };
        let name = &self.lease_name;
        if name.is_empty()
            || name.len() > 253
            || crate::dns1123(name) != *name
            || name.contains("..")
        {
            return invalid(format!(
                "lease_name {name:?} must be 1 to 253 characters of a-z, 0-9, '-' and '.', alphanumeric at both ends"
            ));
        }
        if self.namespace.is_empty() {
            return invalid("namespace is empty".to_string());
        }
        if self.identity.as_deref() == Some("") {
            return invalid("identity is empty".to_string());
        }
        if self.retry_period.is_zero()
            || self.retry_period >= self.renew_deadline
            || self.renew_deadline >= self.lease_duration
        {
            return invalid(format!(
                "need 0 < retry_period ({:?}) < renew_deadline ({:?}) < lease_duration ({:?})",
                self.retry_period, self.renew_deadline, self.lease_duration
            ));
        }
        Ok(())
    }

    fn timing(&self) -> Timing {
        Timing {
            duration: self.lease_duration,
            renew: self.retry_period,
            deadline: Some(self.renew_deadline),
        }
    }
}

/// A [`Coordinator`] under which one replica of a controller works on every
/// cluster and the others stand by with warm caches. See the [module
/// documentation](self).
#[derive(Clone)]
pub struct LeaderElection {
    inner: Arc<Inner>,
}

struct Inner {
    leases: Api<Lease>,
    options: LeaderElectionOptions,
    identity: String,
    clusters: std::sync::Mutex<Clusters>,
    leader: watch::Sender<Option<String>>,
}

#[derive(Default)]
struct Clusters {
    /// While this replica leads: the token that ends its work.
    leading: Option<CancellationToken>,
    entries: Engagements<Led>,
}

/// What this replica keeps for each cluster of the fleet.
struct Led {
    components: Vec<Arc<dyn Aware>>,
    /// Set while this replica leads.
    work: Option<CancellationToken>,
}

/// Engages the components under the leadership's `work`; a failure is
/// logged and the others carry on (there is no hand-back to retry).
fn engage_or_log(
    components: &[Arc<dyn Aware>],
    work: &CancellationToken,
    name: &ClusterName,
    cluster: &Cluster,
) {
    if let Err(err) = engage_each(components, work, name, cluster) {
        tracing::error!(cluster = %name, error = %err, "engaging a component failed");
    }
}

/// Completes when the watched Lease is released, lapses while watched (a
/// holder that stopped renewing is seen at the next retry instead) or is
/// deleted. Watch errors are retried with the stream's backoff.
async fn freed(changes: &mut BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>>) {
    while let Some(event) = changes.next().await {
        match event {
            Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))
                if live_holder(&lease, Timestamp::now()).is_none() =>
            {
                return;
            }
            Ok(watcher::Event::Delete(_)) => return,
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(error = %crate::watcher_error(&err), "watching the leader Lease failed; retrying");
            }
        }
    }
    std::future::pending::<()>().await;
}

fn default_identity() -> String {
    let host = gethostname::gethostname()
        .to_str()
        .map(str::to_string)
        .unwrap_or_default();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.subsec_nanos())
        .unwrap_or_default();
    format!("{host}_{}_{started:08x}", std::process::id())
}

impl LeaderElection {
    /// A coordinator keeping its Lease through `client` (the cluster the
    /// replicas share, usually the local one). Fails on invalid options.
    pub fn new(client: kube::Client, options: LeaderElectionOptions) -> Result<Self, Error> {
        options.check()?;
        let identity = options.identity.clone().unwrap_or_else(default_identity);
        Ok(Self {
            inner: Arc::new(Inner {
                leases: Api::namespaced(client, &options.namespace),
                identity,
                options,
                clusters: std::sync::Mutex::new(Clusters::default()),
                leader: watch::Sender::new(None),
            }),
        })
    }

    /// This replica's identity in the Lease.
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        lock(&self.inner.clusters)
            .leading
            .as_ref()
            .is_some_and(|leading| !leading.is_cancelled())
    }

    /// The leader as this replica last saw it (itself while it leads;
    /// `None` when nobody held the Lease or it could not be read).
    pub fn leader(&self) -> Option<String> {
        self.inner.leader.borrow().clone()
    }

    /// Follows the leader as this replica sees it.
    pub fn watch_leader(&self) -> watch::Receiver<Option<String>> {
        self.inner.leader.subscribe()
    }

    /// Takes the Lease, trying every `retry_period`, or `None` once `stop`
    /// fires. A call in flight is not abandoned at `stop` (it is bounded),
    /// so a Lease taken at that moment is released rather than left to
    /// lapse.
    async fn acquire(&self, stop: &CancellationToken, lost: Arc<Notify>) -> Option<Fence> {
        let options = &self.inner.options;
        let mut last_holder = None;
        // Watching the Lease lets a standby try as soon as it is released,
        // rather than at its next retry.
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", options.lease_name));
        let mut changes = watcher(self.inner.leases.clone(), config)
            .backoff(multicluster_runtime::cache::WatchBackoff::default().strategy())
            .boxed();
        loop {
            let attempt = Fence::take(
                &self.inner.leases,
                options.lease_name.clone(),
                &self.inner.identity,
                options.timing(),
                lost.clone(),
            )
            .await;
            match attempt {
                Attempt::Taken(fence) => return Some(fence),
                Attempt::Busy(holder) => {
                    if holder.is_some() && holder != last_holder {
                        tracing::info!(lease = %options.lease_name, leader = holder.as_deref().unwrap_or_default(), "standing by");
                    }
                    self.inner.leader.send_replace(holder.clone());
                    last_holder = holder;
                }
                Attempt::Failed(reason) => {
                    tracing::warn!(lease = %options.lease_name, %reason, "could not read or take the leader Lease; trying again");
                }
            }
            if stop.is_cancelled() {
                return None;
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = tokio::time::sleep(options.retry_period) => {}
                () = freed(&mut changes) => {}
            }
        }
    }

    /// Starts leading: engages every cluster known so far.
    fn lead(&self) -> CancellationToken {
        let leading = CancellationToken::new();
        let start: Vec<_> = {
            let mut clusters = lock(&self.inner.clusters);
            clusters.leading = Some(leading.clone());
            clusters
                .entries
                .iter_mut()
                .filter(|(_, entry)| entry.is_live())
                .map(|(name, entry)| {
                    let work = child_until(&entry.lifetime, &leading);
                    entry.data.work = Some(work.clone());
                    (
                        name.clone(),
                        entry.cluster.clone(),
                        entry.data.components.clone(),
                        work,
                    )
                })
                .collect()
        };
        self.inner
            .leader
            .send_replace(Some(self.inner.identity.clone()));
        tracing::info!(lease = %self.inner.options.lease_name, identity = %self.inner.identity, clusters = start.len(), "leading: working on every cluster");
        for (name, cluster, components, work) in start {
            engage_or_log(&components, &work, &name, &cluster);
        }
        leading
    }

    /// Stops all work at once.
    fn stand_down(&self) {
        let mut clusters = lock(&self.inner.clusters);
        if let Some(leading) = clusters.leading.take() {
            leading.cancel();
        }
        for (_, entry) in clusters.entries.iter_mut() {
            entry.data.work = None;
        }
        clusters.entries.prune();
    }
}

#[async_trait::async_trait]
impl Coordinator for LeaderElection {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
        components: &[Arc<dyn Aware>],
    ) -> Result<(), Error> {
        let (new, work) = {
            let mut clusters = lock(&self.inner.clusters);
            let leading = clusters.leading.clone();
            // Clusters that left are dropped here as well as when leadership
            // changes, so the map does not grow with churn.
            clusters.entries.prune();
            match clusters.entries.arrival(&name, &cluster, &lifetime) {
                Arrival::Stale => return Ok(()),
                Arrival::Again => {
                    // More components for a cluster already here.
                    let entry = clusters
                        .entries
                        .get_mut(&name)
                        .expect("an engagement seen again is held");
                    let led = &mut entry.data;
                    let new = add_components(&mut led.components, components);
                    (new, led.work.clone())
                }
                Arrival::New => {
                    // New, or a new instance under that name (whose old
                    // engagement ends here).
                    let led = Led {
                        components: components.to_vec(),
                        work: None,
                    };
                    let (entry, _) =
                        clusters
                            .entries
                            .insert(name.clone(), cluster.clone(), &lifetime, led);
                    let work = leading.map(|leading| child_until(&entry.lifetime, &leading));
                    entry.data.work = work.clone();
                    (components.to_vec(), work)
                }
            }
        };
        for component in &new {
            component.warm(&name, &cluster);
        }
        if let Some(work) = work.filter(|work| !work.is_cancelled()) {
            engage_or_log(&new, &work, &name, &cluster);
        }
        Ok(())
    }

    fn owns(&self, name: &ClusterName) -> bool {
        lock(&self.inner.clusters)
            .entries
            .live(name)
            .and_then(|entry| entry.data.work.as_ref())
            .is_some_and(|work| !work.is_cancelled())
    }

    fn working_on(&self) -> Option<Vec<ClusterName>> {
        let clusters = lock(&self.inner.clusters);
        Some(
            clusters
                .entries
                .iter()
                .filter(|(_, entry)| {
                    entry
                        .data
                        .work
                        .as_ref()
                        .is_some_and(|work| !work.is_cancelled())
                })
                .map(|(name, _)| name.clone())
                .collect(),
        )
    }

    async fn run(&self, stop: CancellationToken) -> Result<(), Error> {
        let options = &self.inner.options;
        tracing::info!(lease = %options.lease_name, namespace = %options.namespace, identity = %self.inner.identity, "leader election: standing by until the Lease is ours");
        loop {
            let lost = Arc::new(Notify::new());
            let Some(fence) = self.acquire(&stop, lost.clone()).await else {
                return Ok(());
            };
            if stop.is_cancelled() {
                fence
                    .release(
                        &self.inner.leases,
                        &self.inner.identity,
                        options.retry_period,
                        None,
                    )
                    .await;
                return Ok(());
            }
            let _leading = self.lead();
            tokio::select! {
                () = stop.cancelled() => {
                    // The manager stops the coordinator once running
                    // reconciles have finished: hand over at once.
                    self.stand_down();
                    fence.release(&self.inner.leases, &self.inner.identity, options.renew_deadline, None).await;
                    self.inner.leader.send_replace(None);
                    tracing::info!(lease = %options.lease_name, "stopped leading; the Lease is released");
                    return Ok(());
                }
                () = fence.lost().cancelled() => {
                    self.stand_down();
                    self.inner.leader.send_replace(None);
                    tracing::warn!(lease = %options.lease_name, "lost the leader Lease: stopped all work; standing by");
                }
            }
        }
    }
}

impl std::fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElection")
            .field("identity", &self.inner.identity)
            .field("lease", &self.inner.options.lease_name)
            .field("leading", &self.is_leader())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_client_gos_and_valid() {
        let options = LeaderElectionOptions::new("my-controller");
        assert!(options.check().is_ok());
        assert_eq!(options.lease_duration, Duration::from_secs(15));
        assert_eq!(options.renew_deadline, Duration::from_secs(10));
        assert_eq!(options.retry_period, Duration::from_secs(2));
    }

    #[test]
    fn a_lease_named_for_the_program_is_valid() {
        // The test binary is `multicluster_coordinator-<hash>`: an
        // underscore no object name may hold.
        let options = LeaderElectionOptions::for_program();
        assert!(options.check().is_ok(), "{:?}", options.lease_name);
        assert!(
            options.lease_name.starts_with("multicluster-coordinator-"),
            "{:?}",
            options.lease_name
        );
    }

    #[test]
    fn invalid_options_are_named() {
        type Spoil = fn(&mut LeaderElectionOptions);
        let cases: [(Spoil, &str); 5] = [
            (
                |o| o.lease_name = "Leader!".into(),
                "lease_name \"Leader!\"",
            ),
            (|o| o.lease_name = String::new(), "lease_name \"\""),
            (|o| o.namespace = String::new(), "namespace is empty"),
            (|o| o.identity = Some(String::new()), "identity is empty"),
            (
                |o| o.renew_deadline = o.lease_duration,
                "need 0 < retry_period (2s) < renew_deadline (15s) < lease_duration (15s)",
            ),
        ];
        for (spoil, message) in cases {
            let mut options = LeaderElectionOptions::new("my-controller");
            spoil(&mut options);
            let err = options.check().expect_err(message).to_string();
            assert!(err.starts_with("leader election options: "), "{err}");
            assert!(err.contains(message), "{err} does not contain {message}");
        }
    }

    #[test]
    fn default_identities_differ_between_processes_on_one_host() {
        let identity = default_identity();
        let pid = std::process::id().to_string();
        assert!(identity.contains(&format!("_{pid}_")), "{identity}");
    }
}
