//! How long clusters have been in their states and how many attempts have
//! failed in a row, computed at each scrape from what the manager tracks
//! (a gauge set when a state changes would stand still while the time in
//! it grows).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::fleet::FleetView;
use multicluster_core::ClusterName;
use multicluster_core::lock;

/// One cluster as a scrape sees it.
pub(crate) struct ClusterAge {
    pub(crate) name: ClusterName,
    pub(crate) state: &'static str,
    pub(crate) in_state: Duration,
    pub(crate) failed_attempts: u32,
}

/// What the manager gives: its engaged clusters' ages, read at each scrape.
pub(crate) type AgeSource = Box<dyn Fn() -> Vec<ClusterAge> + Send + Sync>;

/// The states whose longest time is always reported (0 when no cluster is
/// in one), so an alert on one has a series to read.
const STATES: [&str; 5] = ["syncing", "ready", "degraded", "unreachable", "unusable"];

/// The collector registered with every [`super::Metrics`].
pub(super) struct StateAges {
    pub(super) source: Arc<Mutex<Option<AgeSource>>>,
    pub(super) fleet: FleetView,
    pub(super) per_cluster_labels: bool,
}

impl std::fmt::Debug for StateAges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateAges").finish_non_exhaustive()
    }
}

impl StateAges {
    /// The engaged clusters (if a manager reports them) and the unusable
    /// inventory.
    fn ages(&self) -> Vec<ClusterAge> {
        let mut ages = lock(&self.source)
            .as_ref()
            .map(|source| source())
            .unwrap_or_default();
        let now = SystemTime::now();
        ages.extend(
            self.fleet
                .unusable_inventory()
                .into_iter()
                .map(|(name, unusable)| ClusterAge {
                    name,
                    state: "unusable",
                    in_state: now.duration_since(unusable.since).unwrap_or_default(),
                    failed_attempts: unusable.attempts,
                }),
        );
        ages
    }
}

impl Collector for StateAges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ages = self.ages();
        let longest = encoder.encode_descriptor(
            "mcr_cluster_longest_in_state_seconds",
            "The longest time any cluster has been in each state (0 when none is)",
            None,
            MetricType::Gauge,
        )?;
        let mut longest = longest;
        for state in STATES {
            let seconds = ages
                .iter()
                .filter(|age| age.state == state)
                .map(|age| age.in_state.as_secs_f64())
                .fold(0.0, f64::max);
            let labels = [("state", state)];
            ConstGauge::new(seconds).encode(longest.encode_family(&labels)?)?;
        }
        let most = ages
            .iter()
            .map(|age| i64::from(age.failed_attempts))
            .max()
            .unwrap_or_default();
        ConstGauge::new(most).encode(encoder.encode_descriptor(
            "mcr_cluster_most_failed_attempts",
            "The most attempts in a row that have failed for any one cluster",
            None,
            MetricType::Gauge,
        )?)?;
        if !self.per_cluster_labels {
            return Ok(());
        }
        let mut in_state = encoder.encode_descriptor(
            "mcr_cluster_in_state_seconds",
            "How long each cluster has been in its current state (with per-cluster labels only)",
            None,
            MetricType::Gauge,
        )?;
        for age in &ages {
            let labels = [("cluster", age.name.as_str()), ("state", age.state)];
            ConstGauge::new(age.in_state.as_secs_f64()).encode(in_state.encode_family(&labels)?)?;
        }
        let mut failed = encoder.encode_descriptor(
            "mcr_cluster_failed_attempts",
            "Attempts in a row that have failed for each cluster (with per-cluster labels only)",
            None,
            MetricType::Gauge,
        )?;
        for age in &ages {
            let labels = [("cluster", age.name.as_str())];
            ConstGauge::new(i64::from(age.failed_attempts))
                .encode(failed.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
