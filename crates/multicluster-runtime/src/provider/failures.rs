//! Why clusters a provider found could not be engaged.
//!
//! Providers look at an inventory object on every change, and inventories
//! update status often (heartbeats, conditions). A failure is therefore
//! logged and counted once per new reason, not once per look; the current
//! reason per cluster stays readable until the cluster is engaged or gone.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use crate::metrics::Metrics;
use crate::redact::Redacted;
use crate::sync::lock;
use crate::{ClusterName, Error};

/// The current failure reason per cluster of one provider.
#[derive(Debug)]
pub struct Failures {
    provider: std::sync::Arc<str>,
    metrics: OnceLock<Metrics>,
    reasons: Mutex<BTreeMap<ClusterName, String>>,
}

impl Failures {
    /// Failures of `provider` (its label in
    /// `mcr_cluster_engagement_failures`), counted in `metrics` if given
    /// (else in those [`Failures::use_metrics`] hands over).
    pub fn new(provider: impl Into<std::sync::Arc<str>>, metrics: Option<Metrics>) -> Self {
        Self {
            provider: provider.into(),
            metrics: metrics.map(OnceLock::from).unwrap_or_default(),
            reasons: Mutex::default(),
        }
    }

    /// Counts in `metrics` from now on, unless a registry was given at
    /// construction.
    pub fn use_metrics(&self, metrics: &Metrics) {
        let _ = self.metrics.set(metrics.clone());
    }

    /// The registry failures are counted in, if any yet.
    pub fn metrics(&self) -> Option<&Metrics> {
        self.metrics.get()
    }

    /// Records that `name` cannot be engaged because of `reason` (counted
    /// under `kind`). Logged as a warning and counted only when the reason
    /// is new for that cluster. The reason is redacted first, as every
    /// reason shown is ([`crate::redact`]): a credential in it is withheld
    /// from the log, [`Failures::current`], `/clusters` and the metrics.
    pub fn record(&self, name: &ClusterName, reason: impl Into<String>, kind: &'static str) {
        let redacted = Redacted::ours(reason.into());
        let reason = redacted.as_str().to_string();
        let mut reasons = lock(&self.reasons);
        if reasons.get(name) == Some(&reason) {
            tracing::debug!(cluster = %name, %reason, "still cannot add the cluster to the fleet");
            // Counted as one more attempt in the fleet view.
            if let Some(metrics) = self.metrics.get() {
                metrics.fleet().unusable(&self.provider, name, redacted);
            }
            return;
        }
        tracing::warn!(cluster = %name, %reason, "cannot add the cluster to the fleet");
        if let Some(metrics) = self.metrics.get() {
            metrics.engagement_failed(&self.provider, kind);
            metrics.fleet().unusable(&self.provider, name, redacted);
        }
        reasons.insert(name.clone(), reason);
    }

    /// Records that building `name`'s cluster from its kubeconfig failed
    /// with `err`: counted under `credentials` when another attempt may
    /// work ([`Error::is_retryable`]: a credential plugin failed), under
    /// `refused-kubeconfig` when its policy refused it
    /// ([`Error::KubeconfigRefused`]), else under `invalid-kubeconfig`.
    /// Returns whether to try again later.
    pub fn record_build_error(&self, name: &ClusterName, err: &Error) -> bool {
        let retry = err.is_retryable();
        let kind = match err {
            _ if retry => "credentials",
            Error::KubeconfigRefused { .. } => "refused-kubeconfig",
            _ => "invalid-kubeconfig",
        };
        self.record(name, err.to_string(), kind);
        retry
    }

    /// Forgets `name`'s failure: it is engaged, or gone.
    pub fn clear(&self, name: &ClusterName) {
        if lock(&self.reasons).remove(name).is_some()
            && let Some(metrics) = self.metrics.get()
        {
            metrics.fleet().usable(&self.provider, name);
        }
    }

    /// The clusters that cannot be engaged now, each with its reason.
    pub fn current(&self) -> BTreeMap<ClusterName, String> {
        lock(&self.reasons).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(metrics: &Metrics) -> usize {
        metrics
            .encode()
            .lines()
            .filter(|line| line.starts_with("mcr_cluster_engagement_failures_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as usize
    }

    #[test]
    fn a_reason_is_counted_once_until_it_changes_or_clears() {
        let metrics = Metrics::default();
        let failures = Failures::new("test", Some(metrics.clone()));
        let name = ClusterName::from("a");
        failures.record(&name, "no Secret", "missing");
        failures.record(&name, "no Secret", "missing");
        assert_eq!(count(&metrics), 1);
        failures.record(&name, "bad kubeconfig", "invalid");
        assert_eq!(count(&metrics), 2);
        assert_eq!(failures.current()[&name], "bad kubeconfig");
        failures.clear(&name);
        assert!(failures.current().is_empty());
        failures.record(&name, "bad kubeconfig", "invalid");
        assert_eq!(count(&metrics), 3);
    }

    #[test]
    fn a_reason_is_redacted_before_it_is_logged_kept_or_shown() {
        let metrics = Metrics::default();
        let failures = Failures::new("test", Some(metrics.clone()));
        let name = ClusterName::from("a");
        failures.record(
            &name,
            "Secret fleet/a: server said Authorization: Bearer sha256~AbC123dEf456 was refused",
            "invalid",
        );
        let kept = &failures.current()[&name];
        assert_eq!(
            kept,
            "Secret fleet/a: server said Authorization: Bearer [withheld] was refused"
        );
        let shown = metrics.fleet().unusable_inventory();
        assert_eq!(shown[0].1.reason.as_str(), kept);
    }

    #[test]
    fn build_errors_are_told_apart_by_whether_a_retry_may_help() {
        let failures = Failures::new("test", None);
        let name = ClusterName::from("a");
        let plugin = Error::Credentials {
            origin: "Secret s".into(),
            user: "context \"c\", user \"u\"".into(),
            source: crate::client::credentials::PluginError::Unusable {
                command: "plugin".into(),
                reason: "no status".into(),
            }
            .into(),
        };
        assert!(failures.record_build_error(&name, &plugin));
        assert_eq!(failures.current()[&name], plugin.to_string());
        let wrong = Error::InvalidKubeconfig {
            origin: "Secret s".into(),
            reason: "no contexts".into(),
        };
        assert!(!failures.record_build_error(&name, &wrong));
        assert_eq!(failures.current()[&name], wrong.to_string());
    }
}
