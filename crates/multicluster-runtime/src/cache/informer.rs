//! One watch of one resource type in one cluster, its store, its field
//! indexes and its subscribers.
//!
//! An informer consumes a kube-runtime `watcher` stream. Every event updates
//! the store and the indexes and is then fanned out to every subscriber, all
//! under one lock, so a subscriber that joins late first receives the current
//! contents and then exactly the events that follow them.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cache::event::CacheEvent;
use crate::cache::index::Indexes;
use crate::cache::retry::{GONE_DEGRADED, RetryState};
use crate::cache::subscription::{Relist, Subscriber, Subscription, catch_up, take_held};
use multicluster_core::ClusterName;
use multicluster_core::health::repeats::{Repeats, Telling};
use multicluster_core::health::{FailingFlag, Failure};

/// A shared watch of one resource type in one cluster.
pub struct Informer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    dyntype: K::DynamicType,
    store: Store<K>,
    state: Mutex<State<K>>,
    pub(super) ready: watch::Receiver<bool>,
    /// Whether the state holds a failure (the manager's health walk reads
    /// this every second for every cluster, without the lock).
    failing: FailingFlag,
    /// Itself, for subscriptions to relist from once they fell behind.
    me: Weak<Self>,
}

struct State<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    writer: Writer<K>,
    subscribers: Vec<Subscriber<K>>,
    indexes: Indexes<K>,
    /// The objects listed since the current (re)list began: the store
    /// shows them at `InitDone`, when they are announced.
    relisted: Option<HashSet<ObjectRef<K>>>,
    /// The watch's failure since its last success, if it is failing.
    failure: Option<Failure>,
}

/// Whether a watch error is the server ending the watch with `410 Gone`.
pub(crate) fn is_gone(err: &watcher::Error) -> bool {
    matches!(err, watcher::Error::WatchError(status) if status.code == 410)
}

/// Tells a watch's failures as [`multicluster_core::health::repeats`] says: a member
/// that stays down is one warning, then a reminder every five minutes, not
/// one warning per retry. The manager says the cluster's change of state
/// once besides.
#[derive(Default)]
struct FailureLog(Repeats);

impl FailureLog {
    fn failed(
        &mut self,
        cluster: &ClusterName,
        kind: &str,
        reason: &multicluster_core::redact::Redacted,
        retry_in: Option<std::time::Duration>,
    ) {
        match self.0.tell(reason, std::time::Instant::now()) {
            Telling::New => {
                tracing::warn!(%cluster, kind, error = %reason, ?retry_in, "watch failed");
            }
            Telling::Reminder(attempts) => {
                tracing::warn!(%cluster, kind, error = %reason, attempts, ?retry_in, "watch still failing");
            }
            Telling::Repeat(attempts) => {
                tracing::debug!(%cluster, kind, error = %reason, attempts, ?retry_in, "watch failed again");
            }
        }
    }

