//! The member-client stack: a kubeconfig and a [`KubeconfigPolicy`] in,
//! a bounded, retrying, budgeted `kube::Client` out.
//!
//! [`build`] takes a kubeconfig in this order, and nothing in it is run,
//! read or dialled before the step that allows it:
//!
//! 1. the context is cut out (its cluster and its user), naming a missing
//!    piece;
//! 2. the [`KubeconfigPolicy`] the provider chose for the kubeconfig's
//!    source checks it: exec plugins, local files, auth providers,
//!    skipping TLS verification and proxy URLs are refused unless allowed
//!    ([`Error::KubeconfigRefused`]);
//! 3. kube-rs reads the rest (and the files the policy allowed), and the
//!    proxy is picked per member, as client-go picks it;
//! 4. an exec plugin (run by us, [`credentials`]) runs once under its
//!    deadline;
//! 5. the client is stacked: the HTTP/2 connection with pings and a
//!    connect deadline, retries of throttled requests and of reads whose
//!    connection broke, the request deadline and health record
//!    (`bounded`, read into the cluster's health), and the request budget ([`budget`]).

use std::io::IsTerminal;
use std::time::Duration;

use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use secrecy::ExposeSecret;

use crate::bounded::BoundedLayer;
use budget::{Budget, BudgetLayer};
use credentials::Plugin;
use kubeconfig::{context_only, invalid};
use multicluster_core::health::Requests;

mod bounded;
pub mod budget;
mod connection;
pub mod credentials;
mod error;
pub mod kubeconfig;
mod options;
mod pace;
pub(crate) mod policy;
pub mod process;
mod proxy;
mod resend;
mod shared_pool;
mod tunnel;
mod withhold;

pub use error::Error;
pub use options::ClientOptions;
pub use policy::{
    AllowedPlugin, Allowlist, BadServer, ExecPolicy, KubeconfigPolicy, Refusal, Refused, Servers,
};

/// Builds a client for `context` (the current context when `None`),
/// checking first that the context, its cluster and its user exist so the
/// error can name the missing piece, then that `policy` allows everything
/// they use ([`Error::KubeconfigRefused`] otherwise).
///
/// An exec credential plugin runs once, here, under
/// [`ClientOptions::plugin_timeout`]; the client runs it again only when its
/// token is about to expire or the server refuses it (see
/// [`credentials`]). Dropping the returned future stops the plugin.
/// Requests get the deadlines of `options`.
pub async fn build(
    kubeconfig: &Kubeconfig,
    context: Option<&str>,
    source: &str,
    policy: &KubeconfigPolicy,
    options: &ClientOptions,
) -> Result<kube::Client, Error> {
    Ok(
        client_with_requests(kubeconfig, context, source, policy, options)
            .await?
            .0,
    )
}

/// [`build`], and the record of how its requests end, which the runtime
/// reads into the cluster's health.
pub async fn client_with_requests(
    kubeconfig: &Kubeconfig,
    context: Option<&str>,
    source: &str,
    policy: &KubeconfigPolicy,
    options: &ClientOptions,
) -> Result<(kube::Client, Requests), Error> {
    let context_name = match context {
        Some(name) => name.to_string(),
        None => kubeconfig
            .current_context
            .clone()
            .filter(|name| !name.is_empty())
            .ok_or_else(|| invalid(source, "it has no current-context"))?,
    };
    let at = Origin {
        source,
        context: &context_name,
    };
    let (only, user) = at.admitted(kubeconfig, policy)?;
    let mut config = at.config(only, &user).await?;
    config.connect_timeout = options.connect_timeout;
    let plugin = plugin_of(&mut config.auth_info, options.plugin_timeout)
        .map(|plugin| plugin.showing_stderr(options.plugin_stderr));
    let requests = Requests::default();
    let values = withhold::CredentialValues::default();
    held_values(&config.auth_info, &values);
    let connect = at.connector(config, options, requests.clone(), values.clone())?;
    let Some(plugin) = plugin else {
        return Ok((connect(None)?, requests));
    };
    match plugin.run().await {
        Ok(first) => Ok((
            credentials::authenticated(connect, plugin, first, requests.clone(), values)?,
            requests,
        )),
        Err(err) => Err(Error::Credentials {
            origin: source.to_string(),
            user: format!("context {context_name:?}, user {user:?}"),
            source: err.into(),
        }),
    }
}

/// Where a kubeconfig came from and the context it is used through: what
/// every error of a build names.
struct Origin<'a> {
    source: &'a str,
    context: &'a str,
}

