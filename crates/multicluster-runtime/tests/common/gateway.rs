//! A misbehaving gateway on a loopback port, standing where a member's
//! API server would be: what a broken server or a proxy in front of one
//! answers, which a real API server never does (it echoes no credential,
//! it does not end every watch with 410). Lists get an empty ConfigMap list
//! unless the answer says otherwise.

use std::net::SocketAddr;

use base64::Engine;
use http_body_util::Full;
use hyper::body::Bytes;

/// What a request asked for, as the gateway's answers need it.
pub struct Asked {
    /// Whether it is a watch (`watch=true` or `watch=1`).
    pub watch: bool,
    /// The credential it carried: the bearer token, or basic auth as
    /// `user with password`; empty if none.
    pub credential: String,
}

impl Asked {
    fn of<B>(request: &http::Request<B>) -> Self {
        let watch = request.uri().query().is_some_and(|query| {
            query
                .split('&')
                .any(|pair| pair == "watch=true" || pair == "watch=1")
        });
        let sent = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        let credential = match sent.split_once(' ') {
            Some(("Basic", encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map(|decoded| String::from_utf8_lossy(&decoded).replace(':', " with "))
                .unwrap_or_default(),
            Some((_, token)) => token.to_string(),
            None => String::new(),
        };
        Self { watch, credential }
    }
}

/// The gateway's answer: a status and a JSON body.
pub struct Answer {
    pub status: http::StatusCode,
    pub body: String,
}

impl Answer {
    /// 200 with an empty ConfigMap list.
    pub fn empty_list() -> Self {
        let list = serde_json::json!({
            "kind": "ConfigMapList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "1"},
            "items": [],
        });
        Self::ok(list.to_string())
    }

    /// A watch answered with one ERROR event holding `status` (a Status
    /// object), after which it ends.
    pub fn error_event(status: serde_json::Value) -> Self {
        let event = serde_json::json!({"type": "ERROR", "object": status});
        Self::ok(format!("{event}\n"))
    }

    /// `status` with `body`.
    pub fn failing(status: http::StatusCode, body: serde_json::Value) -> Self {
        Self {
            status,
            body: body.to_string(),
        }
    }

    fn ok(body: String) -> Self {
        Self {
            status: http::StatusCode::OK,
            body,
        }
    }
}

/// Serves plain HTTP/1.1 on a free loopback port, answering each request
/// with `answer`, until the test ends.
pub async fn serve(answer: impl Fn(Asked) -> Answer + Clone + Send + Sync + 'static) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let answer = answer.clone();
            let service = hyper::service::service_fn(move |request: http::Request<_>| {
                let Answer { status, body } = answer(Asked::of(&request));
                async move {
                    let mut response = http::Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = status;
                    response.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    address
}
