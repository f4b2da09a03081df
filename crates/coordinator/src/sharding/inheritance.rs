//! What a replica leaves to heirs and learns of what it inherits: the
//! state `heirs` works with (its logic is there).

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::mirror::Mirror;
use multicluster_runtime::health::repeats::Repeats;

/// What this replica leaves to heirs when it stops, and what it learns
/// and finds of the fences it inherits.
#[derive(Default)]
pub(super) struct Inheritance {
    /// How many clusters this replica still worked on when it stopped
    /// (fences held with the peer Lease): its peer Lease then names heirs.
    pub(super) left_behind: Arc<AtomicUsize>,
    /// Woken when the peer reads learn of heirs named: what this replica
    /// inherits is listed at once, not after the look under way.
    pub(super) news: Arc<Notify>,
    /// The fences of the namespace as a watch shows them (fences held with
    /// the peer Lease): what an heir inherits, without a list.
    pub(super) mirror: Arc<Mirror>,
    /// How many lists of inherited fences this replica needed (none while
    /// its mirror shows them).
    pub(super) lists: AtomicUsize,
    /// Lists of inherited fences that failed in a row, told once.
    pub(super) list_failures: Mutex<Repeats>,
}
