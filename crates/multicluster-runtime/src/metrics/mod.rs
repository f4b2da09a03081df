//! Prometheus metrics of the manager and its controllers.
//!
//! Names follow controller-runtime where a counterpart exists
//! (`controller_runtime_reconcile_total`, `workqueue_depth`, ...) so existing
//! dashboards keep working; fleet metrics carry the `mcr_` prefix. A
//! `cluster` label on reconcile metrics is off by default: fleets can be
//! large and every label value is a time series.
//!
//! The application's own metrics go into the same registry
//! ([`Metrics::register`]); build them with [`prometheus_client`] as
//! re-exported here, which is the version the registry is made of (another
//! version's metric types do not fit it):
//!
//! ```
//! use multicluster_runtime::metrics::{Metrics, prometheus_client};
//! use prometheus_client::metrics::counter::Counter;
//!
//! let metrics = Metrics::default();
//! let copies = Counter::<u64>::default();
//! metrics.register(|registry| {
//!     registry.register("app_copies", "ConfigMaps copied", copies.clone())
//! });
//! copies.inc();
//! assert!(metrics.encode().contains("app_copies_total 1"));
//! ```

mod ages;

/// The `prometheus-client` crate the registry is built with.
pub use prometheus_client;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub(crate) use ages::{AgeSource, ClusterAge};
use multicluster_core::ClusterName;

type Labels = Vec<(&'static str, String)>;

/// The metrics registry and handles. Cheap to clone; clones share metrics.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Mutex<Registry>,
    per_cluster_labels: bool,
    engaged_clusters: Gauge,
    engagements: Counter,
    disengagements: Counter,
    engagement_failures: Family<Labels, Counter>,
    clusters_by_state: Family<Labels, Gauge>,
    cluster_state: Family<Labels, Gauge>,
    state_changes: Family<Labels, Counter>,
    reconciles: Family<Labels, Counter>,
    reconcile_errors: Family<Labels, Counter>,
    reconcile_time: Family<Labels, Histogram>,
    queue_depth: Family<Labels, Gauge>,
    fleet: crate::fleet::FleetView,
    /// The manager's clusters, read at each scrape.
    ages: Arc<Mutex<Option<AgeSource>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(false)
    }
}

