//! What a kubeconfig may make this process do, decided before anything in
//! it is run, opened or dialled.
//!
//! A kubeconfig is more than a server and a credential. It can name a
//! command to run (an exec credential plugin), local files to read (a token
//! file, a CA, a client certificate and key), an auth provider and a proxy,
//! and it can turn TLS verification off. In a kubeconfig the operator wrote,
//! that is convenience. In one read from a cluster object (a kubeconfig
//! Secret, Cluster API's `<name>-kubeconfig` Secret, a ClusterProfile), it
//! lets whoever may write that object run commands as the controller, or
//! have it send one of its files (in a pod, its own service account token)
//! as a bearer token to a server of their choosing.
//!
//! A [`KubeconfigPolicy`] says which of these a kubeconfig may use.
//! [`crate::build`] checks the context it is about to use (its
//! cluster and its user) against the policy first; a kubeconfig that uses
//! anything the policy does not allow is refused as a whole with
//! [`Error::KubeconfigRefused`], which names each refused field and the
//! policy field that would allow it, never the field's value.
//!
//! Which policy applies is the provider's choice, by who wrote the
//! kubeconfig:
//!
//! | source | default |
//! |---|---|
//! | cluster objects: kubeconfig Secrets, Cluster API Secrets, ClusterProfile Secrets and status | [`KubeconfigPolicy::untrusted`] (also `Default`): nothing beyond a server, inline CA data and inline credentials |
//! | what the operator gave the process: kubeconfig files, the kind CLI, a ClusterProfile provider file's plugins | [`KubeconfigPolicy::trusted`]: everything, as kubectl allows |
//!
//! Exec plugins can also be allowed one command at a time
//! ([`ExecPolicy::allowlist`]), as client-go's credential plugin policy
//! (Kubernetes 1.35) allows them: by absolute path, a bare command name
//! being looked up on `PATH` and run from the path it was found at.

mod exec;
mod refusal;
mod server_url;
mod servers;

use kube::config::{AuthInfo, Kubeconfig};
use secrecy::ExposeSecret;

pub use exec::{AllowedPlugin, Allowlist, ExecPolicy};
use exec::{environment_names, resolve};
pub(crate) use refusal::describe;
pub use refusal::{Refusal, Refused};
pub use server_url::BadServer;
pub use servers::Servers;

/// What a kubeconfig may use beyond a server, inline CA data and inline
/// credentials (a token, basic auth, client certificate and key data).
/// Build it from [`KubeconfigPolicy::untrusted`] (the `Default`) or
/// [`KubeconfigPolicy::trusted`] and the setters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct KubeconfigPolicy {
    /// Which exec credential plugins (`users[].user.exec`) may run.
    pub exec: ExecPolicy,
    /// Whether files may be named: `tokenFile`, `client-certificate`,
    /// `client-key` of the user, `certificate-authority` of the cluster.
    /// They are read by this process and, for a token, sent to the server.
    pub local_files: bool,
    /// Whether `users[].user.auth-provider` may be used.
    pub auth_providers: bool,
    /// Whether `clusters[].cluster.insecure-skip-tls-verify: true` may
    /// turn off the verification of the server's certificate.
    pub insecure_skip_tls_verify: bool,
    /// Whether `clusters[].cluster.proxy-url` may pick the proxy the
    /// member is reached through. (`HTTPS_PROXY` and `NO_PROXY` from the
    /// environment are the operator's and always apply.)
    pub proxy_url: bool,
    /// Whether `clusters[].cluster.server` may be a plain `http://` URL,
    /// over which the kubeconfig's credentials travel in the clear (a
    /// `kubectl proxy` on loopback, say).
    pub plain_http: bool,
}

multicluster_core::option_setters!(KubeconfigPolicy {
    exec: ExecPolicy,
    local_files: bool,
    auth_providers: bool,
    insecure_skip_tls_verify: bool,
    proxy_url: bool,
    plain_http: bool,
});

impl Default for KubeconfigPolicy {
    fn default() -> Self {
        Self::untrusted()
    }
}

impl KubeconfigPolicy {
    /// For kubeconfigs read from cluster objects: no exec plugin, no local
    /// file, no auth provider, no skipping TLS verification, no proxy URL,
    /// no plain HTTP.
    pub fn untrusted() -> Self {
        Self {
            exec: ExecPolicy::DenyAll,
            local_files: false,
            auth_providers: false,
            insecure_skip_tls_verify: false,
            proxy_url: false,
            plain_http: false,
        }
    }

