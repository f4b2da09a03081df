//! Turning kubeconfig text from a Secret, a file or a CLI into a client,
//! with errors that name where the kubeconfig came from and what is wrong
//! with it — and never quote it, since it holds credentials.

use std::hash::{Hash, Hasher};
use std::io::IsTerminal;
use std::time::Duration;

use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use secrecy::ExposeSecret;

use crate::cache::Cache;
use crate::health::{BoundedLayer, Requests};
use crate::provider::budget::{Budget, BudgetLayer, RequestBudget};
use crate::provider::credentials::{self, DEFAULT_PLUGIN_TIMEOUT, Plugin};
use crate::provider::member::MemberOptions;
use crate::{Cluster, ClusterName, Error, Inventory};

/// Parses kubeconfig YAML. `source` says where it came from (e.g. `Secret
/// fleet/prod key kubeconfig`) and is used in errors.
///
/// Parser messages are not passed on: they can quote the offending value,
/// which may be a token or a key.
pub fn parse(text: &str, source: &str) -> Result<Kubeconfig, Error> {
    if text.trim().is_empty() {
        return Err(invalid(source, "it is empty"));
    }
    let kubeconfig =
        from_yaml(text).map_err(|_| invalid(source, "it is not valid kubeconfig YAML"))?;
    if kubeconfig.clusters.is_empty() && kubeconfig.contexts.is_empty() {
        return Err(invalid(
            source,
            "it has no clusters and no contexts: not a kubeconfig",
        ));
    }
    Ok(kubeconfig)
}

/// What `Kubeconfig::from_yaml` does (every document, merged), with the
/// parser's limits on nodes, events and scalar text grown to the size of
/// the text: their defaults (250,000 nodes) refuse a kubeconfig of some ten
/// thousand contexts. Every node takes at least a byte, so the limits still
/// bound the work by the input; the caps on aliases and anchors, which stop
/// expansion bombs, stay as they are.
fn from_yaml(text: &str) -> Result<Kubeconfig, Box<dyn std::error::Error>> {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = budget.max_nodes.max(text.len());
    budget.max_events = budget.max_events.max(text.len().saturating_mul(2));
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(text.len());
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    let documents: Vec<Kubeconfig> = serde_saphyr::from_multiple_with_options(text, options)?;
    Ok(documents
        .into_iter()
        .try_fold(Kubeconfig::default(), Kubeconfig::merge)?)
}

/// The names of the contexts in a kubeconfig, in file order.
pub fn context_names(kubeconfig: &Kubeconfig) -> Vec<String> {
    kubeconfig
        .contexts
        .iter()
        .map(|context| context.name.clone())
        .collect()
}

/// How long connecting to an API server (TCP and TLS) may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request that is not long-running may wait for its answer by
/// default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How clients built from kubeconfigs reach their clusters. Every provider
/// that builds clients from kubeconfigs takes these in its options.
///
/// kube-rs sets no read timeout by default, so a request to a server that
/// accepts connections but never answers (a hung or paused process) waits
/// forever; these clients give every request that is not long-running a
/// deadline. Watches, followed logs and exec, attach, port-forward and
/// proxy sessions have none here (a watch ends on the server after its
/// `timeoutSeconds`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientOptions {
    /// How long an exec credential plugin may run before it is stopped and
    /// the attempt fails (default [`DEFAULT_PLUGIN_TIMEOUT`], 60 s). A
    /// failed attempt is that cluster's alone and is retried with backoff.
    pub plugin_timeout: Duration,
    /// How long connecting (TCP and TLS) may take (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], 10 s); `None` waits as long as the
    /// operating system does.
    pub connect_timeout: Option<Duration>,
    /// How long a request that is not long-running may wait for the
    /// response's head, and then for each piece of its body (default
    /// [`DEFAULT_REQUEST_TIMEOUT`], 30 s); `None` waits forever. A request that times out fails with
    /// [`crate::health::RequestTimedOut`] and marks the cluster unreachable
    /// until one is answered again.
    pub request_timeout: Option<Duration>,
    /// Whether to offer HTTP/2 (default `true`): every request and watch
    /// to the cluster then shares one connection, checked with pings
    /// (every 30 s when idle, 15 s to answer, as client-go). With `false`,
    /// or through a proxy, or with a `tls-server-name`, HTTP/1.1 holds a
    /// connection per open watch.
    pub http2: bool,
    /// Whether a credential plugin that fails is described with the last
    /// line of its stderr (default `false`: only its command and exit
    /// status). That line is often the plugin's own explanation, but it is
    /// whatever the plugin printed: some print their environment or the
    /// request they made when they fail, and the kubeconfig's `env:`
    /// entries (often API keys) then reach errors, logs and `/clusters`.
    /// Turn it on only for plugins you know.
    pub plugin_stderr: bool,
    /// How many requests the cluster's clients may send (default `None`:
    /// no budget, as the module [`crate::provider::budget`] explains why);
    /// shared by every client built for the cluster and everything that
    /// uses them. [`RequestBudget::CLIENT_GO`] is client-go's 5 a second,
    /// bursts of 10.
    pub request_budget: Option<RequestBudget>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            plugin_timeout: DEFAULT_PLUGIN_TIMEOUT,
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            http2: true,
            plugin_stderr: false,
            request_budget: None,
        }
    }
}

