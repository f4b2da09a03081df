//! How a cache's watch comes back after it fails, so that its health is
//! always known: every failure is followed either by another failure or by
//! an event that shows the watch works again.
//!
//! - After any error the watch starts over with a fresh list (a 410 Gone
//!   aside, which kube-runtime's watcher already answers with one). A
//!   watch resumed where it failed gives no sign when it works again, so a
//!   cluster whose watch had failed would have had to be guessed well.
//! - The delay before each attempt grows while failures of one kind go on
//!   and starts over only after the watch delivered something (a listed
//!   object, the end of a list, a change). kube-runtime's watcher announces
//!   every list it starts (`Init`), and its backoff takes that for a
//!   success: a watch the server kept refusing was retried at the first
//!   delay forever, a couple of times a second.
//! - A server that cannot be reached is tried again soon (its return should
//!   be seen within seconds); a server that answers with a refusal (403 after
//!   lost RBAC, 404 for a missing CRD) is asked less and less often, up to
//!   [`WatchBackoff::refused_max`].
//! - A watch the server ends with `410 Gone` is listed again at once: its
//!   resource version was compacted away, a normal event. But a server
//!   (or a gateway) that ends every watch so would be listed and watched
//!   again and again without a pause, and a fresh list proves nothing
//!   then. So 410s count in a row until the watch delivers a change (or
//!   a minute passes without one): from the second in a row the watch
//!   backs off as after a refusal, the fresh lists notwithstanding, and
//!   from the [`GONE_DEGRADED`]th the cluster is shown degraded with the
//!   reason until a watch delivers.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

use crate::cache::WatchBackoff;
use multicluster_core::lock;

type Events<K> = Pin<Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>>;

/// A watch that starts over after every error: `start` makes a new one.
pub(crate) struct Restarting<K, F> {
    start: F,
    current: Option<Events<K>>,
}

impl<K, F> Restarting<K, F>
where
    F: FnMut() -> Events<K>,
{
    pub(crate) fn new(start: F) -> Self {
        Self {
            start,
            current: None,
        }
    }
}

impl<K, F> Stream for Restarting<K, F>
where
    F: FnMut() -> Events<K> + Unpin,
{
    type Item = Result<watcher::Event<K>, watcher::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let current = this.current.get_or_insert_with(&mut this.start);
        let next = current.poll_next_unpin(cx);
        if matches!(next, Poll::Ready(Some(Err(_)) | None)) {
            // Polled again only after the backoff's delay.
            this.current = None;
        }
        match next {
            // A watcher never ends by itself; if one did, start over.
            Poll::Ready(None) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => other,
        }
    }
}

/// Why the latest attempt failed, as far as retrying goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// No answer: try again soon.
    Unreachable,
    /// The server answered with an error: ask less and less often.
    Refused,
}

/// From how many `410 Gone` in a row a watch's failure is shown.
pub(crate) const GONE_DEGRADED: u32 = 3;

/// A 410 longer ago than this starts no run with the next one.
const GONE_APART: Duration = Duration::from_secs(60);

/// What the watch's stream told the backoff since it last asked.
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    /// The kind of the latest error.
    failed: Option<Kind>,
    /// Whether the watch delivered something since the last error.
    delivered: bool,
    /// The delay chosen after the latest error.
    delay: Option<Duration>,
    /// Watches ended with `410 Gone` in a row, and when the last was.
    gone: (u32, Option<Instant>),
}

/// What a watch has been through, shared by its stream, its backoff and
/// its informer (which logs the delay).
#[derive(Clone, Debug, Default)]
pub(crate) struct RetryState(Arc<Mutex<Outcomes>>);

impl RetryState {
    /// Notes what the stream yields, before the backoff sees it.
    pub(crate) fn observe<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) {
        let mut outcomes = lock(&self.0);
        match event {
            // The start of a list is no sign that the list works.
            Ok(watcher::Event::Init) => {}
            // A change the watch delivered: it works.
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                outcomes.delivered = true;
                outcomes.gone = (0, None);
            }
            Ok(_) => outcomes.delivered = true,
            Err(err) => {
                outcomes.failed = Some(if multicluster_core::health::is_unreachable(err) {
                    Kind::Unreachable
                } else {
                    Kind::Refused
                });
            }
        }
    }

    /// The delay chosen after the latest error.
    pub(crate) fn delay(&self) -> Option<Duration> {
        lock(&self.0).delay
    }

    /// The server ended a watch with `410 Gone`: how many in a row now.
    pub(crate) fn gone(&self) -> u32 {
        let mut outcomes = lock(&self.0);
        let now = Instant::now();
        let (in_a_row, last) = outcomes.gone;
        let in_a_row = match last {
            Some(last) if now.duration_since(last) <= GONE_APART => in_a_row.saturating_add(1),
            _ => 1,
        };
        outcomes.gone = (in_a_row, Some(now));
        in_a_row
    }

    /// How many watches in a row ended with `410 Gone` before one
    /// delivered a change.
    pub(crate) fn gone_in_a_row(&self) -> u32 {
        lock(&self.0).gone.0
    }
}

