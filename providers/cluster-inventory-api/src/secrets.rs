//! The Secret strategy: one Secret per profile for this consumer.

use k8s_openapi::api::core::v1::Secret;
use multicluster_runtime::cache::Cache;

use crate::{PROFILE_LABEL, SECRET_KEY, SECRET_KEY_LOWER_CASE};

/// The kubeconfig text for `profile` from its credentials Secret in
/// `secrets` (this consumer's, already label-selected), and where it came
/// from.
pub(crate) fn credentials(
    secrets: &Cache,
    namespace: &str,
    profile: &str,
) -> Result<(String, String), String> {
    let matching: Vec<_> = secrets
        .informer::<Secret>()
        .list(Some(namespace))
        .into_iter()
        .filter(|secret| {
            secret
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(PROFILE_LABEL))
                .map(String::as_str)
                == Some(profile)
        })
        .collect();
    let secret = match matching.as_slice() {
        [one] => one,
        [] => {
            return Err(format!(
                "no Secret in {namespace} labelled {PROFILE_LABEL}={profile} for this consumer"
            ));
        }
        several => {
            let names: Vec<_> = several
                .iter()
                .filter_map(|s| s.metadata.name.clone())
                .collect();
            return Err(format!(
                "several Secrets in {namespace} labelled {PROFILE_LABEL}={profile} for this consumer: {}",
                names.join(", ")
            ));
        }
    };
    // `Config` (the KEP's), else `config` (what upstream's one
    // implementation writes).
    let key = match &secret.data {
        Some(data)
            if !data.contains_key(SECRET_KEY) && data.contains_key(SECRET_KEY_LOWER_CASE) =>
        {
            SECRET_KEY_LOWER_CASE
        }
        _ => SECRET_KEY,
    };
    let source = format!(
        "Secret {namespace}/{} key {key:?}",
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    let text = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
        .filter(|text| !text.trim().is_empty())
        .ok_or_else(|| format!("{source} is missing, empty or not text"))?;
    Ok((text, source))
}

/// The profile a credentials Secret is for: its namespace and name.
pub(crate) fn profile_of(secret: &Secret) -> Option<(Option<String>, String)> {
    let meta = &secret.metadata;
    let profile = meta.labels.as_ref()?.get(PROFILE_LABEL)?;
    Some((meta.namespace.clone(), profile.clone()))
}
