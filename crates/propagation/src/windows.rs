//! Maintenance windows: when a member may be given a new revision. A
//! window is a cron schedule of starts and a duration, in UTC or a named
//! zone, as Argo CD's sync windows are written; an allow window opens the
//! member for its duration, a deny window (a freeze) closes it. Windows
//! come from two places, and a member changes only when both allow it:
//! the rollout's own ([`Rollout::window`](crate::Rollout::window)), and
//! the member's, in [`WINDOWS_ANNOTATION`] on its inventory object.
//!
//! Within one list, a deny window that is open wins; otherwise a list with
//! allow windows allows only while one of them is open, and a list without
//! any allows at all times.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp, tz::TimeZone};
use multicluster_runtime::Cluster;
use serde::Deserialize;

/// Annotation on a member's inventory object (its kubeconfig Secret, its
/// ClusterProfile, ...): the member's maintenance windows, as a JSON list
/// of `{"kind": "allow" | "deny", "schedule": "<cron>", "duration":
/// "<duration>", "timeZone": "<IANA zone>"}` (`timeZone` optional, UTC by
/// default; the duration as `4h`, `1h30m` or `PT4H`; the schedule's five
/// fields, or six with seconds first). Every propagation honours it. A
/// value that cannot be read keeps the member from any new revision until
/// it is fixed, and its status says why: a window meant to hold a member
/// back never lets it go by a typo.
pub const WINDOWS_ANNOTATION: &str = "propagation.mcr.sigs.k8s.io/maintenance-windows";

/// How far ahead the next opening is looked for: a window list that
/// opens later than this is reported as not opening within a year.
const HORIZON: SignedDuration = SignedDuration::from_hours(366 * 24);

/// A maintenance window: a cron schedule of starts, each open for a
/// duration, in a time zone (UTC unless [`in_zone`](Self::in_zone)).
#[derive(Clone, Debug)]
pub struct Window {
    allows: bool,
    schedule: croner::Cron,
    duration: SignedDuration,
    zone: TimeZone,
}

/// A window that cannot be made: which part was wrong, and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WindowError(String);

impl Window {
    /// A window in which members may change: from each start of
    /// `schedule` (cron: five fields, or six with seconds first), for
    /// `duration`.
    pub fn allow(schedule: &str, duration: Duration) -> Result<Self, WindowError> {
        Self::new(true, schedule, duration)
    }

    /// A window in which no member changes (a freeze), whatever the allow
    /// windows say.
    pub fn deny(schedule: &str, duration: Duration) -> Result<Self, WindowError> {
        Self::new(false, schedule, duration)
    }

    fn new(allows: bool, schedule: &str, duration: Duration) -> Result<Self, WindowError> {
        let duration = SignedDuration::try_from(duration)
            .ok()
            .filter(|duration| duration.is_positive())
            .ok_or_else(|| {
                WindowError(format!(
                    "window {schedule:?}: the duration must be more than zero"
                ))
            })?;
        let schedule = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(schedule)
            .map_err(|error| WindowError(format!("window schedule {schedule:?}: {error}")))?;
        Ok(Self {
            allows,
            schedule,
            duration,
            zone: TimeZone::UTC,
        })
    }

    /// The schedule read in the IANA time zone `zone` (`Europe/Berlin`):
    /// a window at 02:00 opens at 02:00 there, summer and winter. The
    /// zone comes from the system's zoneinfo (`/usr/share/zoneinfo`); an
    /// image without one refuses every zone but UTC, unless the binary
    /// enables jiff's `tzdb-bundle-always`.
    pub fn in_zone(mut self, zone: &str) -> Result<Self, WindowError> {
        // A name only, never a path: the name may come from a cluster
        // object (a member's annotation), and must not reach a file
        // outside the zone database.
        let is_name = !zone.is_empty()
            && zone
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '+'))
            && zone.split('/').all(|part| !part.is_empty());
        if !is_name {
            return Err(WindowError(format!(
                "time zone {zone:?}: expected an IANA name such as \"Europe/Berlin\""
            )));
        }
        self.zone = TimeZone::get(zone)
            .map_err(|error| WindowError(format!("time zone {zone:?}: {error}")))?;
        Ok(self)
    }

    /// Whether one of its occurrences is open at `at`.
    fn is_open_at(&self, at: Timestamp) -> bool {
        self.open_until(at).is_some()
    }

    /// The end of the occurrence open at `at`, if one is.
    fn open_until(&self, at: Timestamp) -> Option<Timestamp> {
        let start = self
            .schedule
            .find_previous_occurrence(&at.to_zoned(self.zone.clone()), true)
            .ok()?;
        let end = start.timestamp().checked_add(self.duration).ok()?;
        (at < end).then_some(end)
    }

    /// Its first start after `at`.
    fn next_start_after(&self, at: Timestamp) -> Option<Timestamp> {
        self.schedule
            .find_next_occurrence(&at.to_zoned(self.zone.clone()), false)
            .ok()
            .map(|start| start.timestamp())
    }
}

