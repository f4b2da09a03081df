//! Small synchronisation helpers shared across the crate.

use std::time::Duration;

use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

/// How long tasks aborted at a stop deadline get to unwind (an abort takes
/// effect at their next await point).
const ABORT_WAIT: Duration = Duration::from_secs(1);

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

/// Waits for every task of `tasks` to end until `deadline`; those still
/// running then are aborted, with a warning naming `what`, and given a
/// moment to unwind. The results of the tasks that ended by themselves, in
/// the order they ended: one bound for every stop, so that nothing a
/// shutdown waits for can hold it past its deadline.
pub(crate) async fn stop_within<T: 'static>(
    tasks: &mut JoinSet<T>,
    deadline: Instant,
    what: &str,
) -> Vec<Result<T, JoinError>> {
    let mut ended = Vec::new();
    let all_ended = tokio::time::timeout_at(deadline, async {
        while let Some(result) = tasks.join_next().await {
            ended.push(result);
        }
    })
    .await
    .is_ok();
    if !all_ended {
        tracing::warn!(
            left = tasks.len(),
            "{what} did not stop in time; dropping it"
        );
        tasks.abort_all();
        let _ = tokio::time::timeout(ABORT_WAIT, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
    }
    ended
}