/// The backoff of one watch: a delay that grows per kind of failure, and
/// starts over only after the watch delivered something.
pub(crate) struct WatchRetry {
    state: RetryState,
    settings: WatchBackoff,
    /// The kind of failure the current delays belong to, whether they are
    /// a long outage's, and their sequence.
    current: Option<(Kind, bool, backon::ExponentialBackoff)>,
    /// Since when the server has been unreachable, without a delivery or
    /// another kind of failure between.
    unreachable_since: Option<tokio::time::Instant>,
}

impl WatchRetry {
    pub(crate) fn new(settings: WatchBackoff, state: RetryState) -> Self {
        Self {
            state,
            settings,
            current: None,
            unreachable_since: None,
        }
    }

    /// Delays for `kind`, doubling from its first to its longest, each
    /// stretched by up to as much again at random so that many clusters
    /// that failed at once do not retry in step. In a `long` outage they
    /// go on from the short-outage cap to the long outage's.
    fn delays(&self, kind: Kind, long: bool) -> backon::ExponentialBackoff {
        use backon::BackoffBuilder;
        let settings = &self.settings;
        let (initial, max) = match kind {
            Kind::Unreachable if long => (
                settings.max,
                settings
                    .long_outage
                    .cap(settings.long_outage.after, settings.max),
            ),
            Kind::Unreachable => (settings.initial, settings.max),
            Kind::Refused => (settings.refused_initial, settings.refused_max),
        };
        backon::ExponentialBuilder::default()
            .with_min_delay(initial)
            .with_max_delay(max.max(initial))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

impl Iterator for WatchRetry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let kind = lock(&self.state.0).failed.unwrap_or(Kind::Refused);
        let now = tokio::time::Instant::now();
        let long = match kind {
            Kind::Unreachable => {
                let since = *self.unreachable_since.get_or_insert(now);
                self.settings.long_outage.reached(now - since)
            }
            Kind::Refused => {
                self.unreachable_since = None;
                false
            }
        };
        // A failure of another kind starts its own sequence, and so does
        // an outage turning long.
        if self
            .current
            .as_ref()
            .is_none_or(|(current, was_long, _)| (*current, *was_long) != (kind, long))
        {
            self.current = Some((kind, long, self.delays(kind, long)));
        }
        let delay = self
            .current
            .as_mut()
            .and_then(|(_, _, delays)| delays.next())
            .unwrap_or(self.settings.refused_max);
        lock(&self.state.0).delay = Some(delay);
        Some(delay)
    }
}

