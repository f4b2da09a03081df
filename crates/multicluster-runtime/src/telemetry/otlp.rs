//! OTLP/HTTP export of the process's spans (feature `opentelemetry`).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tokio::runtime::Handle;
use tracing_opentelemetry::OpenTelemetryLayer;

/// How long one export (a batch of spans sent to the receiver) may take:
/// a receiver that hangs costs a batch of spans, never a reconcile.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`OtlpTraces::shutdown`] waits for the last spans to go out.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The path of traces under an OTLP/HTTP endpoint (the OTLP
/// specification's, which `OTEL_EXPORTER_OTLP_ENDPOINT` also assumes).
const TRACES_PATH: &str = "/v1/traces";

/// Why traces could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// The endpoint is not an `http://` URL with a host.
    #[error("OTLP endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint as given (an operator's flag, never a credential).
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Started outside a tokio runtime: exports run on the caller's runtime.
    #[error("OTLP traces must be started inside a tokio runtime")]
    NoRuntime,
    /// The exporter could not be built.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// The last spans could not be sent at shutdown.
    #[error("OTLP traces at shutdown: {0}")]
    Shutdown(String),
}

/// Spans exported as OpenTelemetry traces over OTLP/HTTP (protobuf), in
/// batches, from a `tracing` layer.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tracing_subscriber::prelude::*;
/// let traces = multicluster_runtime::telemetry::OtlpTraces::start(
///     "http://otel-collector.monitoring:4318",
///     "my-fleet-controller",
/// )?;
/// tracing_subscriber::registry()
///     .with(traces.layer())
///     .with(tracing_subscriber::fmt::layer())
///     .init();
/// // ... run the manager ...
/// traces.shutdown().await?;
/// # Ok(()) }
/// ```
///
/// Only plain `http://` endpoints are spoken to (a collector beside the
/// controller, in its pod or its cluster, is the usual receiver); an
/// exporter that cannot reach its receiver drops spans, never blocks a
/// reconcile.
///
/// Dropped without [`OtlpTraces::shutdown`], it sends the rest from the
/// thread that drops it, waiting at most a few seconds: drop it where
/// blocking is allowed (at the end of `main`, whose thread is not one of
/// a multi-thread runtime's workers).
#[derive(Debug)]
pub struct OtlpTraces {
    provider: SdkTracerProvider,
    /// Whether [`OtlpTraces::shutdown`] ran (dropping it then sends nothing).
    shut_down: bool,
}

impl OtlpTraces {
    /// Exports to the OTLP/HTTP receiver at `endpoint` (its base URL, as
    /// in `OTEL_EXPORTER_OTLP_ENDPOINT`: `/v1/traces` is added unless
    /// given), naming the process `service_name`. Call it inside the tokio
    /// runtime the process runs on: exports are sent from it.
    pub fn start(endpoint: &str, service_name: impl Into<String>) -> Result<Self, OtlpError> {
        let url = traces_url(endpoint)?;
        let runtime = Handle::try_current().map_err(|_| OtlpError::NoRuntime)?;
        let client = OnRuntime {
            runtime,
            client: opentelemetry_http::hyper::HyperClient::with_default_connector(
                EXPORT_TIMEOUT,
                None,
            ),
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(client)
            .build()
            .map_err(|err| OtlpError::Exporter(err.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(service_name.into())
                    .build(),
            )
            .build();
        Ok(Self {
            provider,
            shut_down: false,
        })
    }

    /// The `tracing` layer that hands spans to the exporter; add it to the
    /// process's subscriber.
    pub fn layer<S>(&self) -> OpenTelemetryLayer<S, SdkTracer>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        let tracer = self.provider.tracer(env!("CARGO_PKG_NAME"));
        tracing_opentelemetry::layer().with_tracer(tracer)
    }

    /// Sends the spans not yet sent (waiting at most a few seconds) and
    /// stops exporting.
    pub async fn shutdown(mut self) -> Result<(), OtlpError> {
        self.shut_down = true;
        let provider = self.provider.clone();
        // The exporter's thread waits for a send on this runtime: the wait
        // must not hold one of its threads.
        tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT))
            .await
            .map_err(|err| OtlpError::Shutdown(err.to_string()))?
            .map_err(|err| OtlpError::Shutdown(err.to_string()))
    }
}

impl Drop for OtlpTraces {
    fn drop(&mut self) {
        if !self.shut_down {
            // What cannot be sent in time is dropped: it never holds up
            // the process's exit for longer.
            let _ = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
        }
    }
}

/// The URL traces are posted to, from an OTLP/HTTP base endpoint.
fn traces_url(endpoint: &str) -> Result<String, OtlpError> {
    let refuse = |reason| OtlpError::Endpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|_| refuse("not a URL (expected http://host:port)"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(_) => return Err(refuse("only http:// is supported")),
        None => return Err(refuse("no scheme (expected http://host:port)")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(refuse("no host"));
    }
    let base = endpoint.trim_end_matches('/');
    Ok(if base.ends_with(TRACES_PATH) {
        base.to_string()
    } else {
        format!("{base}{TRACES_PATH}")
    })
}

/// Hyper's client on the process's runtime: the SDK exports from a thread
/// of its own, where hyper's client (which needs a tokio runtime) cannot
/// run, so each send is spawned onto the runtime and awaited.
#[derive(Debug)]
struct OnRuntime {
    runtime: Handle,
    client: opentelemetry_http::hyper::HyperClient,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|err| Box::new(err) as HttpError)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(
            traces_url("http://collector:4318").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/v1/traces").unwrap(),
            "http://collector:4318/v1/traces"
        );
    }

    #[test]
    fn endpoints_it_cannot_speak_to_are_refused_by_name() {
        for (endpoint, reason) in [
            ("collector:4318", "no scheme"),
            ("https://collector:4318", "only http://"),
            ("http://", "not a URL"),
            ("not a url", "not a URL"),
        ] {
            let err = traces_url(endpoint).unwrap_err().to_string();
            assert!(
                err.contains(endpoint) && err.contains(reason),
                "{endpoint}: {err}"
            );
        }
    }

    #[test]
    fn it_needs_a_runtime() {
        let err = OtlpTraces::start("http://127.0.0.1:4318", "test").unwrap_err();
        assert!(matches!(err, OtlpError::NoRuntime), "{err}");
    }
}
