//! An informer's subscribers, each with a bounded channel.
//!
//! The informer hands each subscriber its events without waiting (it holds
//! its lock, and one slow subscriber must not stall the watch for the
//! others). A subscriber whose channel is full falls behind: the informer
//! stops sending to it and notes what the subscriber holds once it has read
//! its channel. When it has, the subscription relists: under the
//! informer's lock it compares the store with what it held and yields, in
//! place of every event it missed, one `Applied` per object that is new or
//! changed (its `old` the version it held) and one `Deleted` per object
//! gone, then takes events from the channel again. A subscriber that stops
//! reading costs at most [`SUBSCRIBER_BUFFER`] events and one reference per
//! object it held; it is never fed less than the store's current state.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use kube::Resource;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, watch};

use super::event::CacheEvent;
use multicluster_core::lock;

/// Events a subscriber may have waiting before it falls behind and, once it
/// has read them, relists.
pub const SUBSCRIBER_BUFFER: usize = 1024;

/// An object's namespace and name: the key of one informer's objects.
type Key = (Option<String>, String);

/// What a subscriber that fell behind holds once it has read its channel,
/// by key; `None` while it keeps up.
type Held<K> = Mutex<Option<HashMap<Key, Arc<K>>>>;

fn key_of<K: Resource>(obj: &K) -> Key {
    let meta = obj.meta();
    (
        meta.namespace.clone(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// How a subscription catches up with its informer after falling behind:
/// the events that bring `held` to the store's current state, taken with
/// the informer's lock held (so that none of its events is missed or told
/// twice), after which the informer sends to the subscriber again. `None`
/// when the informer is gone.
pub(crate) type Relist<K> =
    Arc<dyn Fn(&Held<K>) -> Option<Vec<CacheEvent<K>>> + Send + Sync + 'static>;

/// A subscriber as its informer holds it.
pub(crate) struct Subscriber<K> {
    sender: mpsc::Sender<CacheEvent<K>>,
    held: Arc<Held<K>>,
}

impl<K: Resource + 'static> Subscriber<K> {
    /// A subscriber and its subscription, which yields `initial` first
    /// (read where the informer's lock was held), then what is sent.
    pub(crate) fn new(
        initial: Vec<CacheEvent<K>>,
        ready: watch::Receiver<bool>,
        relist: Relist<K>,
    ) -> (Self, Subscription<K>) {
        let (sender, receiver) = mpsc::channel(SUBSCRIBER_BUFFER);
        let held = Arc::new(Mutex::new(None));
        let subscription = Subscription {
            receiver,
            ready,
            relisted: initial.into(),
            held: held.clone(),
            relist,
        };
        (Self { sender, held }, subscription)
    }

    /// Sends `events`, made from one watch event after it was applied to
    /// the store whose contents are now `stored`. Returns false once the
    /// subscription is gone.
    pub(crate) fn deliver(
        &self,
        events: &[CacheEvent<K>],
        stored: impl FnOnce() -> Vec<Arc<K>>,
    ) -> bool {
        let mut held = lock(&self.held);
        if held.is_some() {
            return !self.sender.is_closed();
        }
        for (sent, event) in events.iter().enumerate() {
            match self.sender.try_send(event.clone()) {
                Ok(()) => {}
                Err(TrySendError::Closed(_)) => return false,
                Err(TrySendError::Full(_)) => {
                    *held = Some(held_before(stored(), &events[sent..]));
                    tracing::debug!(
                        buffer = SUBSCRIBER_BUFFER,
                        "a cache subscriber fell behind: it relists once it has read its events"
                    );
                    return true;
                }
            }
        }
        true
    }
}

/// The store's contents as they were before `unsent` (events of one watch
/// event, one per object) were applied: what a subscriber holds that got
/// every event before them.
fn held_before<K: Resource>(stored: Vec<Arc<K>>, unsent: &[CacheEvent<K>]) -> HashMap<Key, Arc<K>> {
    let mut held: HashMap<Key, Arc<K>> =
        stored.into_iter().map(|obj| (key_of(&*obj), obj)).collect();
    for event in unsent {
        match event {
            CacheEvent::Applied { old: Some(old), .. } => {
                held.insert(key_of(&**old), old.clone());
            }
            CacheEvent::Applied { old: None, new } => {
                held.remove(&key_of(&**new));
            }
            CacheEvent::Deleted(gone) => {
                held.insert(key_of(&**gone), gone.clone());
            }
        }
    }
    held
}

/// What brings a subscriber that holds `held` to `stored`: the store's
/// objects it does not hold as they are (the store replaces an object's
/// `Arc` on every change), then those it holds that are gone.
pub(crate) fn catch_up<K: Resource>(
    mut held: HashMap<Key, Arc<K>>,
    stored: Vec<Arc<K>>,
) -> Vec<CacheEvent<K>> {
    let mut events = Vec::new();
    for new in stored {
        match held.remove(&key_of(&*new)) {
            Some(old) if Arc::ptr_eq(&old, &new) => {}
            old => events.push(CacheEvent::Applied { old, new }),
        }
    }
    events.extend(held.into_values().map(CacheEvent::Deleted));
    events
}

/// Takes what a subscriber that fell behind holds, if it did.
pub(crate) fn take_held<K>(held: &Held<K>) -> Option<HashMap<Key, Arc<K>>> {
    lock(held).take()
}

/// A stream of [`CacheEvent`]s for one subscriber. Dropping it unsubscribes.
///
/// Its channel holds at most [`SUBSCRIBER_BUFFER`] events; a subscriber that
/// falls further behind relists once it has read them (see the module's
/// documentation): it may see an object's intermediate versions folded into
/// one change, never less than the current state.
pub struct Subscription<K> {
    receiver: mpsc::Receiver<CacheEvent<K>>,
    /// The informer's: whether its first list has completed.
    ready: watch::Receiver<bool>,
    /// Events to yield before the channel's: the initial contents, or
    /// what a relist gave.
    relisted: VecDeque<CacheEvent<K>>,
    held: Arc<Held<K>>,
    relist: Relist<K>,
}

impl<K> Subscription<K> {
    /// The next event, or `None` once the informer has stopped.
    pub async fn recv(&mut self) -> Option<CacheEvent<K>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<CacheEvent<K>>> {
        loop {
            if let Some(event) = self.relisted.pop_front() {
                return Poll::Ready(Some(event));
            }
            match self.receiver.poll_recv(cx) {
                Poll::Ready(event) => return Poll::Ready(event),
                // Read to the end (not merely out of tokio's budget for
                // this poll: events still wait then), a subscriber that fell
                // behind relists.
                Poll::Pending if self.receiver.is_empty() && self.is_behind() => {
                    match (self.relist)(&self.held) {
                        Some(events) => self.relisted.extend(events),
                        None => return Poll::Ready(None),
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_behind(&self) -> bool {
        lock(&self.held).is_some()
    }

    /// What the subscription costs while nobody reads it: the events
    /// waiting, and if it fell behind, the objects it holds a reference to
    /// until it relists (feature `testing`).
    #[cfg(any(test, feature = "testing"))]
    pub fn waiting(&self) -> (usize, Option<usize>) {
        (
            self.relisted.len() + self.receiver.len(),
            lock(&self.held).as_ref().map(HashMap::len),
        )
    }

    /// Whether every event of the informer's first list has been taken
    /// from this subscription: the list has completed (its events are sent
    /// before it counts as complete) and none is left waiting.
    pub(crate) fn caught_up(&self) -> bool {
        self.is_listed()
            && self.relisted.is_empty()
            && self.receiver.is_empty()
            && !self.is_behind()
    }

    /// Whether the informer's first list has completed.
    pub(crate) fn is_listed(&self) -> bool {
        *self.ready.borrow()
    }

    /// Completes once the informer's first list has completed.
    pub(crate) fn listed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut ready = self.ready.clone();
        async move {
            let _ = ready.wait_for(|ready| *ready).await;
        }
    }
}

impl<K> Stream for Subscription<K> {
    type Item = CacheEvent<K>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx)
    }
}
