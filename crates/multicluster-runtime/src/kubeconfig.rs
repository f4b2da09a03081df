//! Turning kubeconfig text from a Secret, a file or a CLI into a client,
//! with errors that name where the kubeconfig came from and what is wrong
//! with it — and never quote it, since it holds credentials.

use std::hash::{Hash, Hasher};
use std::io::IsTerminal;

use kube::config::{ExecInteractiveMode, KubeConfigOptions, Kubeconfig};

use crate::Error;

/// Parses kubeconfig YAML. `source` says where it came from (e.g. `Secret
/// fleet/prod key kubeconfig`) and is used in errors.
///
/// Parser messages are not passed on: they can quote the offending value,
/// which may be a token or a key.
pub fn parse(text: &str, source: &str) -> Result<Kubeconfig, Error> {
    if text.trim().is_empty() {
        return Err(invalid(source, "it is empty"));
    }
    let kubeconfig = Kubeconfig::from_yaml(text)
        .map_err(|_| invalid(source, "it is not valid kubeconfig YAML"))?;
    if kubeconfig.clusters.is_empty() && kubeconfig.contexts.is_empty() {
        return Err(invalid(
            source,
            "it has no clusters and no contexts: not a kubeconfig",
        ));
    }
    Ok(kubeconfig)
}

/// The names of the contexts in a kubeconfig, in file order.
pub fn context_names(kubeconfig: &Kubeconfig) -> Vec<String> {
    kubeconfig
        .contexts
        .iter()
        .map(|context| context.name.clone())
        .collect()
}

