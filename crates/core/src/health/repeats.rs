//! A failure that goes on is told once, not at every retry: the first
//! time (or for another reason) as a warning, then a reminder every
//! [`REMIND_EVERY`] while it lasts, and a debug line for each retry in
//! between. A member that stays down, retried every second or two, would
//! otherwise be a warning each time.

use std::time::{Duration, Instant};

use crate::redact::Redacted;

/// How long the same failure may go on before it is told again at the
/// default level.
pub const REMIND_EVERY: Duration = Duration::from_secs(300);

/// How a failure is to be told.
#[derive(Debug, PartialEq, Eq)]
pub enum Telling {
    /// A warning: the first failure since the last success, or another
    /// reason.
    New,
    /// A warning that the same failure goes on, `attempts` times now.
    Reminder(u64),
    /// A debug line.
    Repeat(u64),
}

/// What was told of one thing's failures so far.
#[derive(Debug, Default)]
pub struct Repeats {
    /// The reason last warned about, when, and the failures since.
    current: Option<(Redacted, Instant, u64)>,
}

impl Repeats {
    /// How to tell a failure for `reason` seen at `now`.
    pub fn tell(&mut self, reason: &Redacted, now: Instant) -> Telling {
        match &mut self.current {
            Some((told, at, attempts)) if told == reason => {
                *attempts += 1;
                if now.duration_since(*at) >= REMIND_EVERY {
                    *at = now;
                    Telling::Reminder(*attempts)
                } else {
                    Telling::Repeat(*attempts)
                }
            }
            _ => {
                self.current = Some((reason.clone(), now, 1));
                Telling::New
            }
        }
    }

    /// It worked: the failures told since, if any.
    pub fn succeeded(&mut self) -> Option<u64> {
        self.current.take().map(|(_, _, attempts)| attempts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member that stays down is warned about once, reminded of every
    /// five minutes, and warned about again only for another reason or
    /// after a success.
    #[test]
    fn a_failure_that_goes_on_is_told_once_then_reminded_of() {
        let start = Instant::now();
        let down = Redacted::error(&std::io::Error::other("connection refused"));
        let other = Redacted::error(&std::io::Error::other("403 Forbidden"));
        let mut repeats = Repeats::default();
        assert_eq!(repeats.tell(&down, start), Telling::New);
        for attempt in 2..=100 {
            let at = start + Duration::from_secs(2 * attempt);
            assert_eq!(repeats.tell(&down, at), Telling::Repeat(attempt));
        }
        assert_eq!(
            repeats.tell(&down, start + REMIND_EVERY),
            Telling::Reminder(101)
        );
        assert_eq!(
            repeats.tell(&down, start + REMIND_EVERY + Duration::from_secs(1)),
            Telling::Repeat(102)
        );
        assert_eq!(repeats.tell(&other, start + REMIND_EVERY), Telling::New);
        assert_eq!(repeats.succeeded(), Some(1));
        assert_eq!(repeats.succeeded(), None);
        assert_eq!(repeats.tell(&other, start + REMIND_EVERY), Telling::New);
    }
}