    /// For kubeconfigs the operator wrote: everything kubectl would use.
    pub fn trusted() -> Self {
        Self {
            exec: ExecPolicy::AllowAll,
            local_files: true,
            auth_providers: true,
            insecure_skip_tls_verify: true,
            proxy_url: true,
            plain_http: true,
        }
    }

    /// Checks `kubeconfig`, already cut to one context (its cluster and at
    /// most one user), and returns what to build from: the same, with an
    /// allowlisted plugin's command replaced by the path it was found at,
    /// so that what runs is what was checked, and the CA of the servers it
    /// is bound to, if any. Every refused field is named. Credentials that
    /// cannot be sent in a header are refused whatever the policy.
    pub(crate) fn admit(&self, mut kubeconfig: Kubeconfig) -> Result<Kubeconfig, Vec<Refusal>> {
        let mut refused = Vec::new();
        for named in &kubeconfig.clusters {
            let Some(cluster) = &named.cluster else {
                continue;
            };
            let at = |key: &str| format!("clusters[{:?}].cluster.{key}", named.name);
            // Whatever the policy: a client on such a server panics or
            // cannot send a request.
            if let Err(bad) = BadServer::check(cluster.server.as_deref()) {
                refused.push(Refusal::new(at("server"), Refused::InvalidServer(bad)));
                continue;
            }
            if !self.plain_http
                && cluster
                    .server
                    .as_deref()
                    .is_some_and(|server| server.trim().to_ascii_lowercase().starts_with("http://"))
            {
                refused.push(Refusal::new(at("server"), Refused::PlainHttp));
            }
            if !self.local_files && is_set(&cluster.certificate_authority) {
                refused.push(Refusal::new(
                    at("certificate-authority"),
                    Refused::LocalFile,
                ));
            }
            if !self.insecure_skip_tls_verify && cluster.insecure_skip_tls_verify == Some(true) {
                refused.push(Refusal::new(
                    at("insecure-skip-tls-verify"),
                    Refused::InsecureSkipTlsVerify,
                ));
            }
            if !self.proxy_url && is_set(&cluster.proxy_url) {
                refused.push(Refusal::new(at("proxy-url"), Refused::ProxyUrl));
            }
        }
        let mut bound = None;
        for named in &mut kubeconfig.auth_infos {
            let Some(user) = &mut named.auth_info else {
                continue;
            };
            let at = |key: &str| format!("users[{:?}].user.{key}", named.name);
            check_credentials(user, &at, &mut refused);
            bound = bound.or(self.check_user(user, at, &mut refused));
        }
        if let Some(servers) = bound {
            bind(&mut kubeconfig, &servers, &mut refused);
        }
        if refused.is_empty() {
            Ok(kubeconfig)
        } else {
            Err(refused)
        }
    }

    /// Checks what `user` may make this process do; returns the servers
    /// its allowlisted plugin is bound to, if it has one.
    fn check_user(
        &self,
        user: &mut AuthInfo,
        at: impl Fn(&str) -> String,
        refused: &mut Vec<Refusal>,
    ) -> Option<Servers> {
        if !self.local_files {
            for (key, value) in [
                ("tokenFile", &user.token_file),
                ("client-certificate", &user.client_certificate),
                ("client-key", &user.client_key),
            ] {
                if is_set(value) {
                    refused.push(Refusal::new(at(key), Refused::LocalFile));
                }
            }
        }
        if !self.auth_providers && user.auth_provider.is_some() {
            refused.push(Refusal::new(at("auth-provider"), Refused::AuthProvider));
        }
        let exec = user.exec.as_mut()?;
        match &self.exec {
            ExecPolicy::AllowAll => None,
            ExecPolicy::DenyAll => {
                refused.push(Refusal::new(at("exec"), Refused::Exec));
                None
            }
            ExecPolicy::Allowlist(allowlist) => {
                let command = exec.command.as_deref().unwrap_or_default();
                let plugin = match resolve(command) {
                    None => {
                        refused.push(Refusal::new(at("exec.command"), Refused::ExecUnresolved));
                        None
                    }
                    Some(path) => match allowlist.plugin(&path) {
                        None => {
                            refused.push(Refusal::new(at("exec.command"), Refused::ExecNotAllowed));
                            None
                        }
                        Some(plugin) => {
                            exec.command = Some(path.to_string_lossy().into_owned());
                            Some(plugin)
                        }
                    },
                };
                // Only the variables the operator named: a list of what
                // may not be set always misses the next variable that
                // steers a plugin (its proxy, its CA, its config file).
                for variable in environment_names(exec.env.as_deref()) {
                    if plugin.is_none_or(|plugin| !plugin.allowed_env().contains(variable)) {
                        refused.push(Refusal::new(
                            at("exec.env"),
                            Refused::ExecEnvironment(variable.to_string()),
                        ));
                    }
                }
                plugin.and_then(|plugin| plugin.bound_servers().cloned())
            }
        }
    }
}

