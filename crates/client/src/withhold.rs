//! A member's own credential values, withheld from what its server
//! answers when a request fails.
//!
//! The redaction of [`multicluster_core::redact`] goes by shape: JSON Web Tokens,
//! base64 runs, PEM blocks. A server (or a gateway in front of it) that
//! echoes the credential it was sent in an error message can still hand
//! back a 40-hex token or a password such as `s3cr3t-Passw0rd!`, which
//! have no shape to find. But the client knows exactly which values it
//! sends: the kubeconfig's token, its basic-auth password (and the
//! header value made of it), its client key, every token a credential
//! plugin handed out. Each is replaced by `[withheld]` in the body of
//! every answer that is not a success, before kube-rs reads the body into
//! an error; so whatever carries that error on (`/clusters`, a log line,
//! the user's own reconcile error) never held the value. Successful
//! answers are objects and are left as they are.
//!
//! A watch is a successful answer whose failures come inside it: an event
//! of type `ERROR` carries a Status, whose message a server or gateway
//! may fill with the credential as well, and kube-rs hands it on (its
//! watcher logs it, at warn for a 403). So the events of a watch are read
//! line by line as they stream, and an `ERROR` line has the values
//! withheld too; the other events (the objects) pass untouched, and a
//! chunk without the bytes `ERROR` in it is not looked into at all.
//!
//! Values shorter than [`MIN_LEN`] bytes are not searched for: they would
//! blank out ordinary words, and no credential worth the name is that
//! short. Values are also searched for as JSON spells them inside a
//! string (quotes and backslashes escaped), the form a Status message
//! takes.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Bytes, Frame};
use kube::client::{Body, DynBody};
use secrecy::{ExposeSecret, SecretString};
use tower::BoxError;

/// What a withheld value becomes.
const WITHHELD: &[u8] = b"[withheld]";

/// Values shorter than this are not searched for.
pub(crate) const MIN_LEN: usize = 6;

/// How many values a plugin's renewals keep besides the kubeconfig's own:
/// an old token may still be echoed for a while after it was replaced.
const KEPT: usize = 8;

/// The credential values one member's client sends. Cheap to clone; the
/// clones share the values.
#[derive(Clone, Default)]
pub(crate) struct CredentialValues {
    values: Arc<Mutex<Vec<SecretString>>>,
}

impl std::fmt::Debug for CredentialValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialValues").finish_non_exhaustive()
    }
}

impl CredentialValues {
    /// Also withholds `value` (and its JSON spelling), unless it is too
    /// short or already held. The oldest of the values added after the
    /// first [`KEPT`] go first.
    pub(crate) fn add(&self, value: &str) {
        if value.len() < MIN_LEN {
            return;
        }
        let escaped = serde_json::to_string(value).unwrap_or_default();
        let escaped = escaped
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or_default()
            .to_string();
        let mut values = multicluster_core::lock(&self.values);
        for value in [value.to_string(), escaped] {
            if value.len() >= MIN_LEN && !values.iter().any(|held| held.expose_secret() == value) {
                values.push(value.into());
            }
        }
        let extra = values.len().saturating_sub(KEPT * 2);
        if extra > 0 {
            values.drain(..extra);
        }
    }

    /// `text` with every held value replaced, or `None` when it holds
    /// none.
    pub(crate) fn withhold(&self, text: &[u8]) -> Option<Vec<u8>> {
        let values = multicluster_core::lock(&self.values);
        // Longest first: a value that holds another is withheld whole.
        let mut found: Vec<&[u8]> = values
            .iter()
            .map(|value| value.expose_secret().as_bytes())
            .filter(|value| memchr::memmem::find(text, value).is_some())
            .collect();
        if found.is_empty() {
            return None;
        }
        found.sort_by_key(|value| std::cmp::Reverse(value.len()));
        let mut text = text.to_vec();
        for value in found {
            let mut out = Vec::with_capacity(text.len());
            let mut rest = text.as_slice();
            while let Some(at) = memchr::memmem::find(rest, value) {
                out.extend_from_slice(&rest[..at]);
                out.extend_from_slice(WITHHELD);
                rest = &rest[at + value.len()..];
            }
            out.extend_from_slice(rest);
            text = out;
        }
        Some(text)
    }

    /// `text` with every held value replaced.
    pub(crate) fn withhold_text(&self, text: &str) -> String {
        match self.withhold(text.as_bytes()) {
            Some(withheld) => String::from_utf8_lossy(&withheld).into_owned(),
            None => text.to_string(),
        }
    }

    /// `response` with its credential values withheld from its body when
    /// it is not a success (the body read whole: kube-rs reads an error's
    /// body whole anyway).
    pub(crate) async fn withhold_from(
        &self,
        response: Response<Box<DynBody>>,
    ) -> Result<Response<Box<DynBody>>, BoxError> {
        if response.status().is_success() || response.status().is_informational() {
            return Ok(response);
        }
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        let body = match self.withhold(&body) {
            Some(withheld) => Bytes::from(withheld),
            None => body,
        };
        let body = http_body_util::Full::new(body).map_err(|never| -> BoxError { match never {} });
        Ok(Response::from_parts(parts, Box::new(body) as Box<DynBody>))
    }
}

/// A member's client service with its credential values withheld from
/// its server's failures: error answers, and `ERROR` events of watches.
#[derive(Clone)]
pub(crate) struct Withheld<S> {
    pub(crate) inner: S,
    pub(crate) values: CredentialValues,
}