impl Backoff for WatchRetry {
    /// Called by kube-runtime's `StreamBackoff` on every item that is not
    /// an error; only what the watch delivered counts.
    fn reset(&mut self) {
        let mut outcomes = lock(&self.state.0);
        // Lists between 410s prove nothing: the delays go on growing.
        if outcomes.gone.0 >= 2 {
            return;
        }
        if std::mem::take(&mut outcomes.delivered) {
            outcomes.failed = None;
            outcomes.delay = None;
            self.current = None;
            self.unreachable_since = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
        )))
    }

    fn refused_connection() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Service(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ))))
    }

    /// The delay before jitter, which adds at most as much again.
    fn within(delay: Duration, base_millis: u64) -> bool {
        let base = Duration::from_millis(base_millis);
        delay >= base && delay <= base * 2
    }

    #[test]
    fn a_list_that_starts_again_is_no_success() {
        let state = RetryState::default();
        let mut retry = WatchRetry::new(WatchBackoff::default(), state.clone());
        let mut delays = Vec::new();
        for _ in 0..7 {
            // What a refused watch yields over and over: Init, then the error.
            state.observe::<()>(&Ok(watcher::Event::Init));
            retry.reset();
            state.observe::<()>(&Err(forbidden()));
            delays.push(retry.next().expect("a delay"));
        }
        for (delay, base) in delays
            .iter()
            .zip([1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000])
        {
            assert!(within(*delay, base), "{delays:?}");
        }
        assert_eq!(state.delay(), delays.last().copied());

        // Something delivered: the next failure starts from the beginning.
        state.observe::<()>(&Ok(watcher::Event::InitDone));
        retry.reset();
        state.observe::<()>(&Err(forbidden()));
        assert!(within(retry.next().expect("a delay"), 1_000));
    }

    fn gone() -> watcher::Error {
        watcher::Error::WatchError(Box::new(
            kube::core::Status::failure("too old resource version", "Expired").with_code(410),
        ))
    }

    #[test]
    fn watches_ended_with_gone_in_a_row_back_off_though_each_list_delivers() {
        let state = RetryState::default();
        let mut retry = WatchRetry::new(WatchBackoff::default(), state.clone());
        // The first is a normal expiry: let through at once elsewhere.
        assert_eq!(state.gone(), 1);
        let mut delays = Vec::new();
        for in_a_row in 2..=6 {
            // Listed again fine, then ended with 410 again.
            state.observe::<()>(&Ok(watcher::Event::Init));
            state.observe::<()>(&Ok(watcher::Event::InitDone));
            retry.reset();
            assert_eq!(state.gone(), in_a_row);
            state.observe::<()>(&Err(gone()));
            delays.push(retry.next().expect("a delay"));
        }
        for (delay, base) in delays.iter().zip([1_000, 2_000, 4_000, 8_000, 16_000]) {
            assert!(within(*delay, base), "{delays:?}");
        }
        assert!(state.gone_in_a_row() >= GONE_DEGRADED);
        // A change the watch delivered ends the run and the delays.
        state.observe::<()>(&Ok(watcher::Event::Apply(())));
        retry.reset();
        assert_eq!(state.gone_in_a_row(), 0);
        assert_eq!(state.gone(), 1);
        state.observe::<()>(&Err(gone()));
        assert!(within(retry.next().expect("a delay"), 1_000));
    }

    /// The default schedule of a member gone for good, on a paused clock:
    /// its short-outage delays for ten minutes, then longer ones up to
    /// five minutes (before the random part).
    #[tokio::test(start_paused = true)]
    async fn a_member_unreachable_for_ten_minutes_is_tried_every_few_minutes() {
        let state = RetryState::default();
        let member = WatchBackoff::default().max(crate::cache::MEMBER_UNREACHABLE_MAX);
        let mut retry = WatchRetry::new(member, state.clone());
        let start = tokio::time::Instant::now();
        let mut attempts = Vec::new();
        while start.elapsed() < Duration::from_secs(3600) {
            state.observe::<()>(&Err(refused_connection()));
            let delay = retry.next().expect("a delay");
            attempts.push((start.elapsed(), delay));
            tokio::time::advance(delay).await;
        }
        let before: Vec<_> = attempts
            .iter()
            .filter(|(at, _)| *at < Duration::from_secs(600))
            .collect();
        assert!(
            before
                .iter()
                .all(|(_, delay)| *delay <= Duration::from_secs(16)),
            "the short-outage cap first: {before:?}"
        );
        assert!(before.len() > 40, "about six a minute: {}", before.len());
        let late: Vec<_> = attempts
            .iter()
            .filter(|(at, _)| *at >= Duration::from_secs(1200))
            .collect();
        assert!(
            late.iter()
                .all(|(_, delay)| *delay >= Duration::from_secs(300)
                    && *delay <= Duration::from_secs(600)),
            "every 5 to 10 minutes once long: {late:?}"
        );
        let in_last_half_hour = attempts
            .iter()
            .filter(|(at, _)| *at >= Duration::from_secs(1800))
            .count();
        assert!(
            (3..=7).contains(&in_last_half_hour),
            "a handful in a half hour: {in_last_half_hour}"
        );
        // Back, and down again: short delays from the start.
        state.observe::<()>(&Ok(watcher::Event::InitDone));
        retry.reset();
        state.observe::<()>(&Err(refused_connection()));
        assert!(within(retry.next().expect("a delay"), 250));
    }

    #[test]
    fn an_unreachable_server_is_tried_again_soon_then_less_often_and_kinds_keep_their_own_delays() {
        let state = RetryState::default();
        let mut retry = WatchRetry::new(WatchBackoff::default(), state.clone());
        let mut next = |err: watcher::Error| {
            state.observe::<()>(&Err(err));
            retry.next().expect("a delay")
        };
        assert!(within(next(refused_connection()), 250));
        assert!(within(next(refused_connection()), 500));
        assert!(within(next(refused_connection()), 1_000));
        assert!(within(next(refused_connection()), 1_000), "at most 1 s");
        // A member's: up to 8 s.
        let state = RetryState::default();
        let member = WatchBackoff::default().max(crate::cache::MEMBER_UNREACHABLE_MAX);
        let mut retry = WatchRetry::new(member, state.clone());
        let mut next = |err: watcher::Error| {
            state.observe::<()>(&Err(err));
            retry.next().expect("a delay")
        };
        for expected in [250, 500, 1_000, 2_000, 4_000, 8_000, 8_000] {
            assert!(
                within(next(refused_connection()), expected),
                "{expected} ms"
            );
        }
        assert!(within(next(forbidden()), 1_000), "a refusal starts its own");
        assert!(within(next(forbidden()), 2_000));
    }
}
