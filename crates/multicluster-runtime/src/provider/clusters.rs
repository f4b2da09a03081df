//! The set of clusters a provider keeps (Go: `pkg/clusters.Clusters[T]`).
//!
//! Providers add and remove clusters as their inventory changes; the set
//! gives each cluster a lifetime, applies every stored field index to it
//! (also to clusters added later), and engages it with the manager once the
//! provider has started. Safe to use from many tasks at once.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::cache::FieldIndex;
use crate::engagements::Engagements;
use crate::{Aware, Cluster, ClusterName, Error, Provider};

/// Called with errors that have no caller to return to (an engagement that
/// failed while the provider was adding clusters in the background).
pub type ErrorHandler = Arc<dyn Fn(&ClusterName, &Error) + Send + Sync>;

/// A provider's clusters, by name.
#[derive(Clone)]
pub struct Clusters {
    inner: Arc<Mutex<State>>,
    on_error: ErrorHandler,
}

#[derive(Default)]
struct State {
    /// Each cluster with what the provider built it from (e.g. a
    /// kubeconfig hash), so add-or-replace keeps an unchanged one.
    entries: Engagements<Option<String>>,
    indexes: Vec<FieldIndex>,
    started: Option<(CancellationToken, Arc<dyn Aware>)>,
    /// The parent of lifetimes given before the set is started, which
    /// nothing ends: `start` gives each cluster one under the shutdown.
    unstarted: CancellationToken,
}

impl Default for Clusters {
    fn default() -> Self {
        Self::new()
    }
}

impl Clusters {
    /// An empty set whose background errors are logged.
    pub fn new() -> Self {
        Self::with_error_handler(Arc::new(|name, err| {
            tracing::error!(cluster = %name, error = %err, "cluster engagement failed");
        }))
    }

    /// An empty set that reports background errors to `on_error`.
    pub fn with_error_handler(on_error: ErrorHandler) -> Self {
        Self {
            inner: Arc::new(Mutex::new(State::default())),
            on_error,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.inner)
    }

    /// Engages every cluster added so far and every one added later through
    /// `aware`, with lifetimes that end at the latest with `shutdown`.
    ///
    /// `aware` is called after the set's lock is released, so it may look
    /// clusters up (or change the set) from `engage`. Calls for one name can
    /// then arrive out of order; the one whose lifetime has already ended is
    /// the stale one, and [`Aware`] implementations ignore it.
    pub fn start(&self, shutdown: CancellationToken, aware: Arc<dyn Aware>) -> Result<(), Error> {
        let engagements: Vec<_> = {
            let mut state = self.lock();
            if state.started.is_some() {
                return Err(Error::AlreadyStarted("cluster set"));
            }
            state.started = Some((shutdown.clone(), aware.clone()));
            let held: Vec<_> = state
                .entries
                .iter()
                .map(|(name, entry)| (name.clone(), entry.cluster.clone(), entry.data.clone()))
                .collect();
            held.into_iter()
                .map(|(name, cluster, fingerprint)| {
                    let (entry, _) =
                        state
                            .entries
                            .insert(name.clone(), cluster.clone(), &shutdown, fingerprint);
                    (entry.lifetime.clone(), name, cluster)
                })
                .collect()
        };
        for (lifetime, name, cluster) in engagements {
            self.engage(&aware, lifetime, &name, &cluster);
        }
        Ok(())
    }

    /// Adds a cluster; a name that exists is an error.
    pub fn add(&self, name: impl Into<ClusterName>, cluster: Cluster) -> Result<(), Error> {
        self.insert(name.into(), cluster, None, false)
    }

