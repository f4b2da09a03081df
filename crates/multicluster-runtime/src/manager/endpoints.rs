//! The manager's HTTP endpoints: `/healthz` (the process is serving),
//! `/readyz` (the manager has started its provider and controllers),
//! `/metrics` (Prometheus text format) and `/clusters` (each engaged
//! cluster's state, one per line, for people).

use std::convert::Infallible;

use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{ClusterState, Manager};

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
        "/readyz" if manager.is_started() => (StatusCode::OK, "text/plain", "ok\n".to_string()),
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

fn cluster_report(manager: &Manager) -> String {
    let working_on = manager.coordinator().working_on();
    manager
        .cluster_states()
        .into_iter()
        .map(|(name, state)| {
            let state = match state {
                ClusterState::Syncing => "syncing".to_string(),
                ClusterState::Ready => match &working_on {
                    Some(mine) if mine.contains(&name) => "ready, worked on here".to_string(),
                    Some(_) => "ready, left to another replica".to_string(),
                    None => "ready".to_string(),
                },
                ClusterState::Degraded(reason) => format!("degraded: {reason}"),
                ClusterState::Unreachable(reason) => format!("unreachable: {reason}"),
                ClusterState::Unusable(reason) => format!("unusable: {reason}"),
            };
            format!("{name}\t{state}\n")
        })
        .collect()
}
