//! Where a credential may be sent: the servers the operator bound a
//! credential plugin to.
//!
//! A plugin the operator allows (an allowlisted exec plugin, a
//! ClusterProfile access provider) mints credentials from what the
//! kubeconfig or profile hands it: its arguments, its variables, the
//! cluster entry. Whoever writes that object also writes the server the
//! credential is sent to. Unbound, a profile naming its own server and
//! another member's name in what the plugin reads receives that member's
//! credential. [`Servers`] closes it: a kubeconfig or profile naming a
//! server outside the binding is refused before the plugin runs.
//!
//! A binding holds host patterns, IP networks and a CA bundle:
//!
//! - a **host pattern** is a host name or IP address (`api.prod.example.com`,
//!   `10.1.2.3`, `[fd00::1]`), or `*.` and a domain
//!   (`*.eks.amazonaws.com`: any name below it, at any depth), optionally
//!   with `:port` (the URL's port, 443 when it names none for `https`). Names
//!   are compared case-insensitively, without a trailing dot;
//! - an **IP network** (`10.0.0.0/8`, `fd00::/8`) admits a server written
//!   as an IP address in it. Names are never resolved to be checked: what
//!   a name resolves to may change between the check and the connection,
//!   and the server's certificate is checked for the name, not the address;
//! - a **CA bundle** (PEM) replaces the kubeconfig's CA: the server must
//!   prove a certificate that chains to it before any request (and so any
//!   credential) is sent, and `insecure-skip-tls-verify` and plain `http://`
//!   are refused under it. A profile cannot name a CA of its own then.
//!
//! - a **named server** ([`Servers::named`]) is one exact host and port
//!   with the CA its certificate must chain to, for that server alone.
//!
//! With host patterns or networks, the server must match one of them; with
//! a CA bundle besides, it must also chain to it (a named server, to its
//! own CA). A binding with neither patterns, networks nor a CA admits
//! nothing.
//!
//! Patterns, networks and a CA alone admit servers nobody named: a thief
//! with a name under the domain, an address in the network or a
//! certificate from the same CA. That is enough for a plugin whose
//! credential does not depend on the object (it mints the same for every
//! cluster); a plugin that mints by what the object writes needs every
//! server named one by one ([`Servers::names_each_server`]).

use std::net::IpAddr;

use base64::Engine;

use crate::Error;

/// The servers a plugin's credentials may be sent to (see the module notes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Servers {
    hosts: Vec<HostPattern>,
    networks: Vec<ipnet::IpNet>,
    ca_bundle: Option<String>,
}

/// One host pattern: an exact host, or every name below a domain; and a
/// port, or any; and, for a named server, its own CA.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct HostPattern {
    /// Lower-case, without a trailing dot; for `*.example.com`, the
    /// `.example.com` names must end with.
    host: String,
    wildcard: bool,
    port: Option<u16>,
    /// The CA (PEM) this server's certificate must chain to.
    ca: Option<String>,
}

/// Why a server is outside a binding, said without quoting the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outside {
    /// No host pattern or network matches it.
    NotListed,
    /// It is spoken to in the clear, which a CA binding cannot check.
    PlainHttp,
    /// It has no host at all.
    NoHost,
}

impl Servers {
    /// A binding that admits nothing yet: add host patterns, networks or
    /// a CA bundle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also admits servers matching `pattern` (see the module notes).
    pub fn host(mut self, pattern: &str) -> Result<Self, Error> {
        self.hosts.push(HostPattern::parse(pattern)?);
        Ok(self)
    }

    /// Also admits servers written as an IP address in `network`
    /// (`10.0.0.0/8`, `fd00::/8`).
    pub fn network(mut self, network: &str) -> Result<Self, Error> {
        let parsed: ipnet::IpNet = network.trim().parse().map_err(|_| {
            invalid(format!(
                "{network:?} is not an IP network such as 10.0.0.0/8"
            ))
        })?;
        self.networks.push(parsed.trunc());
        Ok(self)
    }