    fn delivered(&mut self, cluster: &ClusterName, kind: &str) {
        if let Some(failures) = self.0.succeeded() {
            tracing::info!(%cluster, kind, failures, "watch delivers again");
        }
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    /// Starts consuming `events` until `stop` is cancelled.
    pub(crate) fn spawn<S>(
        cluster: ClusterName,
        dyntype: K::DynamicType,
        events: S,
        indexes: Indexes<K>,
        stop: CancellationToken,
        retries: Option<RetryState>,
    ) -> Arc<Self>
    where
        S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    {
        let writer = Writer::new(dyntype.clone());
        let kind = K::kind(&dyntype).to_string();
        let plural = K::plural(&dyntype).to_string();
        let (ready_tx, ready) = watch::channel(false);
        let informer = Arc::new_cyclic(|me| Self {
            dyntype,
            store: writer.as_reader(),
            state: Mutex::new(State {
                writer,
                subscribers: Vec::new(),
                indexes,
                relisted: None,
                failure: None,
            }),
            ready,
            failing: FailingFlag::default(),
            me: me.clone(),
        });
        let weak = Arc::downgrade(&informer);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            let mut told = FailureLog::default();
            loop {
                let event = tokio::select! {
                    () = stop.cancelled() => break,
                    event = events.next() => event,
                };
                let Some(event) = event else { break };
                // Everyone who could read the informer is gone.
                let Some(informer) = weak.upgrade() else {
                    break;
                };
                // Watches ended with 410 Gone over and over: only a change
                // the watch delivers shows it works, not a fresh list.
                let gone = retries.as_ref().map_or(0, RetryState::gone_in_a_row);
                match event {
                    Ok(event) => {
                        told.delivered(&cluster, &kind);
                        if informer.apply(event, gone >= GONE_DEGRADED) {
                            ready_tx.send_replace(true);
                        }
                    }
                    // A few in a row may be compaction: backed off, not shown.
                    Err(err) if is_gone(&err) && gone < GONE_DEGRADED => {
                        tracing::debug!(%cluster, kind, in_a_row = gone, "watch ended with 410 Gone again; listing again after a delay");
                    }
                    Err(err) => {
                        let unreachable = multicluster_core::health::is_unreachable(&err);
                        let context = if is_gone(&err) {
                            format!(
                                "watching {plural}: {gone} watches in a row ended with 410 Gone before delivering a change (listing again with backoff)"
                            )
                        } else {
                            format!("watching {plural}")
                        };
                        let reason = crate::redact::watcher(&err).with_context(&context);
                        let retry_in = retries.as_ref().and_then(RetryState::delay);
                        told.failed(&cluster, &kind, &reason, retry_in);
                        let mut state = informer.lock();
                        state.failure = Some(
                            Failure::continuing(state.failure.as_ref(), reason, unreachable)
                                .retried_in(retry_in),
                        );
                        informer.failing.set(true);
                    }
                }
            }
            tracing::debug!(%cluster, kind, "informer stopped");
            // Dropping the senders ends every subscription.
            if let Some(informer) = weak.upgrade() {
                informer.lock().subscribers.clear();
            }
        });
        informer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        // The state stays consistent even if a holder panicked: every update
        // is applied to the store before anything else can fail.
        multicluster_core::lock(&self.state)
    }

    /// Applies one watcher event; returns true when an initial list or relist
    /// has completed. `lists_prove_nothing`: the failure stays until the
    /// watch delivers a change.
    fn apply(&self, event: watcher::Event<K>, lists_prove_nothing: bool) -> bool {
        let mut state = self.lock();
        // The start of a list says nothing yet: a refused list starts over
        // and over. What it delivers shows that the watch works again.
        let listed = matches!(
            event,
            watcher::Event::InitApply(_) | watcher::Event::InitDone
        );
        if self.failing.get()
            && !matches!(event, watcher::Event::Init)
            && !(lists_prove_nothing && listed)
        {
            state.failure = None;
            self.failing.set(false);
        }
        let mut outgoing = Vec::new();
        let mut synced = false;
        // What the store held before the event, read before it is applied.
        let before = match &event {
            watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => {
                let key = ObjectRef::from_obj_with(obj, self.dyntype.clone());
                let old = self.store.get(&key);
                Some((key, old))
            }
            _ => None,
        };
        let previous: Option<HashMap<ObjectRef<K>, Arc<K>>> =
            matches!(event, watcher::Event::InitDone).then(|| {
                self.store
                    .state()
                    .into_iter()
                    .map(|obj| (ObjectRef::from_obj_with(&*obj, self.dyntype.clone()), obj))
                    .collect()
            });
        // The store's copy is the one every subscriber and index shares:
        // each object is copied out of the event once, by the store.
        state.writer.apply_watcher_event(&event);
        match &event {
            watcher::Event::Init => {
                state.relisted = Some(HashSet::new());
            }
            // Listed objects are announced at InitDone, once the store shows
            // them: a subscriber reading the store on an event must find the
            // object there.
            watcher::Event::InitApply(obj) => {
                let key = ObjectRef::from_obj_with(obj, self.dyntype.clone());
                if let Some(listed) = state.relisted.as_mut() {
                    listed.insert(key);
                }
            }
            watcher::Event::Apply(_) => {
                if let Some((key, old)) = before
                    && let Some(new) = self.store.get(&key)
                {
                    state.indexes.replace(&key, old.as_deref(), Some(&new));
                    outgoing.push(CacheEvent::Applied { old, new });
                }
            }
            watcher::Event::Delete(obj) => {
                if let Some((key, old)) = before {
                    state.indexes.replace(&key, old.as_deref(), None);
                }
                // Its last state, deletion timestamp and all.
                outgoing.push(CacheEvent::Deleted(Arc::new(obj.clone())));
            }
            watcher::Event::InitDone => {
                let listed = state.relisted.take().unwrap_or_default();
                let mut previous = previous.unwrap_or_default();
                for key in listed {
                    let Some(new) = self.store.get(&key) else {
                        continue;
                    };
                    let old = previous.remove(&key);
                    state.indexes.replace(&key, old.as_deref(), Some(&new));
                    outgoing.push(CacheEvent::Applied { old, new });
                }
                // Whatever the new list lacks was deleted while unwatched.
                for (key, gone) in previous {
                    state.indexes.replace(&key, Some(&gone), None);
                    outgoing.push(CacheEvent::Deleted(gone));
                }
                synced = true;
            }
        }
        state
            .subscribers
            .retain(|subscriber| subscriber.deliver(&outgoing, || self.store.state()));
        synced
    }

    /// Subscribes to changes. The current contents arrive first, as
    /// `Applied` events without an old version.
    pub fn subscribe(&self) -> Subscription<K> {
        // Under the lock, so no newer event can overtake the contents.
        let mut state = self.lock();
        let contents = self
            .store
            .state()
            .into_iter()
            .map(|new| CacheEvent::Applied { old: None, new })
            .collect();
        let (subscriber, subscription) =
            Subscriber::new(contents, self.ready.clone(), self.relist());
        state.subscribers.push(subscriber);
        subscription
    }

    /// The current contents and a subscription to every change after them,
    /// taken atomically.
    pub(crate) fn snapshot_and_subscribe(&self) -> (Vec<Arc<K>>, Subscription<K>) {
        let mut state = self.lock();
        let snapshot = self.store.state();
        let (subscriber, subscription) =
            Subscriber::new(Vec::new(), self.ready.clone(), self.relist());
        state.subscribers.push(subscriber);
        (snapshot, subscription)
    }

    /// How a subscription that fell behind catches up: with the lock held,
    /// so that the informer sends it nothing meanwhile.
    fn relist(&self) -> Relist<K> {
        let me = self.me.clone();
        Arc::new(move |held| {
            let informer = me.upgrade()?;
            let _state = informer.lock();
            Some(match take_held(held) {
                Some(held) => catch_up(held, informer.store.state()),
                None => Vec::new(),
            })
        })
    }

    /// The informer's store, for reads.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// The object with that namespace and name, if cached.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let mut key = ObjectRef::new_with(name, self.dyntype.clone());
        if let Some(ns) = namespace {
            key = key.within(ns);
        }
        self.store.get(&key)
    }

    /// Every cached object, optionally only those in `namespace`.
    pub fn list(&self, namespace: Option<&str>) -> Vec<Arc<K>> {
        match namespace {
            None => self.store.state(),
            Some(ns) => self
                .store
                .state_filter(|obj| obj.meta().namespace.as_deref() == Some(ns)),
        }
    }

    /// Objects whose indexed `field` has `value`, optionally only those in
    /// `namespace`. Unknown fields give an empty answer; see
    /// [`crate::cache::Cache::index_field`].
    pub fn by_index(&self, field: &str, value: &str, namespace: Option<&str>) -> Vec<Arc<K>> {
        let keys = self.lock().indexes.lookup(field, value);
        keys.into_iter()
            .filter(|key| namespace.is_none() || key.namespace.as_deref() == namespace)
            .filter_map(|key| self.store.get(&key))
            .collect()
    }

    /// Adds an index, computing it for the objects already cached.
    pub(crate) fn add_index(&self, field: String, extractor: crate::cache::index::Extractor<K>) {
        let mut state = self.lock();
        if state.indexes.insert(field.clone(), extractor) {
            let objects = self.store.state();
            state.indexes.rebuild(&field, &objects);
        }
    }

    /// Whether the initial list has completed.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the initial list has completed.
    pub async fn wait_ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|ready| *ready).await;
    }

    /// The last watch error, cleared once the watch delivers again.
    pub fn last_error(&self) -> Option<String> {
        self.lock()
            .failure
            .as_ref()
            .map(|failure| failure.reason.to_string())
    }

    /// The watch's failure since its last success, if it is failing.
    pub(crate) fn failure(&self) -> Option<Failure> {
        if !self.failing.get() {
            return None;
        }
        self.lock().failure.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    /// What feeds an informer by hand.
    type Feed =
        futures::channel::mpsc::UnboundedSender<Result<watcher::Event<ConfigMap>, watcher::Error>>;

    /// An informer fed by hand, and what feeds it.
    fn fed() -> (Feed, Arc<Informer<ConfigMap>>) {
        let (events, stream) = futures::channel::mpsc::unbounded();
        let informer = Informer::<ConfigMap>::spawn(
            ClusterName::from("test"),
            (),
            stream,
            Indexes::new(()),
            CancellationToken::new(),
            None,
        );
        (events, informer)
    }

    fn config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("default".into());
        cm
    }

    /// Every subscriber gets the store's own copy of an object: one copy
    /// per event, shared, not one per subscriber or per step.
    #[tokio::test]
    async fn subscribers_share_the_stores_copy_of_each_object() {
        let (events, informer) = fed();
        let mut first = informer.subscribe();
        let mut second = informer.subscribe();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(config_map("listed")),
            watcher::Event::InitDone,
            watcher::Event::Apply(config_map("changed")),
        ] {
            events.unbounded_send(Ok(event)).expect("send");
        }
        for name in ["listed", "changed"] {
            let key = ObjectRef::new(name).within("default");
            let mut got = Vec::new();
            for subscription in [&mut first, &mut second] {
                let Some(CacheEvent::Applied { new, .. }) =
                    tokio::time::timeout(Duration::from_secs(10), subscription.next())
                        .await
                        .expect("an event")
                else {
                    panic!("not an Applied event");
                };
                got.push(new);
            }
            let stored = informer.store().get(&key).expect("stored");
            for new in got {
                assert!(Arc::ptr_eq(&new, &stored), "{name}: a copy of its own");
            }
        }
    }

    /// A subscriber that joins after some objects of the first list were
    /// received, but before the list completed, must still get them, and
    /// only once the store shows them.
    #[tokio::test]
    async fn a_subscriber_joining_mid_list_gets_the_objects_listed_so_far() {
        let (events, informer) = fed();
        events
            .unbounded_send(Ok(watcher::Event::Init))
            .expect("send");
        events
            .unbounded_send(Ok(watcher::Event::InitApply(config_map("early"))))
            .expect("send");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while informer
            .lock()
            .relisted
            .as_ref()
            .is_none_or(HashSet::is_empty)
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the informer did not apply the event"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        let mut late = informer.subscribe();
        events
            .unbounded_send(Ok(watcher::Event::InitApply(config_map("later"))))
            .expect("send");
        events
            .unbounded_send(Ok(watcher::Event::InitDone))
            .expect("send");
        let mut names = Vec::new();
        for _ in 0..2 {
            let event = tokio::time::timeout(Duration::from_secs(10), late.recv())
                .await
                .expect("an event")
                .expect("open");
            let name = event.object().metadata.name.clone().unwrap_or_default();
            assert!(
                informer.get(Some("default"), &name).is_some(),
                "{name} is in the store when announced"
            );
            names.push(name);
        }
        names.sort();
        assert_eq!(names, ["early", "later"]);
        informer.wait_ready().await;
        assert_eq!(informer.list(None).len(), 2);
    }

    fn versioned(name: &str, version: usize) -> ConfigMap {
        let mut cm = config_map(name);
        cm.data = Some([("version".to_string(), version.to_string())].into());
        cm
    }

    fn version(obj: &ConfigMap) -> Option<&str> {
        obj.data.as_ref()?.get("version").map(String::as_str)
    }

    /// A subscriber that stops reading holds at most its buffer and one
    /// reference per object; read again, it relists: it ends with the
    /// store's state, deletions included, in fewer events than were made.
    #[tokio::test]
    async fn a_subscriber_that_stops_reading_costs_bounded_memory_then_relists() {
        const OBJECTS: usize = 100;
        const ROUNDS: usize = 50;
        let (events, informer) = fed();
        let mut stalled = informer.subscribe();
        let mut reading = informer.subscribe();
        let names: Vec<String> = (0..OBJECTS).map(|i| format!("cm-{i:03}")).collect();
        let mut list = vec![watcher::Event::Init];
        list.extend(
            names
                .iter()
                .map(|name| watcher::Event::InitApply(versioned(name, 0))),
        );
        list.push(watcher::Event::InitDone);
        let mut batches = vec![(list, OBJECTS)];
        for round in 1..=ROUNDS {
            let changes = names
                .iter()
                .map(|name| watcher::Event::Apply(versioned(name, round)));
            batches.push((changes.collect(), OBJECTS));
        }
        let mut last: Vec<_> = names[..10]
            .iter()
            .map(|name| watcher::Event::Delete(versioned(name, ROUNDS)))
            .collect();
        last.push(watcher::Event::Apply(versioned("created", 1)));
        batches.push((last, 11));
        // Fed in batches the reading subscriber reads before the next, so
        // that it keeps up: it is told each change.
        let mut made = 0;
        for (batch, told) in batches {
            for event in batch {
                events.unbounded_send(Ok(event)).expect("send");
            }
            for _ in 0..told {
                tokio::time::timeout(Duration::from_secs(10), reading.next())
                    .await
                    .expect("the reading subscriber is told everything")
                    .expect("open");
            }
            made += told;
        }
        assert_eq!(reading.waiting(), (0, None));

        let (waiting, held) = stalled.waiting();
        assert!(
            waiting <= crate::cache::SUBSCRIBER_BUFFER,
            "{waiting} events wait"
        );
        assert!(held.is_some_and(|held| held <= OBJECTS), "held {held:?}");

        let mut seen: HashMap<String, Arc<ConfigMap>> = HashMap::new();
        let mut told = 0;
        while !stalled.caught_up() {
            let event = tokio::time::timeout(Duration::from_secs(10), stalled.next())
                .await
                .expect("an event")
                .expect("open");
            told += 1;
            let name = event.object().metadata.name.clone().unwrap_or_default();
            match event {
                CacheEvent::Applied { new, .. } => seen.insert(name, new),
                CacheEvent::Deleted(_) => seen.remove(&name),
            };
        }
        assert!(
            told < made,
            "relisted: {told} events where {made} were made"
        );
        println!("the stalled subscriber was told {told} events where {made} were made");
        assert!(told >= OBJECTS, "{told}");
        let stored: HashMap<String, Arc<ConfigMap>> = informer
            .list(None)
            .into_iter()
            .map(|obj| (obj.metadata.name.clone().unwrap_or_default(), obj))
            .collect();
        assert_eq!(stored.len(), OBJECTS - 10 + 1);
        assert_eq!(
            seen.keys().collect::<std::collections::BTreeSet<_>>(),
            stored.keys().collect::<std::collections::BTreeSet<_>>(),
            "deleted while behind, and created"
        );
        for (name, obj) in &stored {
            assert!(
                Arc::ptr_eq(&seen[name], obj),
                "{name}: {:?}",
                version(&seen[name])
            );
        }
        assert_eq!(stalled.waiting(), (0, None));

        // Caught up, it is sent each change again.
        events
            .unbounded_send(Ok(watcher::Event::Apply(versioned("created", 2))))
            .expect("send");
        let Some(CacheEvent::Applied { old, new }) =
            tokio::time::timeout(Duration::from_secs(10), stalled.next())
                .await
                .expect("an event")
        else {
            panic!("not an Applied event");
        };
        assert_eq!(old.as_deref().and_then(version), Some("1"));
        assert_eq!(version(&new), Some("2"));
    }
}
