//! Connection attempts are paced process-wide, so that our own burst does
//! not look like a member's failure. Engaging thousands of clusters at
//! once started thousands of TLS handshakes together; on a loaded machine
//! they shared the CPU so thinly that hundreds ran past their connect
//! deadline and were shown `unreachable`, though every member was well.
//!
//! An attempt waits for a turn before it starts, and its deadline runs
//! from then: it measures the member, not the queue. A turn is given back
//! when the attempt ends or after [`HOLD`], whichever comes first, so a
//! member that never answers (blackholed, a TLS server that hangs) holds
//! one only briefly and cannot keep the others waiting: at worst
//! [`TURNS`] attempts start every [`HOLD`].

use std::time::Duration;

use tokio::sync::Semaphore;

/// How many connection attempts may be under way at once in their first
/// [`HOLD`]: enough to keep a remote fleet's round trips overlapping, few
/// enough that their handshakes each get a useful share of two cores.
const TURNS: usize = 256;
/// How long an attempt keeps its turn at most.
const HOLD: Duration = Duration::from_secs(1);

/// Turns for connection attempts.
#[derive(Debug)]
pub(crate) struct Pace {
    turns: Semaphore,
    hold: Duration,
}

impl Pace {
    /// `turns` attempts at once, each keeping its turn at most `hold`.
    pub(crate) const fn new(turns: usize, hold: Duration) -> Self {
        Self {
            turns: Semaphore::const_new(turns),
            hold,
        }
    }

    /// The process's pace, which every member client's attempts share.
    pub(crate) fn process() -> &'static Self {
        static PROCESS: Pace = Pace::new(TURNS, HOLD);
        &PROCESS
    }

    /// Runs the attempt `start` makes once a turn is free; its future (and
    /// any deadline in it) is made only then.
    pub(crate) async fn run<F: Future>(&self, start: impl FnOnce() -> F) -> F::Output {
        // The semaphore is never closed: a failed acquire only means no
        // turn to give back.
        let turn = self.turns.acquire().await.ok();
        let attempt = start();
        tokio::pin!(attempt);
        tokio::select! {
            done = &mut attempt => return done,
            () = tokio::time::sleep(self.hold) => drop(turn),
        }
        attempt.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::time::Instant;

    /// A member that never answers keeps its turn for `hold` only; the
    /// attempt queued behind it gets its whole deadline from its start.
    #[tokio::test(start_paused = true)]
    async fn a_stuck_attempt_holds_its_turn_briefly_and_the_next_gets_its_whole_deadline() {
        let pace = Arc::new(Pace::new(1, Duration::from_secs(1)));
        let deadline = Duration::from_secs(2);
        let started = Instant::now();
        let stuck = tokio::spawn({
            let pace = pace.clone();
            async move {
                pace.run(|| tokio::time::timeout(deadline, std::future::pending::<()>()))
                    .await
            }
        });
        tokio::task::yield_now().await;
        // 1.5 s to connect: within its deadline counted from its turn (at
        // 1 s), past it counted from the call.
        let slow = pace
            .run(|| tokio::time::timeout(deadline, tokio::time::sleep(Duration::from_millis(1500))))
            .await;
        assert!(slow.is_ok(), "the queue counted against its deadline");
        assert_eq!(started.elapsed(), Duration::from_millis(2500));
        assert!(
            stuck.await.expect("task").is_err(),
            "the stuck one timed out"
        );
    }

    /// Attempts that end give their turn back at once.
    #[tokio::test(start_paused = true)]
    async fn a_finished_attempt_gives_its_turn_back_at_once() {
        let pace = Pace::new(1, Duration::from_secs(60));
        let started = Instant::now();
        for _ in 0..3 {
            pace.run(|| tokio::time::sleep(Duration::from_millis(10)))
                .await;
        }
        assert_eq!(started.elapsed(), Duration::from_millis(30));
    }
}
