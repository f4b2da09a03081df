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
//! With host patterns or networks, the server must match one of them; with
//! a CA bundle besides, it must also chain to it. A binding with neither
//! patterns, networks nor a CA admits nothing.

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
/// port, or any.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct HostPattern {
    /// Lower-case, without a trailing dot; for `*.example.com`, the
    /// `.example.com` names must end with.
    host: String,
    wildcard: bool,
    port: Option<u16>,
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
        let pem = pem.into();
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(invalid(
                "the CA bundle holds no PEM certificate".to_string(),
            ));
        }
        self.ca_bundle = Some(pem);
        Ok(self)
    }

    /// Admits `patterns` each as [`Servers::host`], or, when one holds a
    /// `/`, as [`Servers::network`]: the form flags and files take.
    pub fn from_patterns<S: AsRef<str>>(
        patterns: impl IntoIterator<Item = S>,
    ) -> Result<Self, Error> {
        patterns
            .into_iter()
            .try_fold(Self::new(), |servers, pattern| {
                let pattern = pattern.as_ref();
                if pattern.contains('/') {
                    servers.network(pattern)
                } else {
                    servers.host(pattern)
                }
            })
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

    /// [`Servers::admits`], saying why not.
    fn check(&self, server: &str) -> Result<(), Outside> {
        let uri: http::Uri = server.trim().parse().map_err(|_| Outside::NoHost)?;
        let plain = uri.scheme_str() == Some("http");
        if self.ca_bundle.is_some() && plain {
            return Err(Outside::PlainHttp);
        }
        let Some(host) = uri.host() else {
            return Err(Outside::NoHost);
        };
        if self.hosts.is_empty() && self.networks.is_empty() {
            // A CA alone decides; nothing at all admits nothing.
            return if self.ca_bundle.is_some() {
                Ok(())
            } else {
                Err(Outside::NotListed)
            };
        }
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(if plain { 80 } else { 443 });
        let by_host = self
            .hosts
            .iter()
            .any(|pattern| pattern.matches(&host, port));
        let by_network = host.parse::<IpAddr>().is_ok_and(|address| {
            self.networks
                .iter()
                .any(|network| network.contains(&address))
        });
        if by_host || by_network {
            Ok(())
        } else {
            Err(Outside::NotListed)
        }
    }

    /// The bundle as a kubeconfig's `certificate-authority-data`.
    pub fn ca_data(&self) -> Option<String> {
        self.ca_bundle
            .as_ref()
            .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem))
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
            assert_eq!(servers.check(admitted), Ok(()), "{admitted}");
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
        assert_eq!(servers.check("https://anything.example:6443"), Ok(()));
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