crate::option_setters!(ClientOptions {
    plugin_timeout: Duration,
    connect_timeout: Option<Duration>,
    request_timeout: Option<Duration>,
    http2: bool,
    plugin_stderr: bool,
    request_budget: Option<RequestBudget>,
});

/// Builds a client for `context` (the current context when `None`),
/// checking first that the context, its cluster and its user exist so the
/// error can name the missing piece.
///
/// An exec credential plugin runs once, here, under
/// [`ClientOptions::plugin_timeout`]; the client runs it again only when its
/// token is about to expire or the server refuses it (see
/// [`crate::provider::credentials`]). Dropping the returned future stops the plugin.
/// Requests get the deadlines of `options`.
pub async fn client(
    kubeconfig: &Kubeconfig,
    context: Option<&str>,
    source: &str,
    options: &ClientOptions,
) -> Result<kube::Client, Error> {
    Ok(client_with_requests(kubeconfig, context, source, options)
        .await?
        .0)
}

/// [`client`], and the record of how its requests end (for the cluster's
/// health).
pub(crate) async fn client_with_requests(
    kubeconfig: &Kubeconfig,
    context: Option<&str>,
    source: &str,
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
    // Checked first so that the error names the missing piece.
    let only = context_only(kubeconfig, &context_name, source)?;
    let user = only
        .auth_infos
        .first()
        .map(|named| named.name.clone())
        .unwrap_or_default();
    let kube_options = KubeConfigOptions {
        context: Some(context_name.clone()),
        ..KubeConfigOptions::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(only, &kube_options)
        .await
        .map_err(|err| invalid(source, &format!("context {context_name:?}: {err}")))?;
    if runs_command_unattended(&config.auth_info) {
        return Err(invalid(
            source,
            &format!(
                "context {context_name:?} (user {user:?}): the gcp auth provider's cmd-path runs a command that cannot be given a deadline or stopped; use an exec credential plugin (gke-gcloud-auth-plugin) instead, as client-go has required since Kubernetes 1.26"
            ),
        ));
    }
    config.connect_timeout = options.connect_timeout;
    let plugin = plugin_of(&mut config.auth_info, options.plugin_timeout)
        .map(|plugin| plugin.showing_stderr(options.plugin_stderr));
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
    let requests = Requests::default();
    let server: std::sync::Arc<str> = crate::redact::without_userinfo(&config.cluster_url).into();
    let (source_text, context_text) = (source.to_string(), context_name.clone());
    let (timeout, http2, recorded) = (options.request_timeout, options.http2, requests.clone());
    // Builds the client, with a client certificate from the plugin when it
    // hands out one (again at each renewal).
    let connect: credentials::Connect = std::sync::Arc::new(move |certificate| {
        let mut config = config.clone();
        if let Some((certificate, key)) = certificate {
            use base64::Engine;
            let encode = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
            config.auth_info.client_certificate_data = Some(encode(certificate));
            config.auth_info.client_key_data = Some(encode(key.expose_secret()).into());
        }
        let layer = BoundedLayer {
            timeout,
            requests: recorded.clone(),
            server: server.clone(),
        };
        // Outside the deadline: waiting for the budget is not the server's
        // slowness.
        crate::provider::connection::builder(config, http2)
            .map(|builder| {
                builder
                    .with_layer(&layer)
                    .with_layer(&tower::util::option_layer(budget.clone()))
                    .build()
            })
            .map_err(|err| {
                invalid(
                    &source_text,
                    &format!(
                        "context {context_text:?}: {}",
                        crate::redact::kube_error(&err)
                    ),
                )
            })
    });
    let Some(plugin) = plugin else {
        return Ok((connect(None)?, requests));
    };
    match plugin.run().await {
        Ok(first) => Ok((
            credentials::authenticated(connect, plugin, first, requests.clone())?,
            requests,
        )),
        Err(err) => Err(Error::Credentials {
            origin: source.to_string(),
            user: format!("context {context_name:?}, user {user:?}"),
            source: err.into(),
        }),
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

/// The part of `kubeconfig` that `context` uses: that context (made
/// current), its cluster and its user. Errors name a missing piece.
fn context_only(kubeconfig: &Kubeconfig, context: &str, source: &str) -> Result<Kubeconfig, Error> {
    let named = kubeconfig
        .contexts
        .iter()
        .find(|named| named.name == context)
        .ok_or_else(|| invalid(source, &format!("context {context:?} does not exist")))?;
    let entry = named
        .context
        .as_ref()
        .ok_or_else(|| invalid(source, &format!("context {context:?} is empty")))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|cluster| cluster.name == entry.cluster)
        .ok_or_else(|| {
            invalid(
                source,
                &format!(
                    "context {context:?} names cluster {:?}, which does not exist",
                    entry.cluster
                ),
            )
        })?;
    let users = match entry.user.as_deref() {
        None => Vec::new(),
        Some(user) => vec![
            kubeconfig
                .auth_infos
                .iter()
                .find(|auth| auth.name == user)
                .ok_or_else(|| {
                    invalid(
                        source,
                        &format!("context {context:?} names user {user:?}, which does not exist"),
                    )
                })?
                .clone(),
        ],
    };
    Ok(Kubeconfig {
        current_context: Some(context.to_string()),
        contexts: vec![named.clone()],
        clusters: vec![cluster.clone()],
        auth_infos: users,
        api_version: kubeconfig.api_version.clone(),
        kind: kubeconfig.kind.clone(),
        ..Kubeconfig::default()
    })
}

/// What `context` of `kubeconfig` resolves to — the context (made current),
/// its cluster and its user, extensions and exec settings included — as
/// canonical text (see [`canonical_text`]). A change elsewhere in the
/// kubeconfig leaves it alone, so it tells whether that context changed.
/// Fails, naming the missing piece, as [`client`] would.
pub fn context_text(kubeconfig: &Kubeconfig, context: &str, source: &str) -> Result<String, Error> {
    Ok(canonical_text(&context_only(kubeconfig, context, source)?))
}

/// `kubeconfig` as JSON text (which is also YAML) with object keys sorted,
/// so equal settings always give equal text. kube-rs keeps exec `env`
/// entries in hash maps, whose order changes from one map to the next.
pub fn canonical_text(kubeconfig: &Kubeconfig) -> String {
    fn sorted(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let entries: std::collections::BTreeMap<_, _> = map.into_iter().collect();
                serde_json::Value::Object(
                    entries
                        .into_iter()
                        .map(|(key, value)| (key, sorted(value)))
                        .collect(),
                )
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sorted).collect())
            }
            other => other,
        }
    }
    // A kubeconfig is strings, numbers, booleans and JSON values: it always
    // serialises.
    sorted(serde_json::to_value(kubeconfig).unwrap_or_default()).to_string()
}

