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
//! Values shorter than [`MIN_LEN`] bytes are not searched for: they would
//! blank out ordinary words, and no credential worth the name is that
//! short. Values are also searched for as JSON spells them inside a
//! string (quotes and backslashes escaped), the form a Status message
//! takes.

use std::sync::{Arc, Mutex};

use http::Response;
use http_body_util::BodyExt;
use hyper::body::Bytes;
use kube::client::DynBody;
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
}
