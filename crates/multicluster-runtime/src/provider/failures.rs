//! Why clusters a provider found could not be engaged.
//!
//! Providers look at an inventory object on every change, and inventories
//! update status often (heartbeats, conditions). A failure is therefore
//! logged and counted once per new reason, not once per look; the current
//! reason per cluster stays readable until the cluster is engaged or gone.
//!
//! Objects that are not engaged because they describe a cluster engaged
//! from another object (duplicates) are kept here too: they are no failure,
//! but shown beside the fleet all the same.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};

#[cfg(feature = "kubeconfig")]
use crate::error::Error;
use crate::metrics::Metrics;
use multicluster_core::ClusterName;
use multicluster_core::lock;
use multicluster_core::redact::Redacted;

/// A cluster shown as being built ([`Failures::building`]) until dropped.
#[derive(Debug)]
#[must_use = "the cluster is shown as being built only while this is held"]
pub struct Building<'a> {
    failures: &'a Failures,
    name: ClusterName,
}

impl Drop for Building<'_> {
    fn drop(&mut self) {
        if let Some(metrics) = self.failures.metrics.get() {
            metrics.fleet().built(&self.failures.provider, &self.name);
        }
    }
}

/// The current failure reason per cluster of one provider.
#[derive(Debug)]
pub struct Failures {
    provider: std::sync::Arc<str>,
    metrics: OnceLock<Metrics>,
    reasons: Mutex<BTreeMap<ClusterName, String>>,
    /// The duplicates of each cluster, by the name it is held under.
    duplicates: Mutex<BTreeMap<ClusterName, BTreeSet<ClusterName>>>,
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
            duplicates: Mutex::default(),
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
        let redacted = Redacted::new(reason.into());
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
        reasons.insert(name.clone(), reason);
        // Recorded before the fleet is told, so that whoever is told finds
        // the reason here.
        drop(reasons);
        if let Some(metrics) = self.metrics.get() {
            metrics.engagement_failed(&self.provider, kind);
            metrics.fleet().unusable(&self.provider, name, redacted);
        }
    }

    #[cfg(feature = "kubeconfig")]
    /// Records that building `name`'s cluster from its kubeconfig failed
    /// with `err`: counted under `credentials` when another attempt may
    /// work ([`Error::is_retryable`]: a credential plugin failed), under
    /// `refused-kubeconfig` when its policy refused it
    /// ([`client::Error::KubeconfigRefused`](multicluster_client::Error::KubeconfigRefused)),
    /// else under `invalid-kubeconfig`.
    /// Returns whether to try again later.
    pub fn record_build_error(&self, name: &ClusterName, err: &Error) -> bool {
        let retry = err.is_retryable();
        let kind = match err {
            _ if retry => "credentials",
            Error::Client(multicluster_client::Error::KubeconfigRefused { .. }) => {
                "refused-kubeconfig"
            }
            _ => "invalid-kubeconfig",
        };
        self.record(name, err.to_string(), kind);
        retry
    }

    /// Shows `name` syncing, waiting for `what`, until the guard returned is
    /// dropped: a cluster whose client takes long to build (a credential
    /// plugin waiting for a login) is on `/clusters` from the start, not
    /// only once the build ends.
    pub fn building(&self, name: &ClusterName, what: impl Into<String>) -> Building<'_> {
        if let Some(metrics) = self.metrics.get() {
            metrics
                .fleet()
                .building(&self.provider, name, Redacted::new(what.into()));
        }
        Building {
            failures: self,
            name: name.clone(),
        }
    }

    /// Forgets `name`'s failure: it is engaged, or gone.
    pub fn clear(&self, name: &ClusterName) {
        if lock(&self.reasons).remove(name).is_some()
            && let Some(metrics) = self.metrics.get()
        {
            metrics.fleet().usable(&self.provider, name);
        }
    }

    /// Records `names` as the inventory objects describing the cluster held
    /// (or wanted) as `of`, replacing those recorded before; an empty set
    /// forgets them. Shown as [`multicluster_core::ClusterState::Duplicate`].
    pub fn set_duplicates(&self, of: &ClusterName, names: BTreeSet<ClusterName>) {
        let mut duplicates = lock(&self.duplicates);
        let before = if names.is_empty() {
            duplicates.remove(of).unwrap_or_default()
        } else {
            duplicates
                .insert(of.clone(), names.clone())
                .unwrap_or_default()
        };
        if before == names {
            return;
        }
        if let Some(metrics) = self.metrics.get() {
            for gone in before.difference(&names) {
                metrics.fleet().duplicate(&self.provider, gone, None);
            }
            for name in &names {
                metrics.fleet().duplicate(&self.provider, name, Some(of));
            }
        }
    }

    /// The inventory objects recorded as duplicates, each with the name of
    /// the cluster it describes.
    pub fn duplicates(&self) -> BTreeMap<ClusterName, ClusterName> {
        lock(&self.duplicates)
            .iter()
            .flat_map(|(of, names)| names.iter().map(|name| (name.clone(), of.clone())))
            .collect()
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
    fn duplicates_are_shown_beside_the_fleet_and_replaced_per_cluster() {
        let metrics = Metrics::default();
        let failures = Failures::new("test", Some(metrics.clone()));
        let (member, a, b) = (
            ClusterName::from("member"),
            ClusterName::from("ns/a"),
            ClusterName::from("ns/b"),
        );
        failures.set_duplicates(&member, [a.clone(), b.clone()].into());
        let shown: Vec<_> = metrics
            .fleet()
            .duplicates()
            .into_iter()
            .map(|(name, duplicate)| (name, duplicate.of))
            .collect();
        assert_eq!(
            shown,
            [(a.clone(), member.clone()), (b.clone(), member.clone())]
        );
        assert_eq!(metrics.fleet().subscribe().borrow().duplicates, 2);
        // Replaced, not added to.
        failures.set_duplicates(&member, [b.clone()].into());
        assert_eq!(
            failures.duplicates(),
            BTreeMap::from([(b.clone(), member.clone())])
        );
        assert_eq!(metrics.fleet().subscribe().borrow().duplicates, 1);
        failures.set_duplicates(&member, BTreeSet::new());
        assert!(failures.duplicates().is_empty());
        assert!(metrics.fleet().duplicates().is_empty());
        // Not unusable: no failure counted.
        assert_eq!(count(&metrics), 0);
    }

    #[test]
    #[cfg(feature = "kubeconfig")]
    fn build_errors_are_told_apart_by_whether_a_retry_may_help() {
        let failures = Failures::new("test", None);
        let name = ClusterName::from("a");
        // Retryable, as a credential plugin that failed is.
        let plugin = Error::NotReady {
            name: name.clone(),
            timeout: std::time::Duration::from_secs(1),
            reason: multicluster_core::redact::Redacted::new("the plugin timed out"),
        };
        assert!(failures.record_build_error(&name, &plugin));
        assert_eq!(failures.current()[&name], plugin.to_string());
        let wrong = Error::from(multicluster_client::Error::InvalidKubeconfig {
            origin: "Secret s".into(),
            reason: "no contexts".into(),
        });
        assert!(!failures.record_build_error(&name, &wrong));
        assert_eq!(failures.current()[&name], wrong.to_string());
    }
}