/// Refuses credentials that cannot be sent in a header: kube-rs panics on
/// a bearer token that is no header value, and a basic-auth value with a
/// control character is no credential anyone meant.
fn check_credentials(user: &AuthInfo, at: &impl Fn(&str) -> String, refused: &mut Vec<Refusal>) {
    let header = |value: &str| http::HeaderValue::from_str(value).is_ok();
    let printable = |value: &str| !value.chars().any(char::is_control);
    let mut invalid = |key: &str| refused.push(Refusal::new(at(key), Refused::InvalidCredential));
    if user
        .token
        .as_ref()
        .is_some_and(|token| !header(&format!("Bearer {}", token.expose_secret())))
    {
        invalid("token");
    }
    if user
        .username
        .as_deref()
        .is_some_and(|name| !printable(name))
    {
        invalid("username");
    }
    if user
        .password
        .as_ref()
        .is_some_and(|password| !printable(password.expose_secret()))
    {
        invalid("password");
    }
    if user
        .impersonate
        .as_deref()
        .is_some_and(|value| !header(value))
    {
        invalid("as");
    }
    if user
        .impersonate_uid
        .as_deref()
        .is_some_and(|value| !header(value))
    {
        invalid("as-uid");
    }
    if user
        .impersonate_groups
        .iter()
        .flatten()
        .any(|group| !header(group))
    {
        invalid("as-groups");
    }
    if user
        .impersonate_user_extra
        .iter()
        .flatten()
        .flat_map(|(_, values)| values)
        .any(|value| !header(value))
    {
        invalid("as-user-extra");
    }
}

/// Holds the kubeconfig's cluster to `servers`: its server must be inside
/// them, and a CA of theirs replaces the cluster's own (verification on).
fn bind(kubeconfig: &mut Kubeconfig, servers: &Servers, refused: &mut Vec<Refusal>) {
    for named in &mut kubeconfig.clusters {
        let Some(cluster) = &mut named.cluster else {
            continue;
        };
        let server = cluster.server.clone().unwrap_or_default();
        if !servers.admits(&server) {
            refused.push(Refusal::new(
                format!("clusters[{:?}].cluster.server", named.name),
                Refused::ServerNotBound,
            ));
        }
        if let Some(ca) = servers.ca_data_for(&server) {
            cluster.certificate_authority_data = Some(ca);
            cluster.certificate_authority = None;
            cluster.insecure_skip_tls_verify = Some(false);
        }
    }
}

