//! Which `server` URLs a client can be built on, whatever the policy.
//!
//! kube-rs parses a cluster's `server` as an `http::Uri` and later puts
//! every request's path under it. A URI without a scheme
//! (`127.0.0.1:6443`, `//host`) parses, and then panics the client's
//! base-URI layer on its first request, inside the worker every request
//! of the member goes through. Nothing in a kubeconfig read from a
//! cluster may do that, so a server is checked for what a request needs
//! before anything is built: a scheme (`https`, or `http`, which the
//! policy decides on separately), a host, no user info (a client would
//! drop it, and the credential in it would show wherever the URL is
//! shown) and a port a connection can be made to. The reason names what
//! is missing, never the value.

/// What is wrong with a `server` URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadServer {
    /// No server, or an empty one.
    Missing,
    /// Not a URL at all.
    NotUrl,
    /// No scheme: `host:port` or `//host`.
    NoScheme,
    /// A scheme other than `https` and `http`.
    OtherScheme,
    /// No host, or an empty one.
    NoHost,
    /// `user:password@` before the host.
    UserInfo,
    /// Port 0, or a `:` with no port after it.
    BadPort,
}

impl std::fmt::Display for BadServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BadServer::Missing => "is missing",
            BadServer::NotUrl => "is not a URL",
            BadServer::NoScheme => "has no scheme (https://)",
            BadServer::OtherScheme => "has a scheme other than https:// (or http://)",
            BadServer::NoHost => "has no host",
            BadServer::UserInfo => "carries user info (user:password@) before its host",
            BadServer::BadPort => "has no port a connection can be made to after its ':'",
        })
    }
}

impl BadServer {
    /// Checks `server` (a kubeconfig cluster's `server`) for what every
    /// request on it needs.
    pub fn check(server: Option<&str>) -> Result<(), BadServer> {
        check(server)
    }
}

fn check(server: Option<&str>) -> Result<(), BadServer> {
    let text = server.map(str::trim).unwrap_or_default();
    if text.is_empty() {
        return Err(BadServer::Missing);
    }
    let uri: http::Uri = text.parse().map_err(|_| BadServer::NotUrl)?;
    match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
        None => return Err(BadServer::NoScheme),
        Some("https" | "http") => {}
        Some(_) => return Err(BadServer::OtherScheme),
    }
    let Some(authority) = uri.authority() else {
        return Err(BadServer::NoHost);
    };
    if authority.as_str().contains('@') {
        return Err(BadServer::UserInfo);
    }
    if authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .is_empty()
    {
        return Err(BadServer::NoHost);
    }
    let has_port = authority
        .as_str()
        .rsplit_once(']')
        .map_or(authority.as_str(), |(_, after)| after)
        .contains(':');
    if has_port && authority.port_u16().is_none_or(|port| port == 0) {
        return Err(BadServer::BadPort);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_a_request_can_be_made_on_pass() {
        for good in [
            "https://127.0.0.1:6443",
            "https://api.example.com",
            "HTTPS://API.EXAMPLE.COM:443/",
            "http://127.0.0.1:8001",
            "https://[fd00::1]:6443",
            "https://[::1]",
            "https://rancher.example/k8s/clusters/c-1",
            " https://padded.example ",
        ] {
            assert_eq!(check(Some(good)), Ok(()), "{good}");
        }
    }

    #[test]
    fn servers_a_client_would_panic_or_fail_on_are_named_by_what_is_wrong() {
        let long = format!("https://{}.example", "a".repeat(70_000));
        for (bad, why) in [
            (None, BadServer::Missing),
            (Some(""), BadServer::Missing),
            (Some("   "), BadServer::Missing),
            (Some("127.0.0.1:6443"), BadServer::NoScheme),
            (Some("api.example.com:6443"), BadServer::NoScheme),
            (Some("//127.0.0.1:6443"), BadServer::NoScheme),
            (Some("/just/a/path"), BadServer::NoScheme),
            (Some("ftp://127.0.0.1"), BadServer::OtherScheme),
            (Some("unix://var/run/k8s.sock"), BadServer::OtherScheme),
            (Some("https://"), BadServer::NotUrl),
            (Some("https://:6443"), BadServer::NoHost),
            (Some("https://[]:6443"), BadServer::NoHost),
            (
                Some("https://VALUE:secret@127.0.0.1:6443"),
                BadServer::UserInfo,
            ),
            (Some("https://127.0.0.1:0"), BadServer::BadPort),
            (Some("https://127.0.0.1:"), BadServer::BadPort),
            (Some("https://fd00::1:6443"), BadServer::NotUrl),
            (Some("https://127.0.0.1:99999999"), BadServer::BadPort),
            (Some(long.as_str()), BadServer::NotUrl),
            (Some("https://a b"), BadServer::NotUrl),
        ] {
            assert_eq!(check(bad), Err(why), "{bad:?}");
        }
    }
}