impl Metrics {
    /// A fresh registry. With `per_cluster_labels`, reconcile metrics also
    /// carry a `cluster` label.
    // Long by design: every metric the library exports is registered here,
    // one after another, so their names and help texts read as one list.
    pub fn new(per_cluster_labels: bool) -> Self {
        let mut registry = Registry::default();
        let engaged_clusters = Gauge::default();
        let engagements = Counter::default();
        let disengagements = Counter::default();
        let engagement_failures = Family::<Labels, Counter>::default();
        let clusters_by_state = Family::<Labels, Gauge>::default();
        let cluster_state = Family::<Labels, Gauge>::default();
        let state_changes = Family::<Labels, Counter>::default();
        let reconciles = Family::<Labels, Counter>::default();
        let reconcile_errors = Family::<Labels, Counter>::default();
        let reconcile_time = Family::<Labels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.005, 2.0, 16))) as fn() -> Histogram,
        );
        let queue_depth = Family::<Labels, Gauge>::default();
        let inventory_failures = Family::<Labels, Gauge>::default();
        registry.register(
            "mcr_engaged_clusters",
            "Clusters currently engaged",
            engaged_clusters.clone(),
        );
        registry.register(
            "mcr_cluster_engagements",
            "Clusters engaged since start",
            engagements.clone(),
        );
        registry.register(
            "mcr_cluster_disengagements",
            "Clusters disengaged since start",
            disengagements.clone(),
        );
        registry.register(
            "mcr_cluster_engagement_failures",
            "Clusters that could not be engaged (unreachable, not synced), by provider-given reason",
            engagement_failures.clone(),
        );
        registry.register(
            "mcr_clusters",
            "Engaged clusters by state: syncing, ready, degraded, unreachable",
            clusters_by_state.clone(),
        );
        registry.register(
            "mcr_cluster_state_changes",
            "Times an engaged cluster entered each state (ready, degraded, unreachable); a cluster found unreachable while it is brought up counts once however often it is retried",
            state_changes.clone(),
        );
        if per_cluster_labels {
            registry.register(
                "mcr_cluster_state",
                "1 for each engaged cluster's current state (with per-cluster labels only)",
                cluster_state.clone(),
            );
        }
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles per controller and result",
            reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconcile errors per controller",
            reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Reconcile duration per controller",
            reconcile_time.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Requests waiting per controller",
            queue_depth.clone(),
        );
        registry.register(
            "mcr_inventory_failures",
            "Inventory objects (Secrets, Clusters, ClusterProfiles, contexts) that cannot become clusters now, by provider",
            inventory_failures.clone(),
        );
        let fleet = crate::fleet::FleetView::new(inventory_failures);
        let ages = Arc::new(Mutex::new(None));
        registry.register_collector(Box::new(ages::StateAges {
            source: ages.clone(),
            fleet: fleet.clone(),
            per_cluster_labels,
        }));
        Self {
            inner: Arc::new(Inner {
                registry: Mutex::new(registry),
                per_cluster_labels,
                engaged_clusters,
                engagements,
                disengagements,
                engagement_failures,
                clusters_by_state,
                cluster_state,
                state_changes,
                reconciles,
                reconcile_errors,
                reconcile_time,
                queue_depth,
                fleet,
                ages,
            }),
        }
    }

    /// Runs `register` on the registry, to add the application's own metrics.
    pub fn register(&self, register: impl FnOnce(&mut Registry)) {
        register(&mut multicluster_core::lock(&self.inner.registry));
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = multicluster_core::lock(&self.inner.registry);
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }

    /// Whether metrics carry a `cluster` label.
    pub fn per_cluster_labels(&self) -> bool {
        self.inner.per_cluster_labels
    }

    pub(crate) fn cluster_engaged(&self) {
        self.inner.engaged_clusters.inc();
        self.inner.engagements.inc();
    }

    pub(crate) fn cluster_disengaged(&self) {
        self.inner.engaged_clusters.dec();
        self.inner.disengagements.inc();
    }

    /// Counts a cluster that could not be engaged; providers call this for
    /// clusters they cannot even build (bad kubeconfig, missing Secret key).
    pub fn engagement_failed(&self, provider: &str, reason: &'static str) {
        self.inner
            .engagement_failures
            .get_or_create(&vec![
                ("provider", provider.to_string()),
                ("reason", reason.to_string()),
            ])
            .inc();
    }

    /// Sets `mcr_clusters{state}` from the counts of syncing, ready,
    /// degraded and unreachable clusters.
    pub(crate) fn cluster_states(&self, counts: [i64; 4]) {
        self.inner.fleet.engaged(counts);
        let [syncing, ready, degraded, unreachable] = counts;
        for (state, count) in [
            ("syncing", syncing),
            ("ready", ready),
            ("degraded", degraded),
            ("unreachable", unreachable),
        ] {
            self.inner
                .clusters_by_state
                .get_or_create(&vec![("state", state.to_string())])
                .set(count);
        }
    }

    /// Counts a cluster entering `state` in `mcr_cluster_state_changes`.
    pub(crate) fn state_changed(&self, state: &str) {
        self.inner
            .state_changes
            .get_or_create(&vec![("state", state.to_string())])
            .inc();
    }

    /// Records `cluster`'s state in `mcr_cluster_state` (with per-cluster
    /// labels only): 1 for `state`, and its other states gone.
    pub(crate) fn cluster_state(&self, cluster: &ClusterName, state: &str) {
        if !self.inner.per_cluster_labels {
            return;
        }
        self.cluster_gone(cluster);
        self.inner
            .cluster_state
            .get_or_create(&vec![
                ("cluster", cluster.as_str().to_string()),
                ("state", state.to_string()),
            ])
            .set(1);
    }

    /// Forgets `cluster` in `mcr_cluster_state`: it left the fleet.
    pub(crate) fn cluster_gone(&self, cluster: &ClusterName) {
        if !self.inner.per_cluster_labels {
            return;
        }
        for state in ["syncing", "ready", "degraded", "unreachable"] {
            self.inner.cluster_state.remove(&vec![
                ("cluster", cluster.as_str().to_string()),
                ("state", state.to_string()),
            ]);
        }
    }

    pub(crate) fn reconciled(
        &self,
        controller: &str,
        cluster: &ClusterName,
        result: &str,
        elapsed: Duration,
    ) {
        let mut labels: Labels = vec![("controller", controller.to_string())];
        if self.inner.per_cluster_labels {
            labels.push(("cluster", cluster.as_str().to_string()));
        }
        self.inner
            .reconcile_time
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if result != "success" {
            self.inner.reconcile_errors.get_or_create(&labels).inc();
        }
        labels.push(("result", result.to_string()));
        self.inner.reconciles.get_or_create(&labels).inc();
    }

    /// Reads the engaged clusters' time in state and failed attempts from
    /// `source` at each scrape (the manager that uses this registry).
    pub(crate) fn report_ages(&self, source: AgeSource) {
        *multicluster_core::lock(&self.inner.ages) = Some(source);
    }

    /// The fleet's summary and unusable inventory, shared with providers.
    pub(crate) fn fleet(&self) -> &crate::fleet::FleetView {
        &self.inner.fleet
    }

    pub(crate) fn queue_depth(&self, controller: &str, depth: usize) {
        self.inner
            .queue_depth
            .get_or_create(&vec![("name", controller.to_string())])
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod monitoring;
