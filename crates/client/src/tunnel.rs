//! An HTTP or HTTPS proxy's tunnel (`CONNECT`), by hyper-util's `Tunnel`,
//! with the proxy's answer kept when it refuses. hyper-util names a 407
//! and calls every other refusal "tunnel error: unsuccessful": a 502 (the
//! proxy could not reach the member), a 403 (its policy forbids the
//! member) and a 503 (it is overloaded) all read the same. Here the bytes
//! the proxy answers the `CONNECT` with are kept, up to the end of its
//! headers, and a refusal names its status line.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use futures::future::BoxFuture;
use http::{HeaderValue, Uri};
use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::proxy::Tunnel;
use tower::{BoxError, Service, ServiceExt};

use multicluster_core::lock;

/// How much of the proxy's answer is kept: its status line and headers.
const ANSWER_KEPT: usize = 1024;

/// A proxy refused the tunnel; its status line says how.
#[derive(Debug, thiserror::Error)]
#[error("the proxy refused the tunnel: {0}")]
pub(crate) struct ProxyRefused(String);

/// Tunnels through the proxy at `proxy`, reached by `inner`.
#[derive(Clone)]
pub(crate) struct Tunnelled<C> {
    proxy: Uri,
    inner: C,
    auth: Option<HeaderValue>,
}

impl<C> Tunnelled<C> {
    /// Tunnels through the proxy at `proxy`, sending `auth` (a
    /// `Proxy-Authorization` value) if given.
    pub(crate) fn new(proxy: Uri, inner: C, auth: Option<HeaderValue>) -> Self {
        Self { proxy, inner, auth }
    }
}

impl<C> Service<Uri> for Tunnelled<C>
where
    C: Service<Uri> + Clone + Send + 'static,
    C::Future: Send + 'static,
    C::Response: Read + Write + Unpin + Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<C::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, target: Uri) -> Self::Future {
        let answer = Arc::new(Mutex::new(Vec::new()));
        let recording = Recording {
            inner: self.inner.clone(),
            answer: answer.clone(),
        };
        let tunnel = Tunnel::new(self.proxy.clone(), recording);
        let mut tunnel = match &self.auth {
            Some(auth) => tunnel.with_auth(auth.clone()),
            None => tunnel,
        };
        Box::pin(async move {
            let tunnelled = tunnel.ready().await?.call(target).await;
            match tunnelled {
                Ok(stream) => Ok(stream.inner),
                // The proxy answered, and not with 200 (hyper-util's error
                // does not say with what; its type is not public either).
                Err(err) => Err(match refusal(&lock(&answer)) {
                    Some(status) => ProxyRefused(status).into(),
                    None => err.into(),
                }),
            }
        })
    }
}

/// The proxy's status if `answer` is a whole HTTP answer other than 200
/// (`502 Bad Gateway`), or one that is not HTTP.
fn refusal(answer: &[u8]) -> Option<String> {
    if !answer.windows(4).any(|end| end == b"\r\n\r\n") && answer.len() < ANSWER_KEPT {
        // Cut short: the connection broke, which its error says; unless
        // what came was no HTTP at all.
        return (!answer.is_empty() && !answer.starts_with(b"HTTP/")).then(|| status_line(answer));
    }
    let status = status_line(answer);
    (!status.starts_with("200")).then_some(status)
}

/// The status line of the proxy's `answer` (`502 Bad Gateway`), as far
/// as it is printable.
fn status_line(answer: &[u8]) -> String {
    let line = answer
        .split(|byte| *byte == b'\r' || *byte == b'\n')
        .next()
        .unwrap_or_default();
    let line: String = String::from_utf8_lossy(line)
        .chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(100)
        .collect();
    match line.split_once(' ') {
        Some((version, status)) if version.starts_with("HTTP/") => status.trim().to_string(),
        _ if line.is_empty() => "its answer was empty".into(),
        _ => format!("its answer was not HTTP ({line})"),
    }
}

/// Connects by `inner`, keeping what the other end sends first.
#[derive(Clone)]
struct Recording<C> {
    inner: C,
    answer: Arc<Mutex<Vec<u8>>>,
}