impl Origin<'_> {
    fn invalid(&self, reason: impl std::fmt::Display) -> Error {
        invalid(
            self.source,
            &format!("context {:?}: {reason}", self.context),
        )
    }

    /// The context cut out of `kubeconfig` (its cluster and its user,
    /// checked first so that the error names a missing piece) and admitted
    /// by `policy`, and the user's name.
    fn admitted(
        &self,
        kubeconfig: &Kubeconfig,
        policy: &KubeconfigPolicy,
    ) -> Result<(Kubeconfig, String), Error> {
        let only = context_only(kubeconfig, self.context, self.source)?;
        let only = policy
            .admit(only)
            .map_err(|refused| Error::KubeconfigRefused {
                origin: self.source.to_string(),
                context: self.context.to_string(),
                refused,
            })?;
        let user = only
            .auth_infos
            .first()
            .map(|named| named.name.clone())
            .unwrap_or_default();
        Ok((only, user))
    }

    /// kube-rs's config of the admitted context (reading the files the
    /// policy allowed), with the proxy picked as client-go picks it.
    async fn config(&self, only: Kubeconfig, user: &str) -> Result<kube::Config, Error> {
        let proxy_url = only
            .clusters
            .first()
            .and_then(|named| named.cluster.as_ref())
            .and_then(|cluster| cluster.proxy_url.clone());
        let kube_options = KubeConfigOptions {
            context: Some(self.context.to_string()),
            ..KubeConfigOptions::default()
        };
        let mut config = kube::Config::from_custom_kubeconfig(only, &kube_options)
            .await
            .map_err(|err| self.invalid(err))?;
        if runs_command_unattended(&config.auth_info) {
            return Err(invalid(
                self.source,
                &format!(
                    "context {:?} (user {user:?}): the gcp auth provider's cmd-path runs a command that cannot be given a deadline or stopped; use an exec credential plugin (gke-gcloud-auth-plugin) instead, as client-go has required since Kubernetes 1.26",
                    self.context
                ),
            ));
        }
        // kube-rs matches NO_PROXY against the proxy, not the member.
        config.proxy_url = proxy::for_server(&config.cluster_url, proxy_url.as_deref())
            .map_err(|reason| self.invalid(reason))?;
        Ok(config)
    }

    /// What builds the client from `config`, with a client certificate
    /// from the plugin when it hands out one (again at each renewal): the
    /// connection, the request deadline and health record, the budget.
    fn connector(
        &self,
        config: kube::Config,
        options: &ClientOptions,
        requests: Requests,
        values: withhold::CredentialValues,
    ) -> Result<credentials::Connect, Error> {
        let budget = match options.request_budget {
            Some(budget) if !budget.is_valid() => {
                return Err(Error::InvalidOptions {
                    component: "client options".to_string(),
                    reason: format!(
                        "a request budget needs a positive qps and a burst of at least 1, not {budget:?}"
                    ),
                });
            }
            budget => budget.map(|budget| BudgetLayer(Budget::new(budget))),
        };
        let server: std::sync::Arc<str> =
            multicluster_core::redact::without_userinfo(&config.cluster_url).into();
        let (source, context) = (self.source.to_string(), self.context.to_string());
        let (timeout, http2) = (options.request_timeout, options.http2);
        Ok(std::sync::Arc::new(move |certificate| {
            let mut config = config.clone();
            if let Some((certificate, key)) = certificate {
                use base64::Engine;
                let encode = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
                config.auth_info.client_certificate_data = Some(encode(certificate));
                config.auth_info.client_key_data = Some(encode(key.expose_secret()).into());
            }
            let layer = BoundedLayer {
                timeout,
                requests: requests.clone(),
                server: server.clone(),
            };
            // Outside the deadline: waiting for the budget is not the
            // server's slowness.
            connection::builder(config, http2, values.clone())
                .map(|builder| {
                    builder
                        .with_layer(&layer)
                        .with_layer(&tower::util::option_layer(budget.clone()))
                        .build()
                })
                .map_err(|err| {
                    Origin {
                        source: &source,
                        context: &context,
                    }
                    .invalid(multicluster_core::redact::kube_error(&err))
                })
        }))
    }
}

/// Withholds the credential values `auth` sends from the member's error
/// answers: its token, its basic-auth password and the header made of it,
/// its client key (as written and decoded).
fn held_values(auth: &AuthInfo, values: &withhold::CredentialValues) {
    use base64::Engine;
    let base64 = base64::engine::general_purpose::STANDARD;
    if let Some(token) = &auth.token {
        values.add(token.expose_secret());
    }
    if let Some(password) = &auth.password {
        values.add(password.expose_secret());
        let user = auth.username.as_deref().unwrap_or_default();
        values.add(&base64.encode(format!("{user}:{}", password.expose_secret())));
    }
    if let Some(key) = &auth.client_key_data {
        values.add(key.expose_secret());
        if let Ok(pem) = base64.decode(key.expose_secret().trim()) {
            values.add(&String::from_utf8_lossy(&pem));
        }
    }
}

