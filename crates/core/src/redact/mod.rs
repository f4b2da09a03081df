//! Error text that is safe to log.
//!
//! kube-rs describes a failed exec credential plugin with the `Debug` form
//! of the command it ran, which lists the environment it set (the
//! kubeconfig's `env` entries, often secrets) and every argument, followed by
//! the plugin's raw output (which holds a token when the plugin half
//! worked). These helpers describe such failures by command and exit status
//! only: a plugin's stderr can print anything it was given (some print
//! their environment when they fail), so it is withheld.
//!
//! Everything else keeps what an operator needs and no credential holds:
//! the server's status code, reason and message for an answer; each cause
//! of a failure to connect (the I/O error, TLS verification, a timeout).
//! kube-rs's own text for an API error appends the `Debug` dump of the
//! whole status; here it is one line. Every text is one line of at most
//! `MAX_LEN` bytes.
//!
//! Whatever a text was built from, it passes one last scrub before it
//! becomes [`Redacted`]: PEM blocks, `Authorization` values, passwords in
//! URLs, `key=value` pairs whose key names a secret, JSON Web Tokens and
//! long random-looking strings are replaced by `[withheld]`. So an error
//! of a type this module does not know, or a provider's own words about
//! an object (`multicluster_runtime::provider::failures::Failures::record`), cannot
//! carry a credential to a log or to `/clusters` either: there is no public
//! way to mark text as safe without it.

mod scrub;

use std::error::Error as StdError;

use kube::client::AuthError;

/// Text about a failure that is safe to log and serve: built only here, from
/// errors this module knows how to describe without credentials, or from
/// the crate's own words. Cluster states and health reasons hold it, so no
/// client error's `to_string()` can reach `/clusters`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redacted(String);

/// The longest text a [`Redacted`] holds, in bytes (longer ones are cut,
/// ending in `…`).
#[doc(hidden)]
pub const MAX_LEN: usize = 600;

impl Redacted {
    /// A client error: an API error as code, reason and message on one line, other errors with their causes, credential plugin failures by command and status.
    pub fn kube(err: &kube::Error) -> Self {
        Self::bounded(said_plainly(err, kube_error(err)))
    }

