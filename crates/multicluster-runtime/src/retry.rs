//! Per-key retries with exponential backoff, for providers whose attempt at
//! a cluster can fail for reasons no watch event will announce (a credential
//! plugin that fails, a server that refuses the client).
//!
//! A provider's event loop selects on [`Retries::next`] next to its watches:
//!
//! ```no_run
//! # async fn attempt(_: &str) -> bool { true }
//! # async fn demo(mut events: tokio::sync::mpsc::Receiver<String>) {
//! use multicluster_runtime::controller::Backoff;
//! use multicluster_runtime::retry::Retries;
//!
//! let mut retries = Retries::new(Backoff::default());
//! loop {
//!     let key = tokio::select! {
//!         Some(key) = events.recv() => key,
//!         key = retries.next() => key,
//!     };
//!     if attempt(&key).await {
//!         retries.forget(&key);
//!     } else {
//!         retries.failed(key);
//!     }
//! }
//! # }
//! ```

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use crate::controller::Backoff;

/// The providers' default: external calls (API servers, credential plugins)
/// are retried after 1 s, doubling per failure up to 5 minutes.
pub const PROVIDER_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(300),
};

type Timer<K> = Pin<Box<dyn Future<Output = K> + Send>>;

/// Keys waiting for another attempt, each backing off on its own.
pub struct Retries<K> {
    backoff: Backoff,
    failures: HashMap<K, u32>,
    scheduled: HashSet<K>,
    timers: FuturesUnordered<Timer<K>>,
}

impl<K> std::fmt::Debug for Retries<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retries")
            .field("backoff", &self.backoff)
            .field("scheduled", &self.scheduled.len())
            .finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Retries<K> {
    /// No key scheduled; delays follow `backoff`.
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            failures: HashMap::new(),
            scheduled: HashSet::new(),
            timers: FuturesUnordered::new(),
        }
    }

    /// Counts a failure of `key` and returns its backoff delay. The key comes
    /// out of [`Retries::next`] after that delay, unless an attempt is
    /// already scheduled (then that one stands: one retry at a time per
    /// key).
    pub fn failed(&mut self, key: K) -> Duration {
        let failures = self.failures.entry(key.clone()).or_default();
        *failures = failures.saturating_add(1);
        let delay = self.backoff.delay(*failures);
        if self.scheduled.insert(key.clone()) {
            self.timers.push(Box::pin(async move {
                tokio::time::sleep(delay).await;
                key
            }));
        }
        delay
    }

    /// Forgets `key`'s failures: it worked, or needs no more attempts. A
    /// retry already scheduled still comes out of [`Retries::next`].
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// How many failures in a row `key` has had.
    pub fn failures(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or_default()
    }

    /// The next key whose retry is due; never resolves while none is
    /// scheduled.
    pub async fn next(&mut self) -> K {
        match self.timers.next().await {
            Some(key) => {
                self.scheduled.remove(&key);
                key
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    fn retries() -> Retries<&'static str> {
        Retries::new(Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(4),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn each_failure_doubles_the_delay_up_to_the_maximum() {
        let mut retries = retries();
        let start = Instant::now();
        for expected in [1, 2, 4, 4] {
            let delay = retries.failed("a");
            assert_eq!(delay, Duration::from_secs(expected));
            let before = Instant::now();
            assert_eq!(retries.next().await, "a");
            assert_eq!(before.elapsed(), delay);
        }
        assert_eq!(retries.failures(&"a"), 4);
        assert_eq!(start.elapsed(), Duration::from_secs(11));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_is_scheduled_once_and_forgetting_resets_it() {
        let mut retries = retries();
        retries.failed("a");
        retries.failed("a");
        retries.failed("b");
        let start = Instant::now();
        let mut due = vec![retries.next().await, retries.next().await];
        due.sort_unstable();
        assert_eq!(due, ["a", "b"]);
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "a's first timer stood"
        );
        let nothing_more = tokio::time::timeout(Duration::from_secs(60), retries.next()).await;
        assert!(nothing_more.is_err(), "one retry per key at a time");

        retries.forget(&"a");
        assert_eq!(retries.failures(&"a"), 0);
        assert_eq!(retries.failed("a"), Duration::from_secs(1));
    }
}