impl<S> tower::Service<Request<Body>> for Withheld<S>
where
    S: tower::Service<Request<Body>, Response = Response<Box<DynBody>>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let watch = is_watch(request.uri());
        let values = self.values.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if watch && response.status().is_success() {
                Ok(response.map(|body| {
                    Box::new(WatchEvents {
                        inner: body,
                        partial: Vec::new(),
                        values,
                        done: false,
                    }) as Box<DynBody>
                }))
            } else {
                values.withhold_from(response).await
            }
        })
    }
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1`).
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    })
}

/// A watch's body, its `ERROR` events withheld from line by line.
struct WatchEvents {
    inner: Box<DynBody>,
    /// The start of a line whose end has not come yet.
    partial: Vec<u8>,
    values: CredentialValues,
    done: bool,
}

impl WatchEvents {
    /// `chunk` with what ends a line before it: the complete lines, each
    /// `ERROR` event withheld from; what comes after the last newline is
    /// kept for the next chunk.
    fn lines(&mut self, chunk: Bytes) -> Option<Bytes> {
        let Some(last) = memchr::memrchr(b'\n', &chunk) else {
            self.partial.extend_from_slice(&chunk);
            return None;
        };
        let (complete, rest) = (chunk.slice(..=last), chunk.slice(last + 1..));
        let complete = if self.partial.is_empty() {
            complete
        } else {
            let mut joined = std::mem::take(&mut self.partial);
            joined.extend_from_slice(&complete);
            Bytes::from(joined)
        };
        self.partial.extend_from_slice(&rest);
        Some(self.withheld(complete))
    }

    /// `lines` with every `ERROR` event's values withheld.
    fn withheld(&self, lines: Bytes) -> Bytes {
        if memchr::memmem::find(&lines, b"ERROR").is_none() {
            return lines;
        }
        let mut out = Vec::with_capacity(lines.len());
        for line in lines.split_inclusive(|byte| *byte == b'\n') {
            let withheld = is_error_event(line)
                .then(|| self.values.withhold(line))
                .flatten();
            out.extend_from_slice(withheld.as_deref().unwrap_or(line));
        }
        Bytes::from(out)
    }
}

/// Whether `line` is a watch event of type `ERROR`.
fn is_error_event(line: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Event<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
    }
    memchr::memmem::find(line, b"ERROR").is_some()
        && serde_json::from_slice::<Event<'_>>(line).is_ok_and(|event| event.kind == "ERROR")
}

impl HttpBody for WatchEvents {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(chunk) => {
                        if let Some(lines) = self.lines(chunk) {
                            return Poll::Ready(Some(Ok(Frame::data(lines))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(None) => {
                    // A last line without its newline.
                    self.done = true;
                    let rest = Bytes::from(std::mem::take(&mut self.partial));
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(self.withheld(rest)))));
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_values_are_withheld_whatever_their_shape() {
        let values = CredentialValues::default();
        let hex = "0123456789abcdef0123456789abcdef01234567";
        values.add(hex);
        values.add("s3cr3t-Passw0rd!");
        values.add("pa\"ss\\word");
        values.add("short");
        let text = format!(
            r#"{{"message":"token {hex} and password s3cr3t-Passw0rd! and pa\"ss\\word refused; short stays"}}"#
        );
        let withheld =
            String::from_utf8(values.withhold(text.as_bytes()).expect("found")).expect("utf-8");
        assert_eq!(
            withheld,
            r#"{"message":"token [withheld] and password [withheld] and [withheld] refused; short stays"}"#
        );
        assert_eq!(values.withhold(b"nothing held here"), None);
    }

    #[test]
    fn renewals_keep_a_bounded_number_of_values() {
        let values = CredentialValues::default();
        for n in 0..100 {
            values.add(&format!("token-number-{n:04}"));
        }
        let held = multicluster_core::lock(&values.values).len();
        assert!(held <= 2 * KEPT, "{held}");
        assert!(values.withhold(b"token-number-0099").is_some());
        assert!(values.withhold(b"token-number-0000").is_none());
    }

    #[tokio::test]
    async fn only_error_events_of_a_watch_are_withheld_from_however_they_are_cut() {
        let values = CredentialValues::default();
        let token = "0123456789abcdef0123456789abcdef01234567";
        values.add(token);
        let added = format!(
            r#"{{"type":"ADDED","object":{{"kind":"ConfigMap","data":{{"k":"{token} ERROR"}}}}}}"#
        );
        let error = format!(
            r#"{{"type":"ERROR","object":{{"kind":"Status","message":"echoed {token}"}}}}"#
        );
        let stream = format!("{added}\n{error}\n{error}");
        let expected = format!(
            "{added}\n{}\n{}",
            error.replace(token, "[withheld]"),
            error.replace(token, "[withheld]")
        );
        // Cut anywhere, the token itself too: the lines come out whole.
        for cut in [1, 7, 40, 97, stream.len()] {
            let chunks: Vec<Result<Frame<Bytes>, BoxError>> = stream
                .as_bytes()
                .chunks(cut)
                .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))))
                .collect();
            let body = http_body_util::StreamBody::new(futures::stream::iter(chunks));
            let events = WatchEvents {
                inner: Box::new(body),
                partial: Vec::new(),
                values: values.clone(),
                done: false,
            };
            let out = events.collect().await.expect("body").to_bytes();
            assert_eq!(String::from_utf8_lossy(&out), expected, "cut every {cut}");
        }
        assert!(is_watch(
            &"/api/v1/configmaps?watch=true&resourceVersion=1"
                .parse()
                .expect("uri")
        ));
        assert!(is_watch(
            &"/api/v1/configmaps?allowWatchBookmarks=true&watch=1"
                .parse()
                .expect("uri")
        ));
        assert!(!is_watch(
            &"/api/v1/configmaps?limit=500".parse().expect("uri")
        ));
    }
}