    /// Adds a cluster, replacing one of the same name unless its fingerprint
    /// is equal (same connection config), in which case nothing happens.
    /// Returns whether the set changed.
    pub fn add_or_replace(
        &self,
        name: impl Into<ClusterName>,
        cluster: Cluster,
        fingerprint: impl Into<String>,
    ) -> bool {
        let name = name.into();
        let fingerprint = fingerprint.into();
        {
            let state = self.lock();
            if state
                .entries
                .get(&name)
                .is_some_and(|entry| entry.data.as_deref() == Some(fingerprint.as_str()))
            {
                return false;
            }
        }
        self.insert(name, cluster, Some(fingerprint), true).is_ok()
    }

    /// Adds or replaces `name` with a cluster built from kubeconfig `text`
    /// (its current context) with `options`, unless the text is unchanged
    /// since the last call. `source` names where the text came from, for
    /// errors (which never quote it). Returns whether the set changed.
    pub async fn add_or_replace_from_kubeconfig(
        &self,
        name: impl Into<ClusterName>,
        text: &str,
        source: &str,
        options: &crate::provider::kubeconfig::ClientOptions,
    ) -> Result<bool, Error> {
        let wanted = KubeconfigCluster {
            name: name.into(),
            text: text.to_string(),
            source: source.to_string(),
            stable_id: None,
        };
        if self.is_current(&wanted) {
            return Ok(false);
        }
        let cluster = wanted.build(options).await?;
        Ok(self.add_or_replace(wanted.name.clone(), cluster, wanted.fingerprint()))
    }

    /// Whether `wanted` is what the set already holds under its name (same
    /// kubeconfig text and stable ID): building it again would change
    /// nothing.
    pub fn is_current(&self, wanted: &KubeconfigCluster) -> bool {
        self.fingerprint(&wanted.name).as_deref() == Some(wanted.fingerprint().as_str())
    }

    fn insert(
        &self,
        name: ClusterName,
        cluster: Cluster,
        fingerprint: Option<String>,
        replace: bool,
    ) -> Result<(), Error> {
        let mut state = self.lock();
        if !replace && state.entries.get(&name).is_some() {
            return Err(Error::ClusterExists(name));
        }
        for index in &state.indexes {
            cluster.cache().index_field(index);
        }
        let (parent, aware) = match &state.started {
            Some((shutdown, aware)) => (shutdown.clone(), Some(aware.clone())),
            None => (state.unstarted.clone(), None),
        };
        // A cluster it replaces has its lifetime ended here.
        let (entry, _) = state
            .entries
            .insert(name.clone(), cluster.clone(), &parent, fingerprint);
        let lifetime = entry.lifetime.clone();
        // Foreign code runs without the lock: see `start`.
        drop(state);
        if let Some(aware) = aware {
            self.engage(&aware, lifetime, &name, &cluster);
        }
        Ok(())
    }

    fn engage(
        &self,
        aware: &Arc<dyn Aware>,
        lifetime: CancellationToken,
        name: &ClusterName,
        cluster: &Cluster,
    ) {
        if let Err(err) = aware.engage(lifetime, name.clone(), cluster.clone()) {
            (self.on_error)(name, &err);
        }
    }

    /// Removes a cluster and ends its lifetime; returns whether it was there.
    pub fn remove(&self, name: &ClusterName) -> bool {
        self.lock().entries.remove(name).is_some()
    }

    /// Removes every cluster for which `keep` is false.
    pub fn retain(&self, mut keep: impl FnMut(&ClusterName) -> bool) {
        self.lock().entries.retain(|name, _| keep(name));
    }

    /// The cluster of that name, or [`Error::ClusterNotFound`].
    pub fn get(&self, name: &ClusterName) -> Result<Cluster, Error> {
        self.lock()
            .entries
            .get(name)
            .map(|entry| entry.cluster.clone())
            .ok_or_else(|| Error::ClusterNotFound(name.clone()))
    }

    /// The fingerprint a cluster was added with.
    pub fn fingerprint(&self, name: &ClusterName) -> Option<String> {
        self.lock()
            .entries
            .get(name)
            .and_then(|entry| entry.data.clone())
    }