/// Whether kube-rs would run a command of `auth`'s synchronously while
/// building the client: the legacy gcp auth provider's `cmd-path`, with no
/// deadline and no way to stop it. Exec plugins are run by us instead.
fn runs_command_unattended(auth: &AuthInfo) -> bool {
    auth.auth_provider.as_ref().is_some_and(|provider| {
        provider.name == "gcp"
            && provider.config.contains_key("cmd-path")
            && !provider.config.contains_key("id-token")
    })
}

/// Takes the exec plugin out of `auth`, so kube-rs builds the client without
/// running it, when the plugin is what authenticates: kube-rs (like
/// client-go) prefers an auth provider, basic auth, a token or a token file.
fn plugin_of(auth: &mut AuthInfo, timeout: Duration) -> Option<Plugin> {
    let other_credentials = auth.auth_provider.is_some()
        || (auth.username.is_some() && auth.password.is_some())
        || auth.token.is_some()
        || auth.token_file.is_some();
    if other_credentials {
        return None;
    }
    Plugin::new(auth.exec.take()?, std::io::stdin().is_terminal(), timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeconfig::parse;

    const SECRET_TOKEN: &str = "very-secret-token-value";

    fn kubeconfig(current: &str, cluster: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: {current}\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: ctx\n  context:\n    cluster: {cluster}\n    user: {user}\nusers:\n- name: u\n  user:\n    token: {SECRET_TOKEN}\n"
        )
    }

    #[tokio::test]
    async fn broken_kubeconfigs_are_named_and_never_quoted() {
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "empty"),
            (
                format!("token: [{SECRET_TOKEN}"),
                "not valid kubeconfig YAML",
            ),
            ("just: a map\n".into(), "not a kubeconfig"),
            (
                format!("clusters: {SECRET_TOKEN}\n"),
                "not valid kubeconfig YAML",
            ),
            (kubeconfig("", "c", "u"), "no current-context"),
            (
                kubeconfig("other", "c", "u"),
                "context \"other\" does not exist",
            ),
            (kubeconfig("ctx", "missing", "u"), "cluster \"missing\""),
            (kubeconfig("ctx", "c", "nobody"), "user \"nobody\""),
            (
                kubeconfig("ctx", "c", "u").replace(
                    &format!("    token: {SECRET_TOKEN}\n"),
                    "    auth-provider:\n      name: gcp\n      config:\n        cmd-path: /usr/bin/gcloud\n",
                ),
                "gcp auth provider's cmd-path",
            ),
        ];
        for (text, expected) in cases {
            let result = match parse(&text, "Secret fleet/prod key kubeconfig") {
                Ok(parsed) => build(
                    &parsed,
                    None,
                    "Secret fleet/prod key kubeconfig",
                    &KubeconfigPolicy::trusted(),
                    &ClientOptions::default(),
                )
                .await
                .map(|_| ()),
                Err(err) => Err(err),
            };
            let err = result.expect_err(expected);
            assert!(!err.is_retryable(), "{err} needs a change, not a retry");
            let message = err.to_string();
            assert!(
                message.contains("Secret fleet/prod key kubeconfig"),
                "{message}"
            );
            assert!(
                message.contains(expected),
                "{message} should say {expected}"
            );
            assert!(
                !message.contains(SECRET_TOKEN),
                "credentials leaked: {message}"
            );
        }
    }

    /// A kubeconfig whose user runs `command` with `args`, a secret in its
    /// env, and `state` as the envtest plugins' state directory.
    fn exec_kubeconfig(command: &str, args: &[&str], state: &std::path::Path) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {command}\n      args: {args:?}\n      interactiveMode: Never\n      env:\n      - name: API_KEY\n        value: {SECRET_TOKEN}\n      - name: STATE_DIR\n        value: {}\n",
            state.display()
        )
    }

    #[tokio::test]
    async fn a_failing_credential_plugin_is_named_and_its_secrets_are_not_quoted() {
        let command = multicluster_envtest::plugins::REFUSE.to_string();
        let state = tempfile::tempdir().expect("state dir");
        let text = exec_kubeconfig(&command, &["--password=very-secret-argument"], state.path());
        let parsed = parse(&text, "Secret fleet/prod key kubeconfig").expect("parses");
        let err = build(
            &parsed,
            None,
            "Secret fleet/prod key kubeconfig",
            &KubeconfigPolicy::trusted(),
            &ClientOptions::default(),
        )
        .await
        .map(|_| ())
        .expect_err("the plugin fails");
        assert!(err.is_retryable(), "a plugin may work next time: {err}");
        let message = err.to_string();
        for expected in [
            "Secret fleet/prod key kubeconfig",
            "user \"u\"",
            command.as_str(),
            "exit status: 1",
            "stderr is withheld",
        ] {
            assert!(
                message.contains(expected),
                "{message} should say {expected}"
            );
        }
        for withheld in [
            SECRET_TOKEN,
            "very-secret-argument",
            "identity service: no grant for this cluster",
        ] {
            assert!(!message.contains(withheld), "leaked {withheld}: {message}");
        }

        // Asked for, the plugin's last stderr line explains the failure.
        let shown = build(
            &parsed,
            None,
            "Secret fleet/prod key kubeconfig",
            &KubeconfigPolicy::trusted(),
            &ClientOptions::default().plugin_stderr(true),
        )
        .await
        .map(|_| ())
        .expect_err("the plugin fails")
        .to_string();
        assert!(
            shown.contains("identity service: no grant for this cluster"),
            "{shown}"
        );
        assert!(!shown.contains(SECRET_TOKEN), "{shown}");
    }

    /// On a single-threaded runtime a held plugin can only be released if
    /// waiting for it leaves the runtime free.
    #[tokio::test(flavor = "current_thread")]
    async fn a_held_plugin_does_not_hold_the_runtime() {
        use multicluster_envtest::plugins;
        let state = tempfile::tempdir().expect("state dir");
        plugins::set_token(state.path(), "from-plugin").expect("token");
        plugins::hold(state.path()).expect("hold");
        let text = exec_kubeconfig(plugins::TOKEN, &[], state.path());
        let parsed = parse(&text, "test").expect("parses");
        let options = ClientOptions::default();
        let policy = KubeconfigPolicy::trusted();
        let (built, ()) = tokio::join!(build(&parsed, None, "test", &policy, &options), async {
            plugins::release(state.path()).expect("release");
        });
        built.expect("the plugin was released and gave a token");
    }

    #[tokio::test]
    async fn a_client_build_runs_the_plugin_once() {
        use multicluster_envtest::plugins;
        let state = tempfile::tempdir().expect("state dir");
        plugins::set_token(state.path(), "from-plugin").expect("token");
        let text = exec_kubeconfig(plugins::TOKEN, &["--region", "eu-1"], state.path());
        let parsed = parse(&text, "test").expect("parses");
        build(
            &parsed,
            None,
            "test",
            &KubeconfigPolicy::trusted(),
            &ClientOptions::default(),
        )
        .await
        .expect("client");
        let calls = plugins::calls(state.path());
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert!(calls[0].contains("args=--region eu-1"), "{calls:?}");
        assert!(
            calls[0].contains(r#""kind":"ExecCredential""#)
                && calls[0].contains(r#""interactive":false"#),
            "KUBERNETES_EXEC_INFO as client-go sets it: {calls:?}"
        );
    }

    #[tokio::test]
    async fn a_plugin_that_hangs_fails_the_build_at_its_deadline() {
        use multicluster_envtest::plugins;
        let state = tempfile::tempdir().expect("state dir");
        plugins::set_token(state.path(), "from-plugin").expect("token");
        plugins::hold(state.path()).expect("hold");
        let text = exec_kubeconfig(plugins::TOKEN, &[], state.path());
        let parsed = parse(&text, "Secret fleet/prod key kubeconfig").expect("parses");
        let options = ClientOptions::default().plugin_timeout(Duration::from_millis(500));
        let err = build(
            &parsed,
            None,
            "Secret fleet/prod key kubeconfig",
            &KubeconfigPolicy::trusted(),
            &options,
        )
        .await
        .map(|_| ())
        .expect_err("held");
        assert!(err.is_retryable(), "{err}");
        let message = err.to_string();
        assert!(message.contains("did not finish within 500ms"), "{message}");
        assert!(!message.contains(SECRET_TOKEN), "{message}");
    }

    /// Ten thousand contexts are about 250,000 YAML nodes, the default cap of
    #[tokio::test]
    async fn a_valid_kubeconfig_gives_a_client() {
        let text = kubeconfig("ctx", "c", "u");
        let parsed = parse(&text, "test").expect("parses");
        assert_eq!(parsed.contexts.len(), 1);
        let options = ClientOptions::default();
        build(
            &parsed,
            None,
            "test",
            &KubeconfigPolicy::trusted(),
            &options,
        )
        .await
        .expect("client");
        build(
            &parsed,
            Some("ctx"),
            "test",
            &KubeconfigPolicy::trusted(),
            &options,
        )
        .await
        .expect("named context");
    }
}