/// Whether the windows of one list allow a change at `at`.
fn allows(windows: &[Window], at: Timestamp) -> bool {
    if windows
        .iter()
        .any(|window| !window.allows && window.is_open_at(at))
    {
        return false;
    }
    let mut allowing = windows.iter().filter(|window| window.allows).peekable();
    allowing.peek().is_none() || allowing.any(|window| window.is_open_at(at))
}

/// When the lists all allow a change, from `now` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opening {
    /// Now.
    Now,
    /// Not before this instant.
    At(Timestamp),
    /// Not within a year.
    NotWithinAYear,
}

/// The earliest instant after `at` at which `windows`, which allow no
/// change at `at`, may allow one: when the last of the deny windows open
/// at `at` ends, or with none open, the next start of an allow window.
/// Nothing before it can allow a change, so nothing is stepped through.
fn earliest_allowing(windows: &[Window], at: Timestamp) -> Option<Timestamp> {
    let denied_until = windows
        .iter()
        .filter(|window| !window.allows)
        .filter_map(|window| window.open_until(at))
        .max();
    denied_until.or_else(|| {
        windows
            .iter()
            .filter(|window| window.allows)
            .filter_map(|window| window.next_start_after(at))
            .min()
    })
}

/// When every list of `lists` allows a change, from `now` on. Each turn
/// jumps to the earliest instant every list that does not allow yet may
/// allow, so a schedule starting every second under a freeze of months
/// costs a few turns, not one per start.
pub(crate) fn opening(lists: &[&[Window]], now: Timestamp) -> Opening {
    let mut at = now;
    for _ in 0..1_000 {
        let mut next = None;
        for windows in lists.iter().filter(|windows| !allows(windows, at)) {
            let Some(earliest) = earliest_allowing(windows, at) else {
                return Opening::NotWithinAYear;
            };
            next = next.max(Some(earliest));
        }
        let Some(next) = next else {
            return if at == now {
                Opening::Now
            } else {
                Opening::At(at)
            };
        };
        if next.duration_since(now) > HORIZON {
            break;
        }
        at = next;
    }
    Opening::NotWithinAYear
}

/// Why a member may not be given a new revision now, and when it may.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Closed {
    /// For the member's status: which windows, and when they open.
    pub(crate) reason: String,
    /// When to look again: when they open (none if not within a year or
    /// if the member's windows cannot be read: a change of its annotation
    /// or of the rollout tells).
    pub(crate) opens: Option<Timestamp>,
}

/// Whether `member` is outside the windows of `rollout_windows` or of its
/// own annotation at `now`.
pub(crate) fn closed(
    rollout_windows: &[Window],
    member: &Cluster,
    now: Timestamp,
) -> Option<Closed> {
    let inventory = member.inventory();
    let own = match inventory.annotations.get(WINDOWS_ANNOTATION) {
        Some(text) => match from_annotation(text) {
            Ok(windows) => windows,
            Err(error) => {
                return Some(Closed {
                    reason: format!(
                        "its maintenance windows ({WINDOWS_ANNOTATION}) cannot be read: {error}; it gets no new revision until they are fixed"
                    ),
                    opens: None,
                });
            }
        },
        None => Vec::new(),
    };
    let whose = match (own.is_empty(), rollout_windows.is_empty()) {
        (true, true) => return None,
        (false, true) => "its maintenance windows",
        (true, false) => "the rollout's maintenance windows",
        (false, false) => "its or the rollout's maintenance windows",
    };
    let (reason, opens) = match opening(&[rollout_windows, &own], now) {
        Opening::Now => return None,
        Opening::At(at) => (format!("outside {whose}; opens at {at}"), Some(at)),
        Opening::NotWithinAYear => (
            format!("outside {whose}; they open not within a year"),
            None,
        ),
    };
    Some(Closed { reason, opens })
}

