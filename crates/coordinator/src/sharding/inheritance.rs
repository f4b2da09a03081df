//! What a replica leaves to heirs and learns of what it inherits: the
//! state `heirs` works with (its logic is there).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::mirror::Mirror;
use crate::lock;
use multicluster_runtime::health::repeats::{Repeats, Telling};
use multicluster_runtime::redact::Redacted;

/// What this replica leaves to heirs when it stops, and what it learns
/// and finds of the fences it inherits.
#[derive(Default)]
pub(super) struct Inheritance {
    /// How many clusters this replica still worked on when it stopped
    /// (fences held with the peer Lease): its peer Lease then names heirs.
    left_behind: Arc<AtomicUsize>,
    /// Woken when the peer reads learn of heirs named: what this replica
    /// inherits is listed at once, not after the look under way.
    news: Arc<Notify>,
    /// The fences of the namespace as a watch shows them (fences held with
    /// the peer Lease): what an heir inherits, without a list.
    mirror: Arc<Mirror>,
    /// How many lists of inherited fences this replica needed (none while
    /// its mirror shows them).
    lists: AtomicUsize,
    /// Lists of inherited fences that failed in a row, told once.
    list_failures: Mutex<Repeats>,
}

impl Inheritance {
    /// Says how many clusters this replica still worked on when it
    /// stopped.
    pub(super) fn leave_behind(&self, clusters: usize) {
        self.left_behind.store(clusters, Ordering::Relaxed);
    }

    /// What [`Inheritance::leave_behind`] said, for the registry, which
    /// names heirs when it is not zero.
    pub(super) fn left_behind(&self) -> Arc<AtomicUsize> {
        self.left_behind.clone()
    }

    /// What the registry wakes when the peer reads learn of heirs named.
    pub(super) fn news(&self) -> Arc<Notify> {
        self.news.clone()
    }

    /// Completes when the peer reads learn of heirs named.
    pub(super) async fn until_news(&self) {
        self.news.notified().await;
    }

    /// The fences of the namespace as a watch shows them.
    pub(super) fn mirror(&self) -> &Arc<Mirror> {
        &self.mirror
    }

    /// Counts `count` lists of inherited fences.
    pub(super) fn listing(&self, count: usize) {
        self.lists.fetch_add(count, Ordering::Relaxed);
    }

    /// How many lists of inherited fences this replica needed.
    pub(super) fn lists(&self) -> usize {
        self.lists.load(Ordering::Relaxed)
    }

    /// A list of inherited fences succeeded: how many failed in a row
    /// before it, if any did.
    pub(super) fn listed(&self) -> Option<u64> {
        lock(&self.list_failures).succeeded()
    }

    /// A list of inherited fences failed for `reason`: how to tell it.
    pub(super) fn list_failed(&self, reason: &Redacted) -> Telling {
        lock(&self.list_failures).tell(reason, std::time::Instant::now())
    }
}
