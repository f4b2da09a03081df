//! Slow per-key work (building clients whose credential plugins take a
//! second or more) run a bounded number at a time, for provider loops that
//! decide in event order but should not wait for one cluster's plugin
//! before starting on the next.
//!
//! At most one piece of work per key runs at once; a key that changes while
//! its work runs is marked, and the loop looks at it again once the work is
//! done (its result is then out of date). Keys beyond the limit wait in
//! arrival order.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

/// Work in flight, by key.
pub struct InFlight<K, T> {
    limit: usize,
    /// Running keys, each with whether it changed meanwhile.
    running: HashMap<K, bool>,
    waiting: VecDeque<K>,
    waiting_set: HashSet<K>,
    work: FuturesUnordered<BoxFuture<'static, (K, T)>>,
}

impl<K, T> std::fmt::Debug for InFlight<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("limit", &self.limit)
            .field("running", &self.running.len())
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

/// What [`InFlight::next`] hands back.
#[derive(Debug)]
pub struct Done<K, T> {
    /// The key the work was for.
    pub key: K,
    /// The work's result.
    pub result: T,
    /// Whether the key changed while the work ran: the result may be out of
    /// date, and the key should be looked at again.
    pub stale: bool,
}

impl<K: Clone + Eq + Hash + Send + 'static, T: Send + 'static> InFlight<K, T> {
    /// Runs at most `limit` (at least 1) pieces of work at once.
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            running: HashMap::new(),
            waiting: VecDeque::new(),
            waiting_set: HashSet::new(),
            work: FuturesUnordered::new(),
        }
    }

    /// Whether `key`'s work is running; if so, it is marked stale, since the
    /// caller is looking at the key because it changed.
    pub fn mark_if_running(&mut self, key: &K) -> bool {
        match self.running.get_mut(key) {
            Some(stale) => {
                *stale = true;
                true
            }
            None => false,
        }
    }

    /// Starts `work` for `key` if there is room; otherwise the key waits
    /// (once) and comes back from [`InFlight::next_waiting`], to be looked
    /// at afresh then. Returns whether the work started.
    pub fn start(&mut self, key: K, work: BoxFuture<'static, T>) -> bool {
        if self.running.len() >= self.limit {
            if self.waiting_set.insert(key.clone()) {
                self.waiting.push_back(key);
            }
            return false;
        }
        self.running.insert(key.clone(), false);
        self.work.push(Box::pin(async move { (key, work.await) }));
        true
    }

    /// The next waiting key, if there is room to start its work.
    pub fn next_waiting(&mut self) -> Option<K> {
        if self.running.len() >= self.limit {
            return None;
        }
        let key = self.waiting.pop_front()?;
        self.waiting_set.remove(&key);
        Some(key)
    }

    /// The next finished piece of work; never resolves while none runs.
    pub async fn next(&mut self) -> Done<K, T> {
        match self.work.next().await {
            Some((key, result)) => {
                let stale = self.running.remove(&key).unwrap_or_default();
                Done { key, result, stale }
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn work_beyond_the_limit_waits_in_order() {
        let mut inflight: InFlight<&str, u32> = InFlight::new(2);
        let (a_tx, a_rx) = oneshot::channel();
        assert!(inflight.start("a", Box::pin(async { a_rx.await.unwrap_or(0) })));
        assert!(inflight.start("b", Box::pin(async { 2 })));
        assert!(!inflight.start("c", Box::pin(async { 3 })));
        assert!(!inflight.start("d", Box::pin(async { 4 })));
        assert!(!inflight.start("c", Box::pin(async { 3 })), "waits once");
        assert_eq!(inflight.next_waiting(), None, "no room yet");

        let done = inflight.next().await;
        assert_eq!((done.key, done.result, done.stale), ("b", 2, false));
        assert_eq!(inflight.next_waiting(), Some("c"));
        assert!(inflight.start("c", Box::pin(async { 3 })));
        assert_eq!(inflight.next_waiting(), None, "a and c run");
        let _ = a_tx.send(1);
        let mut finished = vec![inflight.next().await.key, inflight.next().await.key];
        finished.sort_unstable();
        assert_eq!(finished, ["a", "c"]);
        assert_eq!(inflight.next_waiting(), Some("d"));
        assert_eq!(inflight.next_waiting(), None);
    }

    #[tokio::test]
    async fn a_key_changed_while_running_comes_back_stale() {
        let mut inflight: InFlight<&str, u32> = InFlight::new(4);
        assert!(!inflight.mark_if_running(&"a"));
        assert!(inflight.start("a", Box::pin(async { 1 })));
        assert!(inflight.mark_if_running(&"a"));
        let done = inflight.next().await;
        assert!(done.stale);
        assert!(!inflight.mark_if_running(&"a"), "no longer running");
    }
}
