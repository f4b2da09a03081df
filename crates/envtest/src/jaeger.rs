//! A real trace receiver for tests of exported spans: Jaeger (built from
//! its Go module by a script of the caller's, this workspace's
//! `hack/jaeger/build.sh`), receiving OTLP/HTTP on a loopback port, keeping
//! traces in memory, and answering its query API, from which a test reads
//! the spans back with their parents.

use std::path::Path;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use serde_json::Value;

use crate::Error;
use crate::process::Process;

/// How long Jaeger may take to answer its query API after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running Jaeger, stopped when dropped.
pub struct Jaeger {
    process: Process,
    otlp_port: u16,
    query_port: u16,
    _dir: tempfile::TempDir,
}

/// One span as Jaeger's query API returns it.
#[derive(Clone, Debug)]
pub struct Span {
    /// Its trace.
    pub trace_id: String,
    /// Its own id.
    pub span_id: String,
    /// Its parent's id (a `CHILD_OF` reference), if it has one.
    pub parent_id: Option<String>,
    /// The span's name.
    pub operation: String,
    /// Its attributes, as text.
    pub tags: std::collections::BTreeMap<String, String>,
}

impl Span {
    /// The value of the attribute `key`, or "" without it.
    pub fn tag(&self, key: &str) -> &str {
        self.tags.get(key).map_or("", String::as_str)
    }

    /// The spans above this one among `spans` (its trace's), nearest
    /// first.
    pub fn ancestors<'a>(&self, spans: &'a [Span]) -> Vec<&'a Span> {
        let by_id: std::collections::HashMap<&str, &Span> = spans
            .iter()
            .map(|span| (span.span_id.as_str(), span))
            .collect();
        let mut above = Vec::new();
        let mut parent = self.parent_id.as_deref();
        while let Some(id) = parent {
            // A cycle cannot come from Jaeger; a bound keeps a bad answer
            // from looping.
            let Some(next) = by_id.get(id).filter(|_| above.len() < spans.len()) else {
                break;
            };
            above.push(*next);
            parent = next.parent_id.as_deref();
        }
        above
    }
}

impl Jaeger {
    /// Builds (first run) Jaeger with `build_script` and starts it on free
    /// loopback ports; returns once its query API answers.
    pub async fn start(build_script: &Path) -> Result<Self, Error> {
        let binary = crate::tools::built_by(build_script).map_err(Error::TraceReceiver)?;
        let dir = tempfile::tempdir().map_err(|source| Error::Io {
            what: "making Jaeger's directory".into(),
            source,
        })?;
        let [otlp_port, query_port, grpc_port] = crate::control_plane::free_ports()?;
        let config = dir.path().join("jaeger.yaml");
        std::fs::write(&config, config_yaml(otlp_port, query_port, grpc_port)).map_err(
            |source| Error::Io {
                what: format!("writing {}", config.display()),
                source,
            },
        )?;
        let process = Process::spawn(
            "jaeger",
            &binary,
            vec![
                "--config".into(),
                format!("file:{}", config.display()).into(),
            ],
            dir.path().join("jaeger.log"),
        )?;
        let mut jaeger = Self {
            process,
            otlp_port,
            query_port,
            _dir: dir,
        };
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = jaeger.process.exit_status() {
                return Err(Error::Exited {
                    name: jaeger.process.name(),
                    status: status.to_string(),
                    log_tail: jaeger.process.log_tail(),
                });
            }
            let answer = jaeger.get("/api/services").await;
            if answer.is_ok() {
                return Ok(jaeger);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::TraceReceiver(format!(
                    "Jaeger's query API did not answer within {READY_TIMEOUT:?} ({}); last lines of its log:\n{}",
                    answer.err().unwrap_or_default(),
                    jaeger.process.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The OTLP/HTTP endpoint spans are sent to (its base URL).
    pub fn otlp_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.otlp_port)
    }

    /// Every span Jaeger holds of `service`'s traces.
    pub async fn spans(&self, service: &str) -> Result<Vec<Span>, Error> {
        let answer = self
            .get(&format!("/api/traces?service={service}&limit=10000"))
            .await
            .map_err(Error::TraceReceiver)?;
        let answer: Value = serde_json::from_slice(&answer)
            .map_err(|err| Error::TraceReceiver(format!("Jaeger's answer: {err}")))?;
        let text = |value: &Value| match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let mut spans = Vec::new();
        for trace in answer["data"].as_array().into_iter().flatten() {
            for span in trace["spans"].as_array().into_iter().flatten() {
                let parent_id = span["references"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|reference| reference["refType"] == "CHILD_OF")
                    .map(|reference| text(&reference["spanID"]));
                let tags = span["tags"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|tag| (text(&tag["key"]), text(&tag["value"])))
                    .collect();
                spans.push(Span {
                    trace_id: text(&span["traceID"]),
                    span_id: text(&span["spanID"]),
                    parent_id,
                    operation: text(&span["operationName"]),
                    tags,
                });
            }
        }
        Ok(spans)
    }

    /// The body of a GET of `path` on the query API.
    async fn get(&self, path: &str) -> Result<Bytes, String> {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Empty<Bytes>>();
        let uri: http::Uri = format!("http://127.0.0.1:{}{path}", self.query_port)
            .parse()
            .map_err(|err| format!("{path}: {err}"))?;
        let asked = async {
            let answer = client.get(uri).await.map_err(|err| err.to_string())?;
            let status = answer.status();
            let body = answer
                .into_body()
                .collect()
                .await
                .map_err(|err| err.to_string())?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
            }
            Ok(body)
        };
        tokio::time::timeout(QUERY_TIMEOUT, asked)
            .await
            .map_err(|_| format!("GET {path}: no answer within {QUERY_TIMEOUT:?}"))?
    }
}

/// Jaeger's configuration: OTLP/HTTP in, the in-memory store, the query
/// API, all on loopback; its own metrics and logs kept quiet.
fn config_yaml(otlp_port: u16, query_port: u16, grpc_port: u16) -> String {
    format!(
        r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memory_store:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memory_store
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:{grpc_port}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_port}
exporters:
  jaeger_storage_exporter:
    trace_storage: memory_store
"#
    )
}
