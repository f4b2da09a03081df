//! Admission webhooks for a fleet: one HTTPS server
//! answers the API servers of every engaged cluster, each request handled
//! with the cluster it came from.
//!
//! - [`WebhookServer`] serves [`Webhook`]s over TLS (rustls) with a
//!   certificate and key read from files and read again when they change
//!   (the next handshake uses the new pair), a deadline per request
//!   ([`WebhookServerOptions::request_deadline`], under the API server's
//!   default `timeoutSeconds` of 10), a limit on request bodies, and
//!   `/healthz`. It is a cluster-aware component: add it to the manager
//!   ([`Manager::add`](multicluster_runtime::Manager::add)) and it answers the clusters the
//!   manager engages with it.
//! - Each webhook answers each cluster at its own path ([`path`]):
//!   `/webhooks/<webhook>/clusters/<cluster>` for a member (the cluster's
//!   fleet name, `/` kept), `/webhooks/<webhook>/local` for the local
//!   cluster. A request for a cluster that is not engaged here (unknown,
//!   gone, or left to another replica) is answered `404`, a handler that
//!   fails `500`, one that runs past the deadline `503`, a body over the
//!   limit `413`, one that is not an AdmissionReview `400`: the API server
//!   then applies the webhook's
//!   `failurePolicy` (`Fail` refuses the request, `Ignore` admits it).
//! - [`Registration`] keeps the `Validating`/`MutatingWebhookConfiguration`
//!   of the webhooks in every engaged member, pointing at its path.
//!
//! Metrics: `mcr_webhook_requests_total{webhook,result}` (`allowed`,
//! `denied`, `error`, `timeout`, `bad-request`, `too-large`, `unknown-cluster`,
//! `unknown-webhook`) and `mcr_webhook_request_duration_seconds{webhook}`,
//! with a `cluster` label too when the manager's metrics have per-cluster
//! labels.

mod handler;
mod registration;
mod server;
mod tls;

pub use handler::{Webhook, WebhookKind};
pub use registration::{Registration, RegistrationOptions};
pub use server::{WebhookServer, WebhookServerOptions};

use multicluster_runtime::ClusterName;

/// Locks `mutex`, carrying on if a holder panicked (the data is as it was
/// left; the panic is reported where it happened).
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The path at which `webhook` answers `cluster`.
pub fn path(webhook: &str, cluster: &ClusterName) -> String {
    if cluster.is_local() {
        format!("/webhooks/{webhook}/local")
    } else {
        format!("/webhooks/{webhook}/clusters/{}", cluster.as_str())
    }
}

/// The webhook and cluster a path names, if it is one of [`path`]'s.
fn parse_path(path: &str) -> Option<(&str, ClusterName)> {
    let rest = path.strip_prefix("/webhooks/")?;
    let (webhook, rest) = rest.split_once('/')?;
    if webhook.is_empty() {
        return None;
    }
    if rest == "local" {
        return Some((webhook, ClusterName::local()));
    }
    let cluster = rest.strip_prefix("clusters/")?;
    (!cluster.is_empty()).then(|| (webhook, ClusterName::from(cluster)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip_with_slashes_in_cluster_names() {
        for cluster in [
            ClusterName::from("inventory/alpha"),
            ClusterName::from("east"),
            ClusterName::local(),
        ] {
            let path = path("owner-label", &cluster);
            assert_eq!(parse_path(&path), Some(("owner-label", cluster)));
        }
        for bad in [
            "/webhooks/",
            "/webhooks/x",
            "/webhooks//local",
            "/webhooks/x/clusters/",
            "/webhooks/x/other",
            "/healthz",
        ] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
    }
}
