//! How a cluster is doing, as the requests of its client and the watches of
//! its cache see it: the truth behind a cluster's state on `/clusters`.
//!
//! - A watch that the server refuses (403 after lost RBAC, 404 for a CRD
//!   that is not installed) makes the cluster [`Health::Degraded`] from its
//!   first refusal until the watch delivers again: the server is there, but
//!   part of the work cannot be done. Every failed watch starts over with a
//!   list, so its return always shows (see the cache's retry notes).
//! - A request the server refuses (403) makes it degraded too, until a
//!   request of the same verb, resource and namespace succeeds, or
//!   `REFUSAL_MEMORY` (5 min) after the last refusal if none is tried.
//! - A credential that does not work (a 401, a credential plugin that
//!   fails) makes it degraded until any request succeeds.
//! - A watch or a request that cannot reach the server (connection refused
//!   or reset, TLS failure, no answer within the request deadline) makes it
//!   [`Health::Unreachable`] until the server answers again.
//!
//! Reasons are built from redacted error text ([`crate::redact`]): they can
//! be logged and served.
//!
//! Requests are watched by a layer that clients built from kubeconfigs
//! carry (`multicluster_runtime::client::ClientOptions`); it also gives every request
//! that is not long-running (watches, log follows, exec sessions are) a
//! deadline. Clusters with clients of their own are judged by their watches.

pub mod repeats;
mod requests;

use std::error::Error as StdError;

use tokio::time::Instant;

use crate::redact::Redacted;

#[doc(hidden)]
pub use requests::{REFUSAL_MEMORY, RequestKind, Requests};

/// A request that is not long-running got no answer within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct RequestTimedOut(pub std::time::Duration);

/// A deadline of its own for one request (an extension of the request),
/// in place of the client's: the manager's liveness probes take 15 s, as
/// an HTTP/2 ping may.
#[derive(Clone, Copy, Debug)]
#[doc(hidden)]
pub struct RequestDeadline(pub std::time::Duration);

/// How a cluster is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Its watches and requests work.
    Healthy,
    /// The server answers, but refuses some watches or requests, or the
    /// credential does not work (the reason says which, e.g. `403
    /// Forbidden: cannot patch configmaps in namespace "default"`).
    Degraded(Redacted),
    /// The server cannot be reached or does not answer in time.
    Unreachable(Redacted),
}

/// A failure that lasts: what went wrong, since when, and whether it means
/// the server cannot be reached.
#[derive(Clone, Debug)]
#[doc(hidden)]
pub struct Failure {
    /// What went wrong.
    pub reason: Redacted,
    /// Whether it means the server cannot be reached.
    pub unreachable: bool,
    /// When the first error of this failure was seen.
    pub since: Instant,
    /// When the latest was.
    pub last: Instant,
    /// How many errors in a row it has been.
    pub attempts: u32,
    /// When the failing watch is tried again, if it is a watch (requests
    /// are tried again when their caller sends them).
    pub retry_at: Option<Instant>,
}

impl Failure {
    /// `reason` as a failure starting now, or continuing `before` if that
    /// was already failing (a failure's age is that of the first error).
    pub fn continuing(before: Option<&Failure>, reason: Redacted, unreachable: bool) -> Self {
        let now = Instant::now();
        Self {
            reason,
            unreachable,
            since: before.map_or(now, |before| before.since),
            last: now,
            attempts: before.map_or(1, |before| before.attempts.saturating_add(1)),
            retry_at: None,
        }
    }

    /// The same failure, its watch tried again after `delay`.
    pub fn retried_in(self, delay: Option<std::time::Duration>) -> Self {
        Self {
            retry_at: delay.map(|delay| self.last + delay),
            ..self
        }
    }

    /// What the failure makes of the cluster's health.
    pub fn health(&self) -> Health {
        if self.unreachable {
            Health::Unreachable(self.reason.clone())
        } else {
            Health::Degraded(self.reason.clone())
        }
    }
}

/// Whether an error means the server could not be reached or did not
/// answer (rather than answered with an error).
#[doc(hidden)]
pub fn is_unreachable(err: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = current {
        if err.is::<RequestTimedOut>() {
            return true;
        }
        if let Some(kube_error) = err.downcast_ref::<kube::Error>() {
            match kube_error {
                kube::Error::Api(_) | kube::Error::Auth(_) => return false,
                kube::Error::HyperError(_) => return true,
                _ => {}
            }
        }
        if err.is::<kube::client::AuthError>() {
            return false;
        }
        if err.is::<hyper::Error>()
            || err.is::<hyper_util::client::legacy::Error>()
            || err.is::<std::io::Error>()
        {
            return true;
        }
        current = err.source();
    }
    false
}

/// Whether something is failing, readable without the lock that guards the
/// failure itself. Written under that lock; a reader that races a write
/// sees the change at its next look.
#[derive(Debug, Default)]
#[doc(hidden)]
pub struct FailingFlag(std::sync::atomic::AtomicBool);

/// How many times any flag in this process has changed: a walk over every
/// cluster that found them all well need not be repeated until it moves.
static FLAG_CHANGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl FailingFlag {
    /// Whether it is failing.
    pub fn get(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Says whether it is failing.
    pub fn set(&self, failing: bool) {
        if self.0.swap(failing, std::sync::atomic::Ordering::AcqRel) != failing {
            FLAG_CHANGES.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// A number that moves whenever a request or watch of any cluster starts or
/// stops failing.
#[doc(hidden)]
pub fn failure_changes() -> u64 {
    FLAG_CHANGES.load(std::sync::atomic::Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timeouts_and_transport_errors_mean_unreachable_answers_do_not() {
        assert!(is_unreachable(&RequestTimedOut(Duration::from_secs(1))));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(is_unreachable(&refused));
        let forbidden = kube::Error::Api(Box::new(kube::core::Status::failure(
            "forbidden",
            "Forbidden",
        )));
        assert!(!is_unreachable(&forbidden));
        let plugin = kube::Error::Auth(kube::client::AuthError::AuthExec("failed".into()));
        assert!(!is_unreachable(&plugin));
    }
}
