//! The manager's HTTP endpoints: `/healthz` (the process is serving),
//! `/readyz` (the manager has started and the local cluster's caches have
//! synced: [`Manager::is_ready`]),
//! `/metrics` (Prometheus text format) and `/clusters` (each cluster's
//! state and history, one per line for people, or JSON for tools).

use std::convert::Infallible;

use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Manager;
use multicluster_core::ClusterState;

/// Serves the endpoints on `listener` until `shutdown` fires.
pub(super) async fn serve(listener: TcpListener, manager: Manager, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!(error = %err, "health endpoint: accept failed");
                continue;
            }
        };
        let manager = manager.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let manager = manager.clone();
                async move { Ok::<_, Infallible>(respond(&manager, &request)) }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = shutdown.cancelled() => {}
                result = connection => {
                    if let Err(err) = result {
                        tracing::debug!(error = %err, "health endpoint: connection ended");
                    }
                }
            }
        });
    }
}

fn respond(manager: &Manager, request: &http::Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match request.uri().path() {
        "/healthz" | "/livez" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" if manager.is_ready() => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" if manager.is_started() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the local cluster's caches have not synced yet (see /clusters)\n".to_string(),
        ),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "starting\n".to_string(),
        ),
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            manager.metrics().encode(),
        ),
        "/clusters" if wants_json(request) => {
            (StatusCode::OK, "application/json", cluster_json(manager))
        }
        "/clusters" => (StatusCode::OK, "text/plain", cluster_report(manager)),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    response
}

/// `/clusters` as text: per cluster a line of tab-separated columns: the
/// name, the state (with its reason), since when, and for a failing cluster
/// how many attempts failed and when the next is.
fn cluster_report(manager: &Manager) -> String {
    let working_on = worked_on_here(manager);
    manager
        .cluster_states()
        .into_iter()
        .map(|(name, status)| {
            let state = match &status.state {
                ClusterState::Syncing => match &status.waiting_for {
                    Some(what) => format!("syncing: {what}"),
                    None => "syncing".to_string(),
                },
                ClusterState::Ready => match &working_on {
                    Some(mine) if mine.contains(&name) => "ready, worked on here".to_string(),
                    Some(_) => "ready, left to another replica".to_string(),
                    None => "ready".to_string(),
                },
                ClusterState::Degraded(reason) => format!("degraded: {reason}"),
                ClusterState::Unreachable(reason) => format!("unreachable: {reason}"),
                ClusterState::Unusable(reason) => format!("unusable: {reason}"),
                ClusterState::Duplicate(of) => format!("duplicate of {of}"),
                // A state of a later multicluster-core, by its label.
                other => other.label().to_string(),
            };
            // Reasons are escaped already; names from files may hold anything.
            let shown = name.to_string();
            let name = multicluster_core::redact::escape_controls(&shown);
            let mut line = format!("{name}\t{state}\tsince {}", timestamp(status.since));
            if status.failed_attempts > 0 {
                line.push_str(&format!("\tfailed attempts: {}", status.failed_attempts));
            }
            if let Some(next) = status.next_attempt {
                line.push_str(&format!("\tnext attempt {}", timestamp(next)));
            }
            line.push('\n');
            line
        })
        .collect()
}

/// `/clusters` as JSON: `{"clusters": [...]}`, one object per cluster with
/// `name`, `state`, `reason` (redacted, as everywhere), `since`,
/// `failedAttempts`, `nextAttempt`, for a duplicate `duplicateOf` (the
/// name the cluster is held under) and, on a replica that works on part
/// of the fleet, `workedOnHere`.
fn cluster_json(manager: &Manager) -> String {
    let working_on = worked_on_here(manager);
    let clusters: Vec<_> = manager
        .cluster_states()
        .into_iter()
        .map(|(name, status)| {
            let reason = match &status.state {
                ClusterState::Degraded(reason)
                | ClusterState::Unreachable(reason)
                | ClusterState::Unusable(reason) => Some(reason.as_str()),
                ClusterState::Syncing => status.waiting_for.as_ref().map(|what| what.as_str()),
                _ => None,
            };
            let mut cluster = serde_json::json!({
                "name": name.to_string(),
                "state": status.state.label(),
                "reason": reason,
                "since": timestamp(status.since),
                "failedAttempts": status.failed_attempts,
                "nextAttempt": status.next_attempt.map(timestamp),
            });
            if let ClusterState::Duplicate(of) = &status.state {
                cluster["duplicateOf"] = of.to_string().into();
            }
            if let Some(mine) = &working_on {
                cluster["workedOnHere"] = mine.contains(&name).into();
            }
            cluster
        })
        .collect();
    let mut body = serde_json::json!({ "clusters": clusters }).to_string();
    body.push('\n');
    body
}

/// The clusters this replica works on, when its coordinator does not work
/// on all of them (a set: a fleet's report asks it once per cluster).
fn worked_on_here(
    manager: &Manager,
) -> Option<std::collections::BTreeSet<multicluster_core::ClusterName>> {
    manager
        .coordinator()
        .working_on()
        .map(|names| names.into_iter().collect())
}

/// Whether the client asked for JSON (`?format=json`, or an `Accept`
/// header naming `application/json`).
fn wants_json(request: &http::Request<Incoming>) -> bool {
    let by_query = request
        .uri()
        .query()
        .is_some_and(|query| query.split('&').any(|pair| pair == "format=json"));
    let by_header = request
        .headers()
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/json"));
    by_query || by_header
}

/// A time in RFC 3339, to the second, in UTC.
fn timestamp(time: std::time::SystemTime) -> String {
    jiff::Timestamp::try_from(time)
        .and_then(|time| jiff::Timestamp::from_second(time.as_second()))
        .map_or_else(|_| "unknown".to_string(), |time| time.to_string())
}