fn is_set(value: &Option<String>) -> bool {
    value.as_deref().is_some_and(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeconfig::parse;

    const EVERYTHING: &str = "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: https://203.0.113.1:6443\n    certificate-authority: /etc/ca.pem\n    insecure-skip-tls-verify: true\n    proxy-url: http://203.0.113.9:3128\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n    client-certificate: /etc/cert.pem\n    client-key: /etc/key.pem\n    auth-provider:\n      name: oidc\n      config:\n        id-token: x\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"id > /tmp/mark\"]\n";

    fn fields(refused: &[Refusal]) -> Vec<&str> {
        refused.iter().map(|r| r.field.as_str()).collect()
    }

    #[test]
    fn an_untrusted_kubeconfig_is_refused_for_every_field_it_may_not_use() {
        let kubeconfig = parse(EVERYTHING, "test").expect("parses");
        let refused = KubeconfigPolicy::default()
            .admit(kubeconfig)
            .expect_err("refused");
        assert_eq!(
            fields(&refused),
            [
                r#"clusters["c"].cluster.certificate-authority"#,
                r#"clusters["c"].cluster.insecure-skip-tls-verify"#,
                r#"clusters["c"].cluster.proxy-url"#,
                r#"users["u"].user.tokenFile"#,
                r#"users["u"].user.client-certificate"#,
                r#"users["u"].user.client-key"#,
                r#"users["u"].user.auth-provider"#,
                r#"users["u"].user.exec"#,
            ]
        );
        let text = describe(&refused);
        for value in [
            "/etc/ca.pem",
            "203.0.113.9",
            "serviceaccount",
            "/bin/sh",
            "mark",
        ] {
            assert!(!text.contains(value), "quotes {value}: {text}");
        }
        for option in [
            "KubeconfigPolicy::local_files",
            "KubeconfigPolicy::insecure_skip_tls_verify",
            "KubeconfigPolicy::proxy_url",
            "KubeconfigPolicy::auth_providers",
            "KubeconfigPolicy::exec",
        ] {
            assert!(text.contains(option), "names {option}: {text}");
        }
    }

    #[test]
    fn a_trusted_kubeconfig_keeps_everything() {
        let kubeconfig = parse(EVERYTHING, "test").expect("parses");
        let admitted = KubeconfigPolicy::trusted()
            .admit(kubeconfig.clone())
            .expect("admitted");
        assert_eq!(
            crate::kubeconfig::canonical_text(&admitted),
            crate::kubeconfig::canonical_text(&kubeconfig)
        );
    }

    #[test]
    fn inline_data_and_empty_fields_are_not_refused() {
        let text = "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: https://203.0.113.1:6443\n    certificate-authority-data: Q0E=\n    certificate-authority: \"\"\n    insecure-skip-tls-verify: false\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n";
        let kubeconfig = parse(text, "test").expect("parses");
        KubeconfigPolicy::untrusted()
            .admit(kubeconfig)
            .expect("nothing to refuse");
    }

    #[test]
    fn an_allowlist_admits_its_commands_by_path_or_name_and_runs_the_path() {
        let directory = tempfile::tempdir().expect("dir");
        let plugin = directory.path().join("fleet-credentials");
        std::fs::write(&plugin, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let policy = KubeconfigPolicy::untrusted()
            .exec(ExecPolicy::allowlist([plugin.clone()]).expect("valid"));
        let with = |command: &str, env: &str| {
            parse(
                &format!("apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: https://203.0.113.1:6443\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {command}\n      env: {env}\n"),
                "test",
            )
            .expect("parses")
        };
        let command_of = |kubeconfig: Kubeconfig| {
            kubeconfig.auth_infos[0]
                .auth_info
                .as_ref()
                .and_then(|user| user.exec.as_ref())
                .and_then(|exec| exec.command.clone())
        };
        let admitted = policy
            .admit(with(&plugin.display().to_string(), "[]"))
            .expect("by its path");
        assert_eq!(command_of(admitted), Some(plugin.display().to_string()));

        // Found on PATH: runs from where it was found. (PATH is read, not
        // changed: the test's directory is not on it, so a bare name of a
        // command that PATH has, but the allowlist not, is refused.)
        let refused = policy.admit(with("sh", "[]")).expect_err("not allowlisted");
        assert_eq!(refused[0].refused, Refused::ExecNotAllowed);
        let system = KubeconfigPolicy::untrusted()
            .exec(ExecPolicy::allowlist([resolve("sh").expect("sh on PATH")]).expect("valid"));
        let admitted = system.admit(with("sh", "[]")).expect("found on PATH");
        assert_eq!(
            command_of(admitted).map(std::path::PathBuf::from),
            resolve("sh"),
            "runs the path that was checked"
        );

        for relative in [
            "./fleet-credentials",
            "bin/fleet-credentials",
            "no-such-command-here",
        ] {
            let refused = policy.admit(with(relative, "[]")).expect_err(relative);
            assert_eq!(refused[0].refused, Refused::ExecUnresolved, "{relative}");
        }
        // Only the variables named for the plugin, never one that changes
        // its code: HTTPS_PROXY would steer its own credential traffic.
        let named = KubeconfigPolicy::untrusted().exec(ExecPolicy::Allowlist(
            Allowlist::of([AllowedPlugin::new(plugin.clone())
                .expect("path")
                .env(["REGION"])
                .expect("name")])
            .expect("one plugin"),
        ));
        let refused = named
            .admit(with(
                &plugin.display().to_string(),
                "[{name: LD_PRELOAD, value: /tmp/x.so}, {name: REGION, value: eu}, {name: HTTPS_PROXY, value: http://203.0.113.7:3128}]",
            ))
            .expect_err("variables not named");
        assert_eq!(
            refused,
            ["LD_PRELOAD", "HTTPS_PROXY"].map(|variable| Refusal::new(
                r#"users["u"].user.exec.env"#.to_string(),
                Refused::ExecEnvironment(variable.to_string())
            ))
        );
        let text = describe(&refused);
        assert!(
            !text.contains("/tmp/x.so") && !text.contains("203.0.113.7"),
            "{text}"
        );
        assert!(text.contains("AllowedPlugin::env"), "{text}");
        named
            .admit(with(
                &plugin.display().to_string(),
                "[{name: REGION, value: eu}]",
            ))
            .expect("a named variable");
        let refused = policy
            .admit(with(
                &plugin.display().to_string(),
                "[{name: REGION, value: eu}]",
            ))
            .expect_err("no variable named for the plugin");
        assert_eq!(
            refused[0].refused,
            Refused::ExecEnvironment("REGION".to_string())
        );
    }

    /// A kubeconfig running `plugin` against `server`.
    fn plugin_against(plugin: &std::path::Path, server: &str) -> Kubeconfig {
        parse(
            &format!("apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: Q0E=\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n", plugin.display()),
            "test",
        )
        .expect("parses")
    }

    #[test]
    fn a_bound_plugin_runs_only_against_its_servers() {
        let plugin = std::path::PathBuf::from("/usr/local/bin/aws-iam-authenticator");
        let bound = |servers: Servers| {
            KubeconfigPolicy::untrusted().exec(ExecPolicy::Allowlist(
                Allowlist::of([AllowedPlugin::new(plugin.clone())
                    .expect("path")
                    .servers(servers)])
                .expect("one"),
            ))
        };
        let eks = bound(Servers::from_patterns(["*.eks.amazonaws.com"]).expect("pattern"));
        eks.admit(plugin_against(
            &plugin,
            "https://abc.gr7.eu-west-1.eks.amazonaws.com",
        ))
        .expect("inside the binding");
        let refused = eks
            .admit(plugin_against(&plugin, "https://203.0.113.50:6443"))
            .expect_err("outside");
        assert_eq!(
            refused,
            [Refusal::new(
                r#"clusters["c"].cluster.server"#.to_string(),
                Refused::ServerNotBound
            )]
        );
        assert!(!describe(&refused).contains("203.0.113.50"));

        // A CA binding replaces the kubeconfig's CA and turns verification on.
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let admitted = bound(Servers::new().ca_bundle(pem).expect("pem"))
            .admit(plugin_against(&plugin, "https://anywhere.example:6443"))
            .expect("any server, verified against the bundle");
        let cluster = admitted.clusters[0].cluster.as_ref().expect("cluster");
        use base64::Engine;
        assert_eq!(
            cluster.certificate_authority_data.as_deref(),
            Some(
                base64::engine::general_purpose::STANDARD
                    .encode(pem)
                    .as_str()
            )
        );
        assert_eq!(cluster.insecure_skip_tls_verify, Some(false));
    }

    #[test]
    fn plain_http_is_a_policy_field() {
        let text = "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: HTTP://127.0.0.1:8001\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n";
        let refused = KubeconfigPolicy::untrusted()
            .admit(parse(text, "test").expect("parses"))
            .expect_err("in the clear");
        assert_eq!(refused[0].refused, Refused::PlainHttp);
        assert!(describe(&refused).contains("KubeconfigPolicy::plain_http"));
        KubeconfigPolicy::untrusted()
            .plain_http(true)
            .admit(parse(text, "test").expect("parses"))
            .expect("allowed");
    }

    #[test]
    fn credentials_that_are_no_header_value_are_refused_whatever_the_policy() {
        for (key, value) in [
            ("token", "\"VALUE\\r\\nX-Injected: 1\""),
            ("token", "\"VALUE\\0def\""),
            ("password", "\"VALUE\\r\\nword\""),
            ("username", "\"VALUE\\nmin\""),
            ("as", "\"VALUE:admin\\r\\n\""),
        ] {
            let extra = if key == "password" {
                "\n    username: admin"
            } else if key == "username" {
                "\n    password: secret"
            } else {
                ""
            };
            let text = format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    {key}: {value}{extra}\n"
            );
            let refused = KubeconfigPolicy::trusted()
                .admit(parse(&text, "test").expect("parses"))
                .expect_err(key);
            assert_eq!(
                refused,
                [Refusal::new(
                    format!(r#"users["u"].user.{key}"#),
                    Refused::InvalidCredential
                )],
                "{key}"
            );
            let described = describe(&refused);
            assert!(!described.contains("VALUE"), "{described}");
        }
    }
}