    /// Servers must prove a certificate chaining to this bundle (PEM,
    /// one or more certificates), which replaces the kubeconfig's own CA.
    pub fn ca_bundle(mut self, pem: impl Into<String>) -> Result<Self, Error> {
        self.ca_bundle = Some(pem_certificates(pem.into(), "the CA bundle")?);
        Ok(self)
    }

    /// Also admits exactly `server` (`host:port`, or an `https://` URL
    /// naming both; an IPv6 address in brackets), which must prove a
    /// certificate chaining to `ca_pem` (PEM): one server named with its
    /// CA, which replaces the kubeconfig's own for it.
    pub fn named(mut self, server: &str, ca_pem: impl Into<String>) -> Result<Self, Error> {
        let text = server.trim();
        let authority = text
            .strip_prefix("https://")
            .map(|rest| rest.trim_end_matches('/'))
            .unwrap_or(text);
        let mut pattern = HostPattern::parse(authority)?;
        if pattern.wildcard || pattern.port.is_none() {
            return Err(invalid(format!(
                "{server:?} is not one server: name its host and its port (api.example.com:6443)"
            )));
        }
        pattern.ca = Some(pem_certificates(
            ca_pem.into(),
            &format!("the CA of {server:?}"),
        )?);
        self.hosts.push(pattern);
        Ok(self)
    }

    /// Whether every server the binding admits is named one by one: only
    /// exact hosts with their port, each with a CA (its own or the
    /// bundle), no `*.` pattern and no network. Nothing else keeps a
    /// credential minted by what an object writes from a server nobody
    /// named (see the module notes).
    pub fn names_each_server(&self) -> bool {
        self.networks.is_empty()
            && !self.hosts.is_empty()
            && self.hosts.iter().all(|pattern| {
                !pattern.wildcard
                    && pattern.port.is_some()
                    && (pattern.ca.is_some() || self.ca_bundle.is_some())
            })
    }

    /// Admits `patterns` each as [`Servers::pattern`]: the form flags and
    /// files take.
    pub fn from_patterns<S: AsRef<str>>(
        patterns: impl IntoIterator<Item = S>,
    ) -> Result<Self, Error> {
        patterns
            .into_iter()
            .try_fold(Self::new(), |servers, pattern| {
                servers.pattern(pattern.as_ref())
            })
    }

    /// Also admits `pattern` as [`Servers::host`], or, when it holds a
    /// `/`, as [`Servers::network`].
    pub fn pattern(self, pattern: &str) -> Result<Self, Error> {
        if pattern.contains('/') {
            self.network(pattern)
        } else {
            self.host(pattern)
        }
    }

    /// The CA bundle, if the binding has one.
    pub fn ca(&self) -> Option<&str> {
        self.ca_bundle.as_deref()
    }

    /// Whether `server` (a kubeconfig's `server` URL) is inside the
    /// binding, as far as can be told before connecting (the CA is
    /// checked in the TLS handshake).
    pub fn admits(&self, server: &str) -> bool {
        self.check(server).is_ok()
    }

    /// [`Servers::admits`], saying why not; the CA the server must chain
    /// to, if the binding has one for it.
    fn check(&self, server: &str) -> Result<Option<&str>, Outside> {
        let uri: http::Uri = server.trim().parse().map_err(|_| Outside::NoHost)?;
        let plain = uri
            .scheme_str()
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http"));
        let Some(host) = uri.host() else {
            return Err(Outside::NoHost);
        };
        let bundle = self.ca_bundle.as_deref();
        let ca = if self.hosts.is_empty() && self.networks.is_empty() {
            // A CA alone decides; nothing at all admits nothing.
            bundle.ok_or(Outside::NotListed)?
        } else {
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim_end_matches('.')
                .to_ascii_lowercase();
            let port = uri.port_u16().unwrap_or(if plain { 80 } else { 443 });
            // A named server's own CA first: it is the one meant for it.
            let mut matching = self
                .hosts
                .iter()
                .filter(|pattern| pattern.matches(&host, port));
            let first = matching.next();
            let own = first
                .into_iter()
                .chain(matching)
                .find_map(|pattern| pattern.ca.as_deref());
            let by_network = host.parse::<IpAddr>().is_ok_and(|address| {
                self.networks
                    .iter()
                    .any(|network| network.contains(&address))
            });
            if first.is_none() && !by_network {
                return Err(Outside::NotListed);
            }
            match own.or(bundle) {
                Some(ca) => ca,
                None => return Ok(None),
            }
        };
        if plain {
            // A CA cannot be checked in the clear.
            return Err(Outside::PlainHttp);
        }
        Ok(Some(ca))
    }