    /// Names of all clusters, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.lock().entries.names()
    }

    /// Stores an index and applies it to every cluster, present and future.
    pub fn index_field(&self, index: FieldIndex) {
        let mut state = self.lock();
        for entry in state.entries.values() {
            entry.cluster.cache().index_field(&index);
        }
        state.indexes.push(index);
    }
}

impl std::fmt::Debug for Clusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clusters")
            .field("names", &self.names())
            .finish()
    }
}

/// A cluster to build from kubeconfig text: what a provider found, before
/// the (possibly slow) client is built. Building runs exec credential
/// plugins; providers can build several at once and hand the results to
/// [`Clusters::add_or_replace`] with [`KubeconfigCluster::fingerprint`].
#[derive(Clone, PartialEq, Eq)]
pub struct KubeconfigCluster {
    /// The cluster's name in the fleet.
    pub name: ClusterName,
    /// The kubeconfig; its current context is used.
    pub text: String,
    /// Where the text came from, for errors (which never quote it).
    pub source: String,
    /// The cluster's stable ID, if known ([`Cluster::stable_id`]).
    pub stable_id: Option<String>,
}

impl std::fmt::Debug for KubeconfigCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeconfigCluster")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("stable_id", &self.stable_id)
            .finish_non_exhaustive()
    }
}

impl KubeconfigCluster {
    /// A digest of the text and stable ID: equal exactly when building
    /// again would give the same cluster.
    pub fn fingerprint(&self) -> String {
        crate::provider::kubeconfig::fingerprint(&format!(
            "{}\n{}",
            self.stable_id.as_deref().unwrap_or_default(),
            self.text
        ))
    }

    /// Parses the text and builds the cluster's client with `options`
    /// (running its credential plugin once, if it has one: see
    /// [`crate::provider::kubeconfig::client`]).
    pub async fn build(
        &self,
        options: &crate::provider::kubeconfig::ClientOptions,
    ) -> Result<Cluster, Error> {
        let parsed = crate::provider::kubeconfig::parse(&self.text, &self.source)?;
        let (client, requests) =
            crate::provider::kubeconfig::client_with_requests(&parsed, None, &self.source, options)
                .await?;
        let cluster = Cluster::new(self.name.clone(), client).watching_requests(requests);
        Ok(match &self.stable_id {
            Some(id) => cluster.with_stable_id(id),
            None => cluster,
        })
    }
}

/// A provider that keeps its clusters in a [`Clusters`] set. Implementing
/// this gives it [`Provider`]: lookups and field indexes are served by the
/// set, so indexes registered before a cluster arrives reach it too.
pub trait ClusterSetProvider: Send + Sync {
    /// The set the provider keeps its clusters in.
    fn cluster_set(&self) -> &Clusters;
}

#[async_trait::async_trait]
impl<T: ClusterSetProvider> Provider for T {
    async fn get(&self, name: &ClusterName) -> Result<Cluster, Error> {
        self.cluster_set().get(name)
    }