/// Builds a client for `context` (the current context when `None`),
/// checking first that the context, its cluster and its user exist so the
/// error can name the missing piece.
pub async fn client(
    kubeconfig: &Kubeconfig,
    context: Option<&str>,
    source: &str,
) -> Result<kube::Client, Error> {
    let context_name = match context {
        Some(name) => name.to_string(),
        None => kubeconfig
            .current_context
            .clone()
            .filter(|name| !name.is_empty())
            .ok_or_else(|| invalid(source, "it has no current-context"))?,
    };
    let entry = kubeconfig
        .contexts
        .iter()
        .find(|named| named.name == context_name)
        .and_then(|named| named.context.as_ref())
        .ok_or_else(|| invalid(source, &format!("context {context_name:?} does not exist")))?;
    if !kubeconfig
        .clusters
        .iter()
        .any(|cluster| cluster.name == entry.cluster)
    {
        return Err(invalid(
            source,
            &format!(
                "context {context_name:?} names cluster {:?}, which does not exist",
                entry.cluster
            ),
        ));
    }
    if let Some(user) = entry.user.as_deref()
        && !kubeconfig.auth_infos.iter().any(|auth| auth.name == user)
    {
        return Err(invalid(
            source,
            &format!("context {context_name:?} names user {user:?}, which does not exist"),
        ));
    }
    let options = KubeConfigOptions {
        context: Some(context_name.clone()),
        ..KubeConfigOptions::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &options)
        .await
        .map_err(|err| invalid(source, &format!("context {context_name:?}: {err}")))?;
    if let Some(exec) = config.auth_info.exec.as_mut() {
        exec.interactive_mode = Some(interactive_mode(
            exec.interactive_mode.take(),
            std::io::stdin().is_terminal(),
        ));
    }
    let plugin = exec_command(kubeconfig, entry.user.as_deref())
        .map(|command| {
            format!(
                " (user {:?}, credential plugin {command:?})",
                entry.user.as_deref().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    // An exec credential plugin runs synchronously while the client is
    // built; that must not hold up an async worker thread.
    tokio::task::spawn_blocking(move || kube::Client::try_from(config))
        .await
        .map_err(|_| {
            invalid(
                source,
                &format!("context {context_name:?}: building the client panicked"),
            )
        })?
        .map_err(|err| {
            let reason = format!(
                "context {context_name:?}{plugin}: {}",
                crate::redact::kube_error(&err)
            );
            if crate::redact::is_auth_error(&err) {
                Error::Credentials {
                    origin: source.to_string(),
                    reason,
                }
            } else {
                invalid(source, &reason)
            }
        })
}

/// The interactive mode a credential plugin runs in, as client-go decides
/// it: `IfAvailable` (also the default) means interactive only when stdin is
/// a terminal. kube-rs treats it as always interactive, which hands the
/// plugin a stdin nobody answers and sends its stderr — the explanation of a
/// failure — past the error to the process's own stderr.
fn interactive_mode(
    configured: Option<ExecInteractiveMode>,
    stdin_is_terminal: bool,
) -> ExecInteractiveMode {
    match configured {
        Some(ExecInteractiveMode::Never) => ExecInteractiveMode::Never,
        Some(ExecInteractiveMode::Always) => ExecInteractiveMode::Always,
        Some(ExecInteractiveMode::IfAvailable) | None if stdin_is_terminal => {
            ExecInteractiveMode::IfAvailable
        }
        Some(ExecInteractiveMode::IfAvailable) | None => ExecInteractiveMode::Never,
    }
}

/// The command of `user`'s exec credential plugin, if it has one.
fn exec_command<'a>(kubeconfig: &'a Kubeconfig, user: Option<&str>) -> Option<&'a str> {
    kubeconfig
        .auth_infos
        .iter()
        .find(|auth| Some(auth.name.as_str()) == user)?
        .auth_info
        .as_ref()?
        .exec
        .as_ref()?
        .command
        .as_deref()
}

/// A short, stable digest of kubeconfig text, for telling whether a
/// cluster's connection config changed (not a security measure).
pub fn fingerprint(text: &str) -> String {
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
        ];
        for (text, expected) in cases {
            let result = match parse(&text, "Secret fleet/prod key kubeconfig") {
                Ok(parsed) => client(&parsed, None, "Secret fleet/prod key kubeconfig")
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

    #[test]
    fn plugins_are_interactive_only_when_asked_and_possible() {
        use ExecInteractiveMode::{Always, IfAvailable, Never};
        for (configured, terminal, expected) in [
            (None, false, Never),
            (None, true, IfAvailable),
            (Some(IfAvailable), false, Never),
            (Some(IfAvailable), true, IfAvailable),
            (Some(Never), true, Never),
            (Some(Always), false, Always),
        ] {
            assert_eq!(
                interactive_mode(configured.clone(), terminal),
                expected,
                "{configured:?}, terminal: {terminal}"
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
        let err = client(&parsed, None, "Secret fleet/prod key kubeconfig")
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
            "identity service: no grant for this cluster",
        ] {
            assert!(
                message.contains(expected),
                "{message} should say {expected}"
            );
        }
        assert!(
            !message.contains(SECRET_TOKEN),
            "credentials leaked: {message}"
        );
        assert!(
            !message.contains("very-secret-argument"),
            "arguments leaked: {message}"
        );
    }

    /// On a single-threaded runtime a held plugin can only be released if it
    /// runs somewhere else while the runtime goes on.
    #[tokio::test(flavor = "current_thread")]
    async fn credential_plugins_run_off_the_async_thread() {
        use multicluster_envtest::plugins;
        let state = tempfile::tempdir().expect("state dir");
        plugins::set_token(state.path(), "from-plugin").expect("token");
        plugins::hold(state.path()).expect("hold");
        let text = exec_kubeconfig(plugins::TOKEN, &[], state.path());
        let parsed = parse(&text, "test").expect("parses");
        let (built, ()) = tokio::join!(client(&parsed, None, "test"), async {
            plugins::release(state.path()).expect("release");
        });
        built.expect("the plugin was released and gave a token");
    }

    #[tokio::test]
    async fn a_valid_kubeconfig_gives_a_client_and_a_stable_fingerprint() {
        let text = kubeconfig("ctx", "c", "u");
        let parsed = parse(&text, "test").expect("parses");
        assert_eq!(context_names(&parsed), ["ctx"]);
        client(&parsed, None, "test").await.expect("client");
        client(&parsed, Some("ctx"), "test")
            .await
            .expect("named context");
        assert_eq!(fingerprint(&text), fingerprint(&text));
        assert_ne!(
            fingerprint(&text),
            fingerprint(&kubeconfig("ctx", "c", "v"))
        );
    }
}