    /// The bundle as a kubeconfig's `certificate-authority-data`.
    pub fn ca_data(&self) -> Option<String> {
        self.ca_bundle.as_deref().map(encode)
    }

    /// The CA `server` must chain to under this binding, as a
    /// kubeconfig's `certificate-authority-data`: a named server's own,
    /// else the bundle; `None` when the binding has none for it (or does
    /// not admit it).
    pub fn ca_data_for(&self, server: &str) -> Option<String> {
        self.check(server).ok().flatten().map(encode)
    }
}

fn encode(pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(pem)
}

/// `pem` if it holds a PEM certificate; `what` names it in the error.
fn pem_certificates(pem: String, what: &str) -> Result<String, Error> {
    if pem.contains("-----BEGIN CERTIFICATE-----") {
        Ok(pem)
    } else {
        Err(invalid(format!("{what} holds no PEM certificate")))
    }
}

impl HostPattern {
    fn parse(pattern: &str) -> Result<Self, Error> {
        let bad = || {
            invalid(format!(
                "{pattern:?} is not a host pattern (a host name, an IP address or *.domain, optionally with :port)"
            ))
        };
        let text = pattern.trim();
        if text.is_empty()
            || text.contains(['/', '@', '?', '#'])
            || text.contains(char::is_whitespace)
        {
            return Err(bad());
        }
        // `http::uri::Authority` splits host and port, IPv6 in brackets
        // included; a wildcard is put back afterwards.
        let (wildcard, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let authority: http::uri::Authority = rest.parse().map_err(|_| bad())?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if host.is_empty() || host.contains('*') || (wildcard && host.parse::<IpAddr>().is_ok()) {
            return Err(bad());
        }
        Ok(Self {
            host: if wildcard { format!(".{host}") } else { host },
            wildcard,
            port: authority.port_u16(),
            ca: None,
        })
    }

    fn matches(&self, host: &str, port: u16) -> bool {
        let host_matches = if self.wildcard {
            host.len() > self.host.len() && host.ends_with(&self.host)
        } else {
            host == self.host
        };
        host_matches && self.port.is_none_or(|wanted| wanted == port)
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidOptions {
        component: "server binding".to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns_match_names_below_a_domain_and_exact_hosts() {
        let servers = Servers::from_patterns([
            "*.eks.amazonaws.com",
            "api.prod.example.com:6443",
            "10.0.0.0/8",
            "[fd00::1]",
        ])
        .expect("valid");
        for admitted in [
            "https://ABC.gr7.us-west-2.eks.amazonaws.com",
            "https://x.eks.amazonaws.com.:443/",
            "https://api.prod.example.com:6443",
            "https://10.1.2.3:6443",
            "https://[fd00::1]:6443",
        ] {
            assert_eq!(servers.check(admitted), Ok(None), "{admitted}");
        }
        for outside in [
            "https://eks.amazonaws.com",
            "https://evil-eks.amazonaws.com.attacker.io",
            "https://api.prod.example.com",
            "https://api.prod.example.com:443",
            "https://11.1.2.3",
            "https://127.0.0.1:6443",
        ] {
            assert_eq!(servers.check(outside), Err(Outside::NotListed), "{outside}");
        }
        assert_eq!(servers.check("not a url"), Err(Outside::NoHost));
    }

    #[test]
    fn a_ca_binding_refuses_plain_http_and_alone_admits_any_host() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let servers = Servers::new().ca_bundle(pem).expect("pem");
        assert_eq!(
            servers.check("https://anything.example:6443"),
            Ok(Some(pem))
        );
        assert_eq!(
            servers.check("http://anything.example"),
            Err(Outside::PlainHttp)
        );
        assert!(servers.ca_data().is_some());
        assert_eq!(
            Servers::new().check("https://a.example"),
            Err(Outside::NotListed)
        );
    }

    #[test]
    fn named_servers_are_exact_with_their_own_ca() {
        let pem = |name: &str| {
            format!("-----BEGIN CERTIFICATE-----\n{name}\n-----END CERTIFICATE-----\n")
        };
        let servers = Servers::new()
            .named("api.a.example:6443", pem("a"))
            .and_then(|servers| servers.named("https://10.0.0.2:6443/", pem("b")))
            .and_then(|servers| servers.named("[fd00::3]:443", pem("c")))
            .expect("named");
        assert!(servers.names_each_server());
        assert_eq!(
            servers.check("https://API.A.example:6443"),
            Ok(Some(pem("a").as_str()))
        );
        assert_eq!(
            servers.check("https://10.0.0.2:6443"),
            Ok(Some(pem("b").as_str()))
        );
        assert_eq!(
            servers.check("https://[fd00::3]"),
            Ok(Some(pem("c").as_str()))
        );
        assert_eq!(
            servers.ca_data_for("https://10.0.0.2:6443"),
            Some(encode(&pem("b")))
        );
        for outside in [
            "https://api.a.example",
            "https://api.a.example:6444",
            "https://x.api.a.example:6443",
            "https://10.0.0.3:6443",
        ] {
            assert_eq!(servers.check(outside), Err(Outside::NotListed), "{outside}");
        }
        assert_eq!(
            servers.check("http://api.a.example:6443"),
            Err(Outside::PlainHttp)
        );
        // One by one only when nothing admits a server nobody named.
        for (loose, why) in [
            (
                servers.clone().host("*.fleet.example").expect("pattern"),
                "a wildcard",
            ),
            (
                servers.clone().network("10.0.0.0/8").expect("network"),
                "a network",
            ),
            (
                servers.clone().host("api.b.example").expect("host"),
                "any port",
            ),
            (
                servers.clone().host("api.b.example:6443").expect("host"),
                "no CA",
            ),
            (
                Servers::new().ca_bundle(pem("ca")).expect("pem"),
                "a CA alone",
            ),
            (Servers::new(), "nothing"),
        ] {
            assert!(!loose.names_each_server(), "{why}");
        }
        let with_bundle = Servers::from_patterns(["api.b.example:6443"])
            .and_then(|servers| servers.ca_bundle(pem("ca")))
            .expect("bundle");
        assert!(
            with_bundle.names_each_server(),
            "exact, and the bundle for its CA"
        );
        for bad in ["api.a.example", "*.a.example:6443", "10.0.0.0/8"] {
            let err = Servers::new()
                .named(bad, pem("a"))
                .map(|_| ())
                .expect_err(bad);
            assert!(err.to_string().contains("server binding"), "{err}");
        }
        assert!(
            Servers::new()
                .named("api.a.example:6443", "no pem")
                .is_err()
        );
    }

    #[test]
    fn bad_patterns_are_refused_by_name() {
        for bad in [
            "",
            "*.",
            "a/b",
            "user@host",
            "*.10.0.0.1",
            "a b",
            "*.*.example.com",
        ] {
            let err = Servers::from_patterns([bad]).map(|_| ()).expect_err(bad);
            assert!(err.to_string().contains("server binding"), "{err}");
        }
        assert!(Servers::new().network("10.0.0.0/33").is_err());
        assert!(Servers::new().ca_bundle("not pem").is_err());
    }
}