    async fn index_field(&self, index: FieldIndex) -> Result<(), Error> {
        self.cluster_set().index_field(index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Records every engagement's lifetime per cluster name.
    #[derive(Default)]
    struct Recording(Mutex<HashMap<ClusterName, Vec<CancellationToken>>>);

    impl Aware for Recording {
        fn engage(
            &self,
            lifetime: CancellationToken,
            name: ClusterName,
            _cluster: Cluster,
        ) -> Result<(), Error> {
            self.0
                .lock()
                .expect("lock")
                .entry(name)
                .or_default()
                .push(lifetime);
            Ok(())
        }
    }

    fn cluster(name: &str) -> Cluster {
        crate::testing::offline_cluster(name)
    }

    /// Looks the cluster up in the set from `engage`, as a component that
    /// wants the provider's view of it would.
    struct LooksUp(Clusters, Mutex<Vec<ClusterName>>);

    impl Aware for LooksUp {
        fn engage(&self, _: CancellationToken, name: ClusterName, _: Cluster) -> Result<(), Error> {
            let found = self.0.get(&name)?;
            self.1.lock().expect("lock").push(found.name().clone());
            Ok(())
        }
    }

    #[tokio::test]
    async fn an_aware_may_call_back_into_the_set_from_engage() {
        let set = Clusters::new();
        set.add("before", cluster("before")).expect("add");
        let aware = Arc::new(LooksUp(set.clone(), Mutex::default()));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Handle::current();
        // On a thread of its own, so a deadlock shows as a timeout.
        std::thread::spawn({
            let (set, aware) = (set.clone(), aware.clone());
            move || {
                let _entered = runtime.enter();
                set.start(CancellationToken::new(), aware).expect("start");
                set.add("after", cluster("after")).expect("add");
                set.add_or_replace("after", cluster("after"), "v2");
                let _ = done_tx.send(());
            }
        });
        done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("no deadlock");
        assert_eq!(
            *aware.1.lock().expect("lock"),
            ["before", "after", "after"].map(ClusterName::from)
        );
    }

    #[tokio::test]
    async fn names_are_sorted_and_unknown_names_are_not_found() {
        let set = Clusters::new();
        set.add("b", cluster("b")).expect("add");
        set.add("a", cluster("a")).expect("add");
        assert!(matches!(
            set.add("a", cluster("a")),
            Err(Error::ClusterExists(_))
        ));
        assert_eq!(
            set.names(),
            [ClusterName::from("a"), ClusterName::from("b")]
        );
        assert!(matches!(
            set.get(&"zzz".into()),
            Err(Error::ClusterNotFound(_))
        ));
        let kept = cluster("c");
        assert!(set.add_or_replace("c", kept.clone(), "v1"));
        assert!(
            !set.add_or_replace("c", cluster("c"), "v1"),
            "equal config is a no-op"
        );
        assert!(set.get(&"c".into()).expect("c").same_instance(&kept));
        assert!(set.add_or_replace("c", cluster("c"), "v2"));
        assert!(!set.get(&"c".into()).expect("c").same_instance(&kept));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_use_keeps_exactly_one_live_engagement_per_present_cluster() {
        let set = Clusters::new();
        let aware = Arc::new(Recording::default());
        let shutdown = CancellationToken::new();
        set.start(shutdown.clone(), aware.clone()).expect("start");
        assert!(matches!(
            set.start(shutdown.clone(), aware.clone()),
            Err(Error::AlreadyStarted(_))
        ));

        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..16u32 {
            let set = set.clone();
            tasks.spawn(async move {
                for step in 0..200u32 {
                    let name = format!("c{}", (worker * 7 + step) % 10);
                    match step % 5 {
                        0 => {
                            let _ = set.add(name.as_str(), cluster(&name));
                        }
                        1 => {
                            set.add_or_replace(
                                name.as_str(),
                                cluster(&name),
                                format!("v{}", step % 3),
                            );
                        }
                        2 => {
                            set.remove(&ClusterName::from(name));
                        }
                        3 => set.index_field(crate::cache::FieldIndex::new::<
                            k8s_openapi::api::core::v1::ConfigMap,
                        >(
                            format!("f{worker}"), |_| Vec::new()
                        )),
                        _ => {
                            let _ = set.get(&ClusterName::from(name));
                        }
                    }
                    tokio::task::yield_now().await;
                }
            });
        }
        while let Some(result) = tasks.join_next().await {
            result.expect("no task panicked");
        }

        let names = set.names();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted);
        let engagements = aware.0.lock().expect("lock");
        for (name, lifetimes) in engagements.iter() {
            let live = lifetimes
                .iter()
                .filter(|lifetime| !lifetime.is_cancelled())
                .count();
            let present = names.contains(name);
            assert_eq!(
                live,
                usize::from(present),
                "{name}: {live} live engagements, present: {present}"
            );
        }
        for name in &names {
            assert!(set.get(name).is_ok());
        }
    }
}
