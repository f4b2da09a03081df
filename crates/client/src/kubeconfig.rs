//! Kubeconfig text: parsing it with errors that name where it came from
//! and never quote it (it holds credentials), the contexts it has
//! ([`Contexts`]), and the part one context uses as canonical text, for
//! telling whether it changed.

use kube::config::Kubeconfig;

use crate::Error;

/// The contexts of a kubeconfig, each a cluster to a provider that reads
/// kubeconfig files.
#[derive(Clone)]
pub struct Contexts {
    kubeconfig: Kubeconfig,
    source: String,
}

/// Shows where it came from only: a kubeconfig holds credentials.
impl std::fmt::Debug for Contexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contexts")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Contexts {
    /// Parses kubeconfig YAML. `source` says where it came from (e.g.
    /// `file /etc/fleet/prod.yaml`) and is used in errors, which never
    /// quote the text.
    pub fn parse(text: &str, source: impl Into<String>) -> Result<Self, Error> {
        let source = source.into();
        Ok(Self {
            kubeconfig: parse(text, &source)?,
            source,
        })
    }

    /// The names of the contexts, in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.kubeconfig
            .contexts
            .iter()
            .map(|context| context.name.as_str())
    }

    /// What `context` resolves to — the context (made current), its
    /// cluster and its user, extensions and exec settings included — as
    /// canonical text (JSON with object keys sorted, as
    /// [`KubeconfigCluster::text_of`](crate::kubeconfig::canonical_text)
    /// gives). A change elsewhere in the kubeconfig leaves it
    /// alone, so it tells whether that context changed. Fails, naming the
    /// source, the context and the missing piece, as
    /// [`crate::build`] would.
    pub fn text(&self, context: &str) -> Result<String, Error> {
        let source = format!("{} context {context:?}", self.source);
        Ok(canonical_text(&context_only(
            &self.kubeconfig,
            context,
            &source,
        )?))
    }
}

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

/// The part of `kubeconfig` that `context` uses: that context (made
/// current), its cluster and its user. Errors name a missing piece.
pub(crate) fn context_only(
    kubeconfig: &Kubeconfig,
    context: &str,
    source: &str,
) -> Result<Kubeconfig, Error> {
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

/// `kubeconfig` as JSON text (which is also YAML) with object keys sorted,
/// so equal settings always give equal text. kube-rs keeps exec `env`
/// entries in hash maps, whose order changes from one map to the next.
#[doc(hidden)]
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

/// The error for a kubeconfig that cannot be used until it changes.
pub(crate) fn invalid(source: &str, reason: &str) -> Error {
    Error::InvalidKubeconfig {
        origin: source.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let parsed = Contexts::parse(&text, "test").expect("parses");
        assert_eq!(parsed.names().count(), 10_000);
        assert!(parsed.text("ctx9999").is_ok());
    }

    #[test]
    fn a_context_text_changes_only_with_what_the_context_uses() {
        let two = |server_b: &str, token_b: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: ca\n  cluster:\n    server: https://a:1\n- name: cb\n  cluster:\n    server: {server_b}\ncontexts:\n- name: a\n  context:\n    cluster: ca\n    user: ua\n- name: b\n  context:\n    cluster: cb\n    user: ub\nusers:\n- name: ua\n  user:\n    token: ta\n- name: ub\n  user:\n    token: {token_b}\n"
            )
        };
        let text = |kubeconfig: &str, context: &str| {
            Contexts::parse(kubeconfig, "test")
                .expect("parses")
                .text(context)
                .expect("resolves")
        };
        let before = two("https://b:1", "tb");
        for after in [two("https://b:2", "tb"), two("https://b:1", "tb2")] {
            assert_eq!(text(&before, "a"), text(&after, "a"));
            assert_ne!(text(&before, "b"), text(&after, "b"));
        }
        let missing_user = before.replace("- name: ub\n", "- name: other\n");
        let err = Contexts::parse(&missing_user, "file f")
            .expect("parses")
            .text("b")
            .expect_err("no user ub");
        let message = err.to_string();
        assert!(message.contains("user \"ub\""), "{message}");
        assert!(message.contains("file f context \"b\""), "{message}");
    }
}