/// One window as the annotation writes it (Argo CD's field names).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Written {
    kind: String,
    schedule: String,
    duration: String,
    #[serde(default)]
    time_zone: Option<String>,
}

/// The windows [`WINDOWS_ANNOTATION`] holds.
pub(crate) fn from_annotation(text: &str) -> Result<Vec<Window>, WindowError> {
    let written: Vec<Written> = serde_json::from_str(text).map_err(|error| {
        WindowError(format!(
            "expected a JSON list of {{\"kind\", \"schedule\", \"duration\", \"timeZone\"}}: {error}"
        ))
    })?;
    written
        .into_iter()
        .enumerate()
        .map(|(at, written)| {
            let what = |error: WindowError| WindowError(format!("window {at}: {}", error.0));
            let duration: SignedDuration = written.duration.parse().map_err(|error| {
                WindowError(format!(
                    "window {at}: duration {:?}: {error}",
                    written.duration
                ))
            })?;
            let duration = Duration::try_from(duration).unwrap_or_default();
            let window = match written.kind.as_str() {
                "allow" => Window::allow(&written.schedule, duration),
                "deny" => Window::deny(&written.schedule, duration),
                other => Err(WindowError(format!(
                    "kind {other:?}: expected \"allow\" or \"deny\""
                ))),
            }
            .map_err(what)?;
            match &written.time_zone {
                Some(zone) => window.in_zone(zone).map_err(what),
                None => Ok(window),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn hours(hours: u64) -> Duration {
        Duration::from_secs(hours * 3600)
    }

    #[test]
    fn an_allow_window_opens_at_its_next_start() {
        // Saturdays 02:00 for four hours, UTC. 2026-12-03 is a Thursday.
        let nights = [Window::allow("0 2 * * SAT", hours(4)).unwrap()];
        assert_eq!(
            opening(&[&nights], at("2026-12-03T10:00:00Z")),
            Opening::At(at("2026-12-05T02:00:00Z"))
        );
        assert_eq!(
            opening(&[&nights], at("2026-12-05T05:59:59Z")),
            Opening::Now
        );
        assert_eq!(
            opening(&[&nights], at("2026-12-05T06:00:00Z")),
            Opening::At(at("2026-12-12T02:00:00Z"))
        );
    }

    #[test]
    fn a_named_zone_moves_the_window_with_summer_time() {
        let berlin = [Window::allow("0 2 * * *", hours(1))
            .unwrap()
            .in_zone("Europe/Berlin")
            .unwrap()];
        // Winter: UTC+1; summer: UTC+2.
        assert_eq!(
            opening(&[&berlin], at("2026-12-03T10:00:00Z")),
            Opening::At(at("2026-12-04T01:00:00Z"))
        );
        assert_eq!(
            opening(&[&berlin], at("2026-07-01T10:00:00Z")),
            Opening::At(at("2026-07-02T00:00:00Z"))
        );
    }

    #[test]
    fn a_deny_window_wins_and_opens_when_it_ends() {
        // Open every day 00:00-23:00, frozen from 2026-12-20 for ten days.
        let windows = [
            Window::allow("0 0 * * *", hours(23)).unwrap(),
            Window::deny("0 0 20 12 *", hours(240)).unwrap(),
        ];
        assert_eq!(
            opening(&[&windows], at("2026-12-19T12:00:00Z")),
            Opening::Now
        );
        assert_eq!(
            opening(&[&windows], at("2026-12-21T12:00:00Z")),
            Opening::At(at("2026-12-30T00:00:00Z"))
        );
        // Deny windows alone close only while they are open.
        let freeze = [Window::deny("0 0 20 12 *", hours(240)).unwrap()];
        assert_eq!(
            opening(&[&freeze], at("2026-12-19T12:00:00Z")),
            Opening::Now
        );
    }

    #[test]
    fn both_lists_must_allow() {
        // The rollout's: weekends; the member's: 02:00-04:00 every day.
        let weekends = [Window::allow("0 0 * * SAT", hours(48)).unwrap()];
        let nights = [Window::allow("0 2 * * *", hours(2)).unwrap()];
        assert_eq!(
            opening(&[&weekends, &nights], at("2026-12-03T10:00:00Z")),
            Opening::At(at("2026-12-05T02:00:00Z"))
        );
        assert_eq!(
            opening(&[&weekends, &nights], at("2026-12-05T03:00:00Z")),
            Opening::Now
        );
    }

    #[test]
    fn seconds_schedules_open_windows_a_few_seconds_wide() {
        let every_twenty = [Window::allow("*/20 * * * * *", Duration::from_secs(5)).unwrap()];
        assert_eq!(
            opening(&[&every_twenty], at("2026-12-03T10:00:07Z")),
            Opening::At(at("2026-12-03T10:00:20Z"))
        );
        assert_eq!(
            opening(&[&every_twenty], at("2026-12-03T10:00:24.5Z")),
            Opening::Now
        );
    }

    #[test]
    fn a_window_every_second_under_a_long_freeze_opens_when_the_freeze_ends() {
        // Nine months frozen from 2026-01-01, with an allow window starting
        // every second: the opening is found without stepping through them.
        let windows = [
            Window::allow("* * * * * *", Duration::from_secs(1)).unwrap(),
            Window::deny("0 0 0 1 1 *", hours(270 * 24)).unwrap(),
        ];
        assert_eq!(
            opening(&[&windows], at("2026-02-01T00:00:00Z")),
            Opening::At(at("2026-09-28T00:00:00Z"))
        );
    }

    #[test]
    fn a_zone_is_a_name_never_a_path() {
        for zone in [
            "../../etc/passwd",
            "/etc/localtime",
            "Europe/../UTC",
            "",
            "Europe//Berlin",
        ] {
            let error = Window::allow("0 2 * * *", hours(1))
                .unwrap()
                .in_zone(zone)
                .unwrap_err()
                .to_string();
            assert!(error.contains("expected an IANA name"), "{zone:?}: {error}");
        }
    }

    #[test]
    fn a_window_that_never_opens_is_reported_as_such() {
        // February 30th.
        let never = [Window::allow("0 0 30 2 *", hours(1)).unwrap()];
        assert_eq!(
            opening(&[&never], at("2026-12-03T10:00:00Z")),
            Opening::NotWithinAYear
        );
    }

    #[test]
    fn the_annotation_is_read_and_its_faults_are_named() {
        let windows = from_annotation(
            r#"[{"kind":"allow","schedule":"0 2 * * SAT","duration":"4h","timeZone":"Europe/Berlin"},
                {"kind":"deny","schedule":"0 0 24 12 *","duration":"PT48H"}]"#,
        )
        .unwrap();
        assert_eq!(windows.len(), 2);
        for (text, named) in [
            ("not json", "expected a JSON list"),
            (
                r#"[{"kind":"allow","schedule":"0 2 * *","duration":"4h"}]"#,
                "window 0: window schedule \"0 2 * *\"",
            ),
            (
                r#"[{"kind":"allow","schedule":"0 2 * * *","duration":"four hours"}]"#,
                "window 0: duration \"four hours\"",
            ),
            (
                r#"[{"kind":"allow","schedule":"0 2 * * *","duration":"0s"}]"#,
                "the duration must be more than zero",
            ),
            (
                r#"[{"kind":"maybe","schedule":"0 2 * * *","duration":"1h"}]"#,
                "kind \"maybe\"",
            ),
            (
                r#"[{"kind":"allow","schedule":"0 2 * * *","duration":"1h","timeZone":"Mars/Olympus"}]"#,
                "time zone \"Mars/Olympus\"",
            ),
            (
                r#"[{"kind":"allow","schedule":"0 2 * * *","duration":"1h","zone":"UTC"}]"#,
                "unknown field `zone`",
            ),
        ] {
            let error = from_annotation(text).unwrap_err().to_string();
            assert!(error.contains(named), "{text}: {error}");
        }
    }
}