/// A short, stable digest of kubeconfig text, for telling whether a
/// cluster's connection config changed (not a security measure).
pub(crate) fn fingerprint(text: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

fn invalid(source: &str, reason: &str) -> Error {
    Error::InvalidKubeconfig {
        origin: source.to_string(),
        reason: reason.to_string(),
    }
}

/// A cluster to build from kubeconfig text: what a provider found, before
/// the (possibly slow) client is built. Building runs exec credential
/// plugins; providers can build several at once and hand the results to
/// [`Clusters::add_or_replace`](crate::provider::clusters::Clusters::add_or_replace) with [`KubeconfigCluster::fingerprint`].
#[derive(Clone)]
pub struct KubeconfigCluster {
    /// The cluster's name in the fleet.
    pub name: ClusterName,
    /// The kubeconfig; its current context is used.
    pub text: String,
    /// Where the text came from, for errors (which never quote it).
    pub source: String,
    /// The cluster's stable ID, if known ([`Cluster::stable_id`]).
    pub stable_id: Option<String>,
    /// What its clients and cache are built with.
    pub member: MemberOptions,
    /// Its labels and properties ([`Cluster::inventory`]); not part of
    /// the fingerprint, since a change of them alone needs no new client.
    pub inventory: Inventory,
}

impl std::fmt::Debug for KubeconfigCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeconfigCluster")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("stable_id", &self.stable_id)
            .field("member", &self.member)
            .field("inventory", &self.inventory)
            .finish_non_exhaustive()
    }
}

impl KubeconfigCluster {
    /// A digest of the text, stable ID and member options: equal exactly
    /// when building again would give the same cluster.
    pub fn fingerprint(&self) -> String {
        fingerprint(&format!(
            "{}\n{}\n{}",
            self.stable_id.as_deref().unwrap_or_default(),
            self.member.digest(),
            self.text
        ))
    }

