//! Small synchronisation helpers shared across the crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, carrying on if a holder panicked: a panic inside one of
/// the crate's short critical sections is reported where it happened, and
/// the fleet keeps working with the data as it was left.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A child of `parent` that is also cancelled when `also` is: work that
/// ends with its cluster's lifetime or with the hold it was started under
/// (a fence, the leadership), whichever ends first.
pub(crate) fn child_until(
    parent: &tokio_util::sync::CancellationToken,
    also: &tokio_util::sync::CancellationToken,
) -> tokio_util::sync::CancellationToken {
    let child = parent.child_token();
    if also.is_cancelled() {
        // Already over: no work may start under it, not even briefly.
        child.cancel();
        return child;
    }
    let (also, stop) = (also.clone(), child.clone());
    tokio::spawn(async move {
        tokio::select! {
            () = also.cancelled() => stop.cancel(),
            () = stop.cancelled() => {}
        }
    });
    child
}
