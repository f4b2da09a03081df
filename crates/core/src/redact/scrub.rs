//! The last line of defence: credential-shaped text taken out of any text
//! before it becomes [`Redacted`](super::Redacted).
//!
//! The rest of [`super`] describes errors it knows without their secrets.
//! Text it does not know (an error of a type it has never seen, a
//! provider's own words about an object) still passes through here, so
//! that no public path can make a token into text safe to log: PEM blocks,
//! `Authorization` values, passwords in URLs, `key=value` pairs whose key
//! names a secret, JSON Web Tokens and long random-looking strings are
//! replaced by `[withheld]`. What an operator needs from a reason (object
//! names, field names, addresses, status codes, Kubernetes' own messages)
//! has none of these shapes.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Captures, Regex};

const WITHHELD: &str = "[withheld]";

/// The patterns, in the order they are applied.
struct Patterns {
    pem: Regex,
    scheme: Regex,
    userinfo: Regex,
    pair: Regex,
    jwt: Regex,
    opaque: Regex,
}

static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| {
    let compile = |pattern: &str| Regex::new(pattern).expect("a valid pattern");
    Patterns {
        // A PEM block, or what is left of one that was cut.
        pem: compile(r"-----BEGIN [A-Z0-9 ]+-----(?s:.*?)(-----END [A-Z0-9 ]+-----|$)"),
        // An Authorization header's value.
        scheme: compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"),
        // `scheme://user:password@host`.
        userinfo: compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@"),
        // `token=...`, `"password": "..."`, `--api-key ...`-like pairs.
        pair: compile(
            r#"(?i)\b([\w.-]*(?:token|passw(?:or)?d|secret|api[_-]?key|credential|private[_-]?key|key[_-]?data|authorization)[\w.-]*)("?\s*[:=]\s*"?)([^\s",;&}\]]+)"#,
        ),
        jwt: compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
        // Long runs that look random: base64 or URL-safe base64 of 24
        // bytes or more.
        opaque: compile(r"[A-Za-z0-9+/=_-]{32,}"),
    }
});

/// `text` with every credential-shaped part replaced by `[withheld]`.
pub(crate) fn scrub(text: &str) -> Cow<'_, str> {
    let patterns = &*PATTERNS;
    let mut text = Cow::Borrowed(text);
    let mut apply = |regex: &Regex, with: &dyn Fn(&Captures<'_>) -> String| {
        if regex.is_match(&text) {
            text = Cow::Owned(regex.replace_all(&text, with).into_owned());
        }
    };
    apply(&patterns.pem, &|_| WITHHELD.to_string());
    apply(&patterns.scheme, &|found| {
        // "basic authentication" is a phrase, not a credential.
        let value = found[0][found[1].len()..].trim_start();
        if value.bytes().all(|b| b.is_ascii_lowercase()) {
            found[0].to_string()
        } else {
            format!("{} {WITHHELD}", &found[1])
        }
    });
    apply(&patterns.userinfo, &|found| found[1].to_string());
    apply(&patterns.pair, &|found| {
        let (delimiter, value) = (&found[2], &found[3]);
        // `key: word` is as often prose ("no usable credential: its output
        // ...") as YAML; a plain lower-case word is left, as is an
        // Authorization scheme (its value is withheld above).
        let prose = !delimiter.contains(['=', '"'])
            && (value.bytes().all(|b| b.is_ascii_lowercase()) || value.starts_with('['));
        let scheme = ["bearer", "basic"].contains(&value.to_ascii_lowercase().as_str());
        if prose || scheme {
            found[0].to_string()
        } else {
            format!("{}{delimiter}{WITHHELD}", &found[1])
        }
    });
    apply(&patterns.jwt, &|_| WITHHELD.to_string());
    apply(&patterns.opaque, &|found| {
        let run = &found[0];
        // An absolute path is a path, however it is spelt.
        if looks_random(run) && !run.starts_with('/') {
            WITHHELD.to_string()
        } else {
            run.to_string()
        }
    });
    text
}

/// Upper and lower case letters and digits mixed: random bytes encoded,
/// not a name (Kubernetes names are lower case) or a word.
fn looks_random(run: &str) -> bool {
    run.bytes().any(|b| b.is_ascii_uppercase())
        && run.bytes().any(|b| b.is_ascii_lowercase())
        && run.bytes().any(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_shaped_text_is_withheld() {
        let jwt = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkFCQyJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJl";
        let cases = [
            (
                "plugin said -----BEGIN PRIVATE KEY-----\nMIIEvQIBADAN\n-----END PRIVATE KEY----- and stopped".to_string(),
                "plugin said [withheld] and stopped",
            ),
            (
                "cut: -----BEGIN CERTIFICATE-----\nMIIB".to_string(),
                "cut: [withheld]",
            ),
            (
                "sent Authorization: Bearer abc.def-ghi_jkl~mno to it".to_string(),
                "sent Authorization: Bearer [withheld] to it",
            ),
            (
                "proxy http://robot:s3cr3t@proxy.example:3128 refused".to_string(),
                "proxy http://proxy.example:3128 refused",
            ),
            (
                r#"{"token":"abc123","apiKey": "k-9", password=hunter2 client-key-data: QUJD, token: x7}"#.to_string(),
                r#"{"token":"[withheld]","apiKey": "[withheld]", password=[withheld] client-key-data: [withheld], token: [withheld]}"#,
            ),
            (
                format!("got {jwt} back"),
                "got [withheld] back",
            ),
            (
                "random 9fJk2LmQ8zX4vB7nR1tY6wE3pA5sD0cG and more".to_string(),
                "random [withheld] and more",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(scrub(&text), expected, "{text}");
        }
    }

    #[test]
    fn what_operators_need_passes_unchanged() {
        for text in [
            "Secret fleet/prod key \"kubeconfig\" is missing or empty",
            "kubeconfig from Secret fleet/evil key \"kubeconfig\" refused (context \"trap\"): users[\"trap\"].user.tokenFile names a local file, which kubeconfigs from this source may not read (KubeconfigPolicy::local_files allows it)",
            "https://10.0.12.7:6443 cannot be reached: client error (Connect): tcp connect error: Connection refused (os error 111)",
            "403 Forbidden: configmaps is forbidden: User \"system:serviceaccount:fleet:multicluster-controller-manager\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope",
            "the credential plugin \"/usr/local/bin/aws-iam-authenticator\" failed (exit status: 1); its stderr is withheld",
            "cluster multicluster-runtime-kubeconfig-member-0123456789-abcdef not ready within 30s",
            "it uses basic authentication, not a bearer token",
            "file /home/Build2024/Projects/FleetOps/Kubeconfigs2/prod.kubeconfig cannot be read",
            "no Secret in inventory labelled x-k8s.io/cluster-profile=prod for this consumer",
            "the credential plugin \"plugin\" gave no usable credential: no status",
        ] {
            assert_eq!(scrub(text), text);
        }
    }
}