    /// `text`, the caller's description of `err` built from this module's
    /// describers (a wrapper of a client error, say): scrubbed, escaped and
    /// bounded like every other text, led by what running out of file
    /// descriptors means where that is the cause.
    #[doc(hidden)]
    pub fn described(err: &(dyn StdError + 'static), text: String) -> Self {
        Self::bounded(said_plainly(err, text))
    }

    /// Any error and its causes, each once; client errors as [`Redacted::kube`] describes them.
    pub fn error(err: &(dyn StdError + 'static)) -> Self {
        Self::bounded(said_plainly(err, error_chain(err)))
    }

    /// `server` could not be reached because of `err` (and its causes).
    /// Running out of file descriptors, the process's own fault, comes
    /// first.
    pub fn unreachable(server: &str, err: &(dyn StdError + 'static)) -> Self {
        Self::bounded(said_plainly(
            err,
            format!("{server} cannot be reached: {}", error_chain(err)),
        ))
    }

    /// The caller's own words about a failure, which should quote no
    /// client data: scrubbed, escaped and bounded like every other text.
    pub fn new(text: impl Into<String>) -> Self {
        Self::bounded(text.into())
    }

    /// This text after `context`, the crate's own words: `context: text`.
    #[must_use]
    pub fn with_context(self, context: &str) -> Self {
        Self::bounded(format!("{context}: {}", self.0))
    }

    /// `text` scrubbed of anything shaped like a credential (see
    /// `scrub`), on one line, cut to [`MAX_LEN`]: every `Redacted` is made
    /// here, so no text reaches a log, `/clusters` or a metric without it.
    fn bounded(text: String) -> Self {
        let text = match scrub::scrub(&text) {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(scrubbed) => scrubbed,
        };
        let text = if text.contains(['\n', '\r']) {
            text.split(['\n', '\r'])
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            text
        };
        let text = match escape_controls(&text) {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(escaped) => escaped,
        };
        Self(cut(text, MAX_LEN))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for Redacted {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

/// `text` with every control character (TAB, ESC, NUL, DEL, C1) and
/// every Unicode bidirectional override written as an escape (`\t`,
/// `\u{1b}`): text from a member's answer can then neither add a column
/// to `/clusters`' tab-separated view nor colour, move or reorder what a
/// terminal shows of a log line.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let needs =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.chars().any(needs) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' => escaped.push_str("\\t"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            c if needs(c) => escaped.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => escaped.push(c),
        }
    }
    std::borrow::Cow::Owned(escaped)
}

/// `text` describing `err`, led by what it means when it is the process's
/// own limit at fault: out of file descriptors looks like any connection
/// error otherwise.
fn said_plainly(err: &(dyn StdError + 'static), text: String) -> String {
    if out_of_descriptors(err) {
        format!(
            "this process has run out of file descriptors (raise its open-files limit, `ulimit -n`): {text}"
        )
    } else {
        text
    }
}

/// Whether `err` (or a cause) is `EMFILE` or `ENFILE`: no file descriptor
/// was left for a new connection.
#[doc(hidden)]
pub fn out_of_descriptors(err: &(dyn StdError + 'static)) -> bool {
    let limits = [
        rustix::io::Errno::MFILE.raw_os_error(),
        rustix::io::Errno::NFILE.raw_os_error(),
    ];
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = current {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.raw_os_error().is_some_and(|code| limits.contains(&code))
        {
            return true;
        }
        current = err.source();
    }
    false
}

/// How much of a plugin's stderr is kept, when it is shown at all: enough
/// for its own explanation.
const STDERR_LIMIT: usize = 300;

/// Describes a kube error without credentials.
#[doc(hidden)]
pub fn kube_error(err: &kube::Error) -> String {
    match err {
        // kube-rs appends the Debug dump of the whole status.
        kube::Error::Api(status) => status_text(status),
        // "ServiceError: client error (Connect)" says nothing; the causes
        // (the I/O error, a TLS failure, a timeout) do.
        kube::Error::Service(inner) if auth_error_in(err).is_none() => {
            causes(err.to_string(), inner.as_ref())
        }
        kube::Error::HyperError(inner) => causes(err.to_string(), inner),
        // A watch whose connection broke: why it broke (a keep-alive ping
        // unanswered, a reset) is in the causes.
        kube::Error::ReadEvents(inner) => causes(err.to_string(), inner),
        // kube-rs prints the whole proxy URL, user and password included.
        kube::Error::ProxyProtocolDisabled {
            proxy_url,
            protocol_feature,
        } => format!(
            "the proxy {} needs kube's {protocol_feature:?} feature",
            without_userinfo(proxy_url)
        ),
        kube::Error::ProxyProtocolUnsupported { proxy_url } => format!(
            "the proxy {} uses an unsupported protocol",
            without_userinfo(proxy_url)
        ),
        _ => match auth_error_in(err) {
            Some(auth) => auth_error(auth),
            None => err.to_string(),
        },
    }
}

/// A status the server answered with, on one line: `403 Forbidden:
/// configmaps is forbidden: User "x" cannot list ...`.
fn status_text(status: &kube::core::Status) -> String {
    let mut text = status.code.to_string();
    for part in [&status.reason, &status.message] {
        if !part.is_empty() && !text.contains(part.as_str()) {
            text.push_str(if text.len() > 3 { ": " } else { " " });
            text.push_str(part);
        }
    }
    text
}

/// `head`, then each cause of `err` (itself included) that adds something.
fn causes(mut head: String, err: &(dyn StdError + 'static)) -> String {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = current {
        let part = err.to_string();
        if !head.contains(&part) {
            head.push_str(": ");
            head.push_str(&part);
        }
        current = err.source();
    }
    head
}

/// `uri` without user information (`https://user:pass@host` is allowed in
/// a kubeconfig's server), as reasons may name it.
#[doc(hidden)]
pub fn without_userinfo(uri: &http::Uri) -> String {
    format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("?"),
        uri.authority()
            .map(|authority| authority.as_str().rsplit('@').next().unwrap_or_default())
            .unwrap_or_default()
    )
}

/// Describes any error and its causes without credentials: kube-rs errors
/// through [`kube_error`], others by their messages, each cause once.
#[doc(hidden)]
pub fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = String::new();
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = current {
        let part = if let Some(kube) = err.downcast_ref::<kube::Error>() {
            // Its own description already says what its causes do.
            current = None;
            kube_error(kube)
        } else if let Some(auth) = err.downcast_ref::<AuthError>() {
            current = None;
            auth_error(auth)
        } else {
            current = err.source();
            err.to_string()
        };
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    text
}

/// Describes a client authentication error without credentials.
#[doc(hidden)]
pub fn auth_error(err: &AuthError) -> String {
    match err {
        AuthError::AuthExecRun { out, .. } => format!(
            "the credential plugin failed ({}); {STDERR_WITHHELD}",
            out.status
        ),
        AuthError::AuthExecStart(io) => format!("the credential plugin could not be run: {io}"),
        // Parser messages can quote the output, i.e. the credential.
        AuthError::AuthExecParse(_) => {
            "the credential plugin's output is not an ExecCredential".to_string()
        }
        AuthError::InvalidBearerToken(_) => {
            "the credential is not a valid bearer token".to_string()
        }
        AuthError::InvalidBasicAuth(_) => "the basic auth credentials are not valid".to_string(),
        other => other.to_string(),
    }
}

fn auth_error_in(err: &kube::Error) -> Option<&AuthError> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = current {
        if let Some(auth) = err.downcast_ref::<AuthError>() {
            return Some(auth);
        }
        current = err.source();
    }
    None
}

/// What a failed credential plugin's description says instead of its
/// stderr.
#[doc(hidden)]
pub const STDERR_WITHHELD: &str = "its stderr is withheld, as it may print secrets (ClientOptions::plugin_stderr shows its last line)";

/// The last non-empty line of `text`, shortened to a few hundred bytes:
/// how a failed plugin or command explains itself, without the rest of
/// what it printed.
#[doc(hidden)]
pub fn last_line(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).rfind(|line| !line.is_empty())?;
    Some(cut(line.to_string(), STDERR_LIMIT))
}

/// `text` cut to at most `limit` bytes (on a character boundary), ending
/// in `…` when cut.
fn cut(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{ExitStatus, Output};

    use super::*;

    const SECRET: &str = "hunter2-secret-value";

    fn failed_run(stdout: &str, stderr: &str) -> AuthError {
        AuthError::AuthExecRun {
            cmd: format!("KUBE_PASSWORD=\"{SECRET}\" \"plugin\" \"--token={SECRET}\""),
            out: Box::new(Output {
                status: ExitStatus::from_raw(3 << 8),
                stdout: stdout.as_bytes().to_vec(),
                stderr: stderr.as_bytes().to_vec(),
            }),
        }
    }

    #[test]
    fn a_failed_plugin_is_described_by_its_status_only() {
        let err = failed_run(
            &format!("{{\"token\": \"{SECRET}\"}}"),
            &format!("starting\nKUBE_PASSWORD={SECRET}\n\n"),
        );
        let text = auth_error(&err);
        assert!(text.contains("exit status: 3"), "{text}");
        assert!(text.contains("stderr is withheld"), "{text}");
        assert!(!text.contains(SECRET), "{text}");
        // Wrapped the way kube-rs wraps a failed refresh during a request.
        let wrapped = kube::Error::Service(Box::new(failed_run("", "")));
        let text = kube_error(&wrapped);
        assert!(text.starts_with("the credential plugin failed"), "{text}");
        assert!(!text.contains(SECRET), "{text}");
    }

    #[test]
    fn long_stderr_is_cut_on_a_character_boundary() {
        let line = "é".repeat(STDERR_LIMIT);
        let cut = last_line(&line).expect("a line");
        assert!(cut.len() <= STDERR_LIMIT + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn proxy_errors_leave_out_the_proxy_credentials() {
        let proxy_url: http::Uri = format!("socks5://admin:{SECRET}@proxy.corp:1080")
            .parse()
            .expect("uri");
        let disabled = kube::Error::ProxyProtocolDisabled {
            proxy_url: Box::new(proxy_url.clone()),
            protocol_feature: "kube/socks5",
        };
        let text = kube_error(&disabled);
        assert_eq!(
            text,
            "the proxy socks5://proxy.corp:1080 needs kube's \"kube/socks5\" feature"
        );
        let unsupported = kube::Error::ProxyProtocolUnsupported {
            proxy_url: Box::new(proxy_url),
        };
        assert!(!kube_error(&unsupported).contains(SECRET));
    }

    #[test]
    fn running_out_of_descriptors_is_said_plainly() {
        let emfile = std::io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        let text = Redacted::error(&emfile);
        assert!(
            text.starts_with("this process has run out of file descriptors"),
            "{text}"
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!Redacted::error(&refused).contains("file descriptors"));
    }

    #[test]
    fn an_answer_is_one_line_with_code_reason_and_message() {
        let status = kube::core::Status::failure(
            "configmaps is forbidden: User \"reader\" cannot list resource \"configmaps\"",
            "Forbidden",
        )
        .with_code(403);
        let text = Redacted::kube(&kube::Error::Api(Box::new(status)));
        assert_eq!(
            text.as_str(),
            "403 Forbidden: configmaps is forbidden: User \"reader\" cannot list resource \"configmaps\""
        );
    }

    #[test]
    fn a_failure_to_connect_keeps_its_causes() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        );
        let err = kube::Error::Service(Box::new(refused));
        let text = kube_error(&err);
        assert!(
            text.ends_with("Connection refused (os error 111)"),
            "{text}"
        );
    }

    #[test]
    fn a_broken_watch_keeps_the_cause_of_the_break() {
        // hyper's body error, whose message leaves its cause out.
        #[derive(Debug)]
        struct BodyError(std::io::Error);
        impl std::fmt::Display for BodyError {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error reading a body from connection")
            }
        }
        impl StdError for BodyError {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        // kube-rs wraps a failed watch body as an I/O error around its
        // service error, whose causes say why the stream ended.
        let broken = std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        );
        let body = kube::Error::Service(Box::new(BodyError(broken)));
        let err = kube::Error::ReadEvents(std::io::Error::other(body));
        let text = kube_error(&err);
        assert!(
            text.starts_with("Error reading events stream")
                && text.ends_with("stream closed because of a broken pipe"),
            "{text}"
        );
    }

    #[test]
    fn texts_are_one_bounded_line() {
        let text = Redacted::new(format!("first\nsecond\r\n{}", "x".repeat(2 * MAX_LEN)));
        assert!(text.starts_with("first second xx"), "{text}");
        assert!(text.len() <= MAX_LEN + '…'.len_utf8(), "{}", text.len());
    }

    #[test]
    fn control_characters_are_escaped_so_no_column_or_colour_is_forged() {
        let text = Redacted::new("500: INJECTED\tready\tsince 2026\u{1b}[31mred\u{0}\u{202e}");
        assert_eq!(
            text.as_str(),
            "500: INJECTED\\tready\\tsince 2026\\u{1b}[31mred\\u{0}\\u{202e}"
        );
        assert!(!text.contains(['\t', '\u{1b}', '\0']));
        assert_eq!(escape_controls("plain text"), "plain text");
    }

    #[test]
    fn other_errors_keep_their_text() {
        let err = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(kube_error(&err), err.to_string());
    }
}
