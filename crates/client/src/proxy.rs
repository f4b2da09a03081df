//! Which proxy a member is reached through, picked as client-go picks it.
//!
//! A kubeconfig's `proxy-url`, where its policy allows one, is used for
//! that member whatever the environment says. Otherwise the environment
//! decides, per member: `HTTPS_PROXY` (or `https_proxy`) for an `https`
//! server, `HTTP_PROXY` (or `http_proxy`) for an `http` one, unless
//! `NO_PROXY` (or `no_proxy`) names the member's own server (a host, a
//! domain and its subdomains, an IP address or network, or `*`), or the
//! server is `localhost` or a loopback address. kube-rs matches `NO_PROXY`
//! against the proxy's address instead, so there a `NO_PROXY` naming a
//! member changed nothing, and one naming the proxy turned it off for all.
//!
//! The environment is read once, when the first member is built, as
//! client-go reads it once per process. `ALL_PROXY` is not read (client-go
//! does not). A proxy without a scheme is taken to be `http://`.

use std::sync::OnceLock;

use http::Uri;
use hyper_util::client::proxy::matcher::Matcher;

/// The proxy settings of the environment, read once.
struct Environment {
    http: Option<String>,
    https: Option<String>,
    matcher: Matcher,
}

fn environment() -> &'static Environment {
    static ENVIRONMENT: OnceLock<Environment> = OnceLock::new();
    ENVIRONMENT.get_or_init(|| {
        let first = |names: [&str; 2]| {
            names
                .iter()
                .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
        };
        let http = first(["HTTP_PROXY", "http_proxy"]);
        let https = first(["HTTPS_PROXY", "https_proxy"]);
        let no = first(["NO_PROXY", "no_proxy"]);
        Environment::new(http, https, no)
    })
}

impl Environment {
    fn new(http: Option<String>, https: Option<String>, no: Option<String>) -> Self {
        let matcher = Matcher::builder()
            .http(http.clone().unwrap_or_default())
            .https(https.clone().unwrap_or_default())
            .no(no.unwrap_or_default())
            .build();
        Self {
            http,
            https,
            matcher,
        }
    }

    /// The proxy for `server`, from these settings.
    fn for_server(&self, server: &Uri) -> Result<Option<Uri>, String> {
        if is_local(server) || self.matcher.intercept(server).is_none() {
            return Ok(None);
        }
        let (name, value) = match server.scheme_str() {
            Some("https") => ("HTTPS_PROXY", &self.https),
            _ => ("HTTP_PROXY", &self.http),
        };
        value
            .as_deref()
            .map(|value| {
                parse(value).ok_or_else(|| format!("the environment's {name} is not a proxy URL"))
            })
            .transpose()
    }
}

/// The proxy `server` is reached through: the kubeconfig's `proxy-url`
/// (already allowed by its policy) if it names one, else the
/// environment's. The error says which setting is not a URL, without
/// quoting it (a proxy URL can carry a password).
pub(crate) fn for_server(server: &Uri, proxy_url: Option<&str>) -> Result<Option<Uri>, String> {
    match proxy_url.filter(|url| !url.is_empty()) {
        Some(url) => parse(url)
            .map(Some)
            .ok_or_else(|| "its cluster's proxy-url is not a proxy URL".to_string()),
        None => environment().for_server(server),
    }
}

/// A proxy URL, `http://` when it names no scheme.
fn parse(value: &str) -> Option<Uri> {
    let uri: Uri = if value.contains("://") {
        value.parse().ok()?
    } else {
        format!("http://{value}").parse().ok()?
    };
    uri.host()?;
    Some(uri)
}

/// `localhost` or a loopback address, which client-go never proxies.
fn is_local(server: &Uri) -> bool {
    let Some(host) = server.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment(https: &str, no: &str) -> Environment {
        let value = |text: &str| Some(text.to_string()).filter(|text| !text.is_empty());
        Environment::new(value("http://plain.proxy:3128"), value(https), value(no))
    }

    fn proxy(environment: &Environment, server: &str) -> Option<String> {
        environment
            .for_server(&server.parse().expect("uri"))
            .expect("valid")
            .map(|uri| uri.to_string())
    }

    #[test]
    fn no_proxy_is_matched_against_each_members_own_server() {
        let env = environment(
            "http://user:pass@proxy.example:3128",
            "direct.example, .internal, 10.0.0.0/8, 192.0.2.7",
        );
        let proxied = Some("http://user:pass@proxy.example:3128/".to_string());
        for server in [
            "https://member-a.example:6443",
            "https://10.1.2.3.nip.io",
            "https://192.0.2.8:6443",
        ] {
            assert_eq!(proxy(&env, server), proxied, "{server}");
        }
        for server in [
            "https://direct.example:6443",
            "https://api.direct.example",
            "https://a.internal:443",
            "https://10.1.2.3:6443",
            "https://192.0.2.7:6443",
        ] {
            assert_eq!(proxy(&env, server), None, "{server}");
        }
        // A NO_PROXY naming the proxy itself (kube-rs turned the proxy off
        // for everyone) changes nothing for a member.
        let env = environment("http://proxy.example:3128", "proxy.example");
        assert_eq!(
            proxy(&env, "https://member.example"),
            Some("http://proxy.example:3128/".to_string())
        );
    }

    #[test]
    fn the_scheme_picks_the_variable_and_loopback_is_never_proxied() {
        let env = environment("proxy.example:3128", "");
        assert_eq!(
            proxy(&env, "https://member.example"),
            Some("http://proxy.example:3128/".to_string()),
            "a proxy without a scheme is http"
        );
        assert_eq!(
            proxy(&env, "http://member.example"),
            Some("http://plain.proxy:3128/".to_string())
        );
        for server in [
            "https://localhost:6443",
            "https://127.0.0.1:6443",
            "https://127.3.4.5",
            "https://[::1]:6443",
        ] {
            assert_eq!(proxy(&env, server), None, "{server}");
        }
        assert_eq!(proxy(&environment("", ""), "https://member.example"), None);
        let everything = environment("http://proxy.example:3128", "*");
        assert_eq!(proxy(&everything, "https://member.example"), None);
    }

    #[test]
    fn a_kubeconfig_proxy_url_wins_and_a_bad_one_is_named_without_its_value() {
        let server: Uri = "https://localhost:6443".parse().expect("uri");
        assert_eq!(
            for_server(&server, Some("socks5://proxy.example:1080"))
                .expect("valid")
                .map(|uri| uri.to_string()),
            Some("socks5://proxy.example:1080/".to_string())
        );
        let err = for_server(&server, Some("http://user:secret@[broken")).expect_err("invalid");
        assert!(
            err.contains("proxy-url") && !err.contains("secret"),
            "{err}"
        );
    }
}