    /// Parses the text and builds the cluster's client and cache with its
    /// member options (running its credential plugin once, if it has one:
    /// see [`client`]).
    pub async fn build(&self) -> Result<Cluster, Error> {
        let parsed = parse(&self.text, &self.source)?;
        let (client, requests) =
            client_with_requests(&parsed, None, &self.source, &self.member.client).await?;
        let cache =
            Cache::with_options(self.name.clone(), client.clone(), self.member.cache.clone());
        let cluster =
            Cluster::with_cache(self.name.clone(), client, cache).watching_requests(requests);
        cluster.set_inventory(self.inventory.clone());
        Ok(match &self.stable_id {
            Some(id) => cluster.with_stable_id(id),
            None => cluster,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                Ok(parsed) => client(
                    &parsed,
                    None,
                    "Secret fleet/prod key kubeconfig",
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
        let err = client(
            &parsed,
            None,
            "Secret fleet/prod key kubeconfig",
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
        let shown = client(
            &parsed,
            None,
            "Secret fleet/prod key kubeconfig",
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
        let (built, ()) = tokio::join!(client(&parsed, None, "test", &options), async {
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
        client(&parsed, None, "test", &ClientOptions::default())
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
        let err = client(&parsed, None, "Secret fleet/prod key kubeconfig", &options)
            .await
            .map(|_| ())
            .expect_err("held");
        assert!(err.is_retryable(), "{err}");
        let message = err.to_string();
        assert!(message.contains("did not finish within 500ms"), "{message}");
        assert!(!message.contains(SECRET_TOKEN), "{message}");
    }

    /// Ten thousand contexts are about 250,000 YAML nodes, the default cap of
    /// the YAML parser kube-rs uses.
    #[test]
    fn a_kubeconfig_of_ten_thousand_contexts_parses() {
        let mut text = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
        for i in 0..10_000 {
            text.push_str(&format!(
                "- name: c{i}\n  cluster:\n    server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true\n",
                1000 + i
            ));
        }
        text.push_str("contexts:\n");
        for i in 0..10_000 {
            text.push_str(&format!(
                "- name: ctx{i}\n  context:\n    cluster: c{i}\n    user: u{i}\n    namespace: ns{i}\n"
            ));
        }
        text.push_str("users:\n");
        for i in 0..10_000 {
            text.push_str(&format!("- name: u{i}\n  user:\n    token: t{i}\n"));
        }
        let parsed = parse(&text, "test").expect("parses");
        assert_eq!(context_names(&parsed).len(), 10_000);
        assert!(context_text(&parsed, "ctx9999", "test").is_ok());
    }

    #[test]
    fn a_context_text_changes_only_with_what_the_context_uses() {
        let two = |server_b: &str, token_b: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: ca\n  cluster:\n    server: https://a:1\n- name: cb\n  cluster:\n    server: {server_b}\ncontexts:\n- name: a\n  context:\n    cluster: ca\n    user: ua\n- name: b\n  context:\n    cluster: cb\n    user: ub\nusers:\n- name: ua\n  user:\n    token: ta\n- name: ub\n  user:\n    token: {token_b}\n"
            )
        };
        let text = |kubeconfig: &str, context: &str| {
            context_text(&parse(kubeconfig, "test").expect("parses"), context, "test")
                .expect("resolves")
        };
        let before = two("https://b:1", "tb");
        for after in [two("https://b:2", "tb"), two("https://b:1", "tb2")] {
            assert_eq!(text(&before, "a"), text(&after, "a"));
            assert_ne!(text(&before, "b"), text(&after, "b"));
        }
        let missing_user = before.replace("- name: ub\n", "- name: other\n");
        let err = context_text(&parse(&missing_user, "test").expect("parses"), "b", "test")
            .expect_err("no user ub");
        assert!(err.to_string().contains("user \"ub\""), "{err}");
    }

    #[tokio::test]
    async fn a_valid_kubeconfig_gives_a_client_and_a_stable_fingerprint() {
        let text = kubeconfig("ctx", "c", "u");
        let parsed = parse(&text, "test").expect("parses");
        assert_eq!(context_names(&parsed), ["ctx"]);
        let options = ClientOptions::default();
        client(&parsed, None, "test", &options)
            .await
            .expect("client");
        client(&parsed, Some("ctx"), "test", &options)
            .await
            .expect("named context");
        assert_eq!(fingerprint(&text), fingerprint(&text));
        assert_ne!(
            fingerprint(&text),
            fingerprint(&kubeconfig("ctx", "c", "v"))
        );
    }
}