impl<C> Service<Uri> for Recording<C>
where
    C: Service<Uri>,
    C::Future: Send + 'static,
    C::Response: Send + 'static,
{
    type Response = Recorded<C::Response>;
    type Error = C::Error;
    type Future = BoxFuture<'static, Result<Recorded<C::Response>, C::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let answer = self.answer.clone();
        Box::pin(async move {
            Ok(Recorded {
                inner: connecting.await?,
                answer,
                done: false,
            })
        })
    }
}

/// A connection whose first bytes read are kept, until the end of the
/// headers they carry (or [`ANSWER_KEPT`] bytes).
struct Recorded<T> {
    inner: T,
    answer: Arc<Mutex<Vec<u8>>>,
    done: bool,
}

impl<T: Read + Unpin> Read for Recorded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.done {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let mut scratch = [0u8; ANSWER_KEPT];
        let room = buf.remaining().min(ANSWER_KEPT);
        let mut read = ReadBuf::new(&mut scratch[..room]);
        ready!(Pin::new(&mut this.inner).poll_read(cx, read.unfilled()))?;
        let filled = read.filled();
        let mut answer = lock(&this.answer);
        let keep = ANSWER_KEPT.saturating_sub(answer.len()).min(filled.len());
        answer.extend_from_slice(&filled[..keep]);
        this.done = filled.is_empty()
            || answer.len() >= ANSWER_KEPT
            || answer.windows(4).any(|end| end == b"\r\n\r\n");
        drop(answer);
        buf.put_slice(filled);
        Poll::Ready(Ok(()))
    }
}

impl<T: Write + Unpin> Write for Recorded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, bytes)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use hyper_util::client::legacy::connect::HttpConnector;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A proxy that answers every `CONNECT` with `answer`.
    async fn proxy_answering(answer: &'static [u8]) -> Uri {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        break;
                    }
                    head.push(byte[0]);
                }
                let _ = client.write_all(answer).await;
            }
        });
        format!("http://{address}").parse().expect("uri")
    }

    async fn tunnel_through(answer: &'static [u8]) -> Result<(), BoxError> {
        let proxy = proxy_answering(answer).await;
        let mut tunnelled = Tunnelled::new(proxy, HttpConnector::new(), None);
        tunnelled
            .ready()
            .await?
            .call("https://member.example:6443".parse().expect("uri"))
            .await
            .map(drop)
    }

    #[tokio::test]
    async fn a_refusal_names_the_proxys_status() {
        let refused = tunnel_through(b"HTTP/1.1 502 Bad Gateway\r\nVia: test\r\n\r\n")
            .await
            .expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "the proxy refused the tunnel: 502 Bad Gateway"
        );
        let asked = tunnel_through(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
            .await
            .expect_err("refused");
        assert_eq!(
            asked.to_string(),
            "the proxy refused the tunnel: 407 Proxy Authentication Required"
        );
        tunnel_through(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .expect("a tunnel");
    }

    #[test]
    fn a_refusal_is_a_whole_answer_other_than_200() {
        assert_eq!(
            refusal(b"HTTP/1.1 503 Service Unavailable\r\n\r\n").as_deref(),
            Some("503 Service Unavailable")
        );
        assert_eq!(refusal(b"HTTP/1.1 200 OK\r\n\r\n"), None);
        assert_eq!(refusal(b""), None);
        assert_eq!(refusal(b"HTTP/1.1 200 Conn"), None, "cut short");
        assert_eq!(
            refusal(b"SSH-2.0-OpenSSH").as_deref(),
            Some("its answer was not HTTP (SSH-2.0-OpenSSH)")
        );
    }

    #[test]
    fn the_status_line_is_read_printable() {
        assert_eq!(status_line(b"HTTP/1.1 403 Forbidden\r\n"), "403 Forbidden");
        assert_eq!(status_line(b""), "its answer was empty");
        assert_eq!(
            status_line(b"SSH-2.0-OpenSSH\x1b[31m\r\n"),
            "its answer was not HTTP (SSH-2.0-OpenSSH[31m)"
        );
    }
}
