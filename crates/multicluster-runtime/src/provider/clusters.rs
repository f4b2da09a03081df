//! The set of clusters a provider keeps (Go: `pkg/clusters.Clusters[T]`).
//!
//! Providers add and remove clusters as their inventory changes; the set
//! gives each cluster a lifetime, applies every stored field index to it
//! (also to clusters added later), and engages it with the manager once the
//! provider has started. Safe to use from many tasks at once.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::cache::FieldIndex;
use crate::cluster::Cluster;
use crate::engagements::Engagements;
use crate::error::Error;
use crate::multicluster::{Aware, InventoryEngaged, Provider, ProviderContext};
use multicluster_core::ClusterName;

/// Called with errors that have no caller to return to (an engagement that
/// failed while the provider was adding clusters in the background).
pub(crate) type ErrorHandler = Arc<dyn Fn(&ClusterName, &Error) + Send + Sync>;

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
    /// Engagements still to be handed to the component, in the order the
    /// set made them.
    outbox: std::collections::VecDeque<Handover>,
    /// Whether a caller is handing the outbox over (and will take what is
    /// added meanwhile).
    handing_over: bool,
}

/// An engagement on its way to the component, and the one it replaces,
/// which ends only once this one has been handed over.
struct Handover {
    aware: Arc<dyn Aware>,
    lifetime: CancellationToken,
    name: ClusterName,
    cluster: Cluster,
    replaced: Option<CancellationToken>,
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
        multicluster_core::lock(&self.inner)
    }

    /// Engages every cluster added so far and every one added later with
    /// `context.aware`, with lifetimes that end at the latest with
    /// `context.shutdown`, and says that the inventory is engaged
    /// ([`ProviderContext::inventory_engaged`]) once the clusters it holds
    /// now are handed over: a provider whose inventory is what it added
    /// before starting the set needs nothing more. A provider that finds
    /// its inventory after starting the set calls
    /// [`Clusters::start_discovering`] instead, and says so itself when its
    /// first read is engaged ([`crate::provider::discovery::Discovered`]
    /// does).
    ///
    /// `aware` is called after the set's lock is released, so it may look
    /// clusters up (or change the set) from `engage`. It is called once at a
    /// time, in the order the set changed; a cluster that replaces another
    /// under its name is engaged before the replaced one's lifetime ends,
    /// so `aware` never sees the name leave in between. An engagement whose
    /// lifetime has already ended when it arrives (the cluster was removed
    /// meanwhile) is stale, and [`Aware`] implementations ignore it.
    pub fn start(&self, context: &ProviderContext) -> Result<InventoryEngaged, Error> {
        self.start_discovering(context)?;
        Ok(context.inventory_engaged())
    }

    /// [`Clusters::start`], without saying that the inventory is engaged:
    /// for a provider that finds its inventory after starting the set.
    pub fn start_discovering(&self, context: &ProviderContext) -> Result<(), Error> {
        let (shutdown, aware) = (context.shutdown.clone(), context.aware.clone());
        {
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
            for (name, cluster, fingerprint) in held {
                // The lifetimes given before the start were never handed
                // to anyone: they may end at once.
                let (entry, _) =
                    state
                        .entries
                        .insert(name.clone(), cluster.clone(), &shutdown, fingerprint);
                let lifetime = entry.lifetime.clone();
                state.outbox.push_back(Handover {
                    aware: aware.clone(),
                    lifetime,
                    name,
                    cluster,
                    replaced: None,
                });
            }
        }
        self.hand_over();
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
        let Some((shutdown, aware)) = state.started.clone() else {
            let unstarted = state.unstarted.clone();
            // Nobody was given the lifetime of a cluster it replaces.
            state.entries.insert(name, cluster, &unstarted, fingerprint);
            return Ok(());
        };
        let (entry, replaced) = state.entries.insert_ending_later(
            name.clone(),
            cluster.clone(),
            &shutdown,
            fingerprint,
        );
        let lifetime = entry.lifetime.clone();
        state.outbox.push_back(Handover {
            aware,
            lifetime,
            name,
            cluster,
            replaced: replaced.map(|old| old.lifetime),
        });
        drop(state);
        self.hand_over();
        Ok(())
    }

    /// Hands the outbox to the component, oldest first, unless another
    /// caller is doing so (it takes ours too). The component is called
    /// without the set's lock, so it may look clusters up or change the set
    /// from `engage` (see `start`); one caller at a time keeps the calls in
    /// the order the set made them, so a stale engagement is always the
    /// one whose lifetime has ended, and a replacement is engaged before
    /// the lifetime it replaces ends.
    fn hand_over(&self) {
        {
            let mut state = self.lock();
            if state.handing_over {
                return;
            }
            state.handing_over = true;
        }
        // Should a component panic, the next caller can still hand over.
        struct Unwinding<'a>(&'a Clusters);
        impl Drop for Unwinding<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.lock().handing_over = false;
                }
            }
        }
        let _unwinding = Unwinding(self);
        loop {
            let next = {
                let mut state = self.lock();
                let Some(next) = state.outbox.pop_front() else {
                    // Under the lock that callers who add to the outbox
                    // take: nothing can be left behind.
                    state.handing_over = false;
                    return;
                };
                next
            };
            let Handover {
                aware,
                lifetime,
                name,
                cluster,
                replaced,
            } = next;
            if let Err(err) = aware.engage(lifetime, name.clone(), cluster) {
                (self.on_error)(&name, &err);
            }
            if let Some(replaced) = replaced {
                replaced.cancel();
            }
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

/// A provider that keeps its clusters in a [`Clusters`] set. Implementing
/// this gives it [`Provider`]: lookups and field indexes are served by the
/// set, so indexes registered before a cluster arrives reach it too.
pub trait ClusterSetProvider: Send + Sync {
    /// The set the provider keeps its clusters in.
    fn cluster_set(&self) -> &Clusters;

    /// Names of the clusters the provider holds now, sorted.
    fn names(&self) -> Vec<ClusterName> {
        self.cluster_set().names()
    }
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

    fn context(shutdown: CancellationToken, aware: Arc<dyn Aware>) -> ProviderContext {
        ProviderContext::new(shutdown, aware, crate::metrics::Metrics::new(false))
    }

    /// A set started by a provider whose inventory is what it added before
    /// says the inventory is engaged once that is handed over; one started
    /// to discover more leaves saying it to the provider.
    #[tokio::test]
    async fn a_started_set_says_its_inventory_is_engaged_and_a_discovering_one_does_not() {
        let aware: Arc<Recording> = Arc::new(Recording::default());
        let set = Clusters::new();
        set.add("a", cluster("a")).expect("add");
        let given = context(CancellationToken::new(), aware.clone());
        set.start(&given).expect("start");
        assert!(given.is_inventory_engaged());
        assert!(
            aware
                .0
                .lock()
                .expect("lock")
                .contains_key(&ClusterName::from("a"))
        );

        let discovering = Clusters::new();
        let found = context(CancellationToken::new(), aware);
        discovering.start_discovering(&found).expect("start");
        assert!(!found.is_inventory_engaged());
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
                set.start_discovering(&context(CancellationToken::new(), aware))
                    .expect("start");
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

    /// Whether, at each engagement, the engagement it replaces had already
    /// ended.
    #[derive(Default)]
    struct ReplacementOrder(Mutex<Vec<bool>>, Mutex<Option<CancellationToken>>);

    impl Aware for ReplacementOrder {
        fn engage(
            &self,
            lifetime: CancellationToken,
            _: ClusterName,
            _: Cluster,
        ) -> Result<(), Error> {
            let previous = self.1.lock().expect("lock").replace(lifetime);
            if let Some(previous) = previous {
                self.0.lock().expect("lock").push(previous.is_cancelled());
            }
            Ok(())
        }
    }

    /// A replaced cluster's lifetime ends only after its successor was
    /// engaged: ended first, a component sees the cluster leave the fleet
    /// and come back (the manager counted a disengagement, and on a busy
    /// machine dropped the cluster's components in between).
    #[tokio::test]
    async fn a_replacement_is_engaged_before_the_replaced_lifetime_ends() {
        let set = Clusters::new();
        let aware = Arc::new(ReplacementOrder::default());
        set.start_discovering(&context(CancellationToken::new(), aware.clone()))
            .expect("start");
        assert!(set.add_or_replace("c", cluster("c"), "v1"));
        let first = aware.1.lock().expect("lock").clone().expect("engaged");
        assert!(set.add_or_replace("c", cluster("c"), "v2"));
        assert_eq!(
            *aware.0.lock().expect("lock"),
            [false],
            "the old lifetime ended before the new instance was engaged"
        );
        assert!(first.is_cancelled(), "the replaced lifetime ends after");
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
        set.start_discovering(&context(shutdown.clone(), aware.clone()))
            .expect("start");
        assert!(matches!(
            set.start_discovering(&context(shutdown.clone(), aware.clone())),
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
