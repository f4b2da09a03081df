//! The fleet as a whole: how many clusters are in each state, as a value to
//! subscribe to ([`crate::Manager::watch_fleet`]), and the inventory that
//! could not become clusters (a Secret without its key, a context naming a
//! user that does not exist, a credential plugin that fails), as providers
//! report it.
//!
//! Both travel with the manager's [`Metrics`](crate::metrics::Metrics),
//! which the manager hands to its provider before starting it, so every
//! provider that records its failures in
//! [`provider::failures::Failures`](crate::provider::failures::Failures)
//! shows them in [`crate::Manager::cluster_states`], on `/clusters` and in
//! `mcr_inventory_failures{provider}` without further wiring.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use multicluster_core::ClusterName;
use multicluster_core::lock;
use multicluster_core::redact::Redacted;

/// How many clusters are in each state. Subscribers are told of every
/// change ([`FleetSummary::changes`] moves even when the counts stay, as
/// when one cluster turns ready while another turns degraded); the details
/// are in [`crate::Manager::cluster_states`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetSummary {
    /// Engaged, waiting for the API server and cache.
    pub syncing: usize,
    /// Working.
    pub ready: usize,
    /// Working, but refused some watches or requests.
    pub degraded: usize,
    /// Not answering.
    pub unreachable: usize,
    /// Inventory objects that could not become clusters.
    pub unusable: usize,
    /// Inventory objects describing a cluster the fleet already holds under
    /// another name ([`multicluster_core::ClusterState::Duplicate`]).
    pub duplicates: usize,
    /// How many changes the fleet has seen.
    pub changes: u64,
}

/// An inventory object that could not become a cluster.
#[derive(Clone, Debug)]
pub(crate) struct Unusable {
    /// The provider that found it.
    pub(crate) provider: Arc<str>,
    /// Why it cannot become a cluster (the latest reason).
    pub(crate) reason: Redacted,
    /// Since when it is unusable.
    pub(crate) since: std::time::SystemTime,
    /// How often in a row the provider has failed to make a cluster of it.
    pub(crate) attempts: u32,
}

impl Unusable {
    /// Its status as the manager reports it.
    pub(crate) fn status(&self) -> multicluster_core::ClusterStatus {
        multicluster_core::ClusterStatus::from_parts(
            multicluster_core::ClusterState::Unusable(self.reason.clone()),
            self.since,
            self.attempts,
            None,
        )
    }
}

/// An inventory object describing a cluster the fleet holds under another
/// name.
#[derive(Clone, Debug)]
pub(crate) struct Duplicate {
    /// The provider that found it.
    pub(crate) provider: Arc<str>,
    /// The name the cluster is engaged (or wanted) under.
    pub(crate) of: ClusterName,
    /// Since when it is a duplicate of `of`.
    pub(crate) since: std::time::SystemTime,
}

impl Duplicate {
    /// Its status as the manager reports it.
    pub(crate) fn status(&self) -> multicluster_core::ClusterStatus {
        multicluster_core::ClusterStatus::from_parts(
            multicluster_core::ClusterState::Duplicate(self.of.clone()),
            self.since,
            0,
            None,
        )
    }
}

/// An inventory object whose cluster is being made: its client is built
/// (a credential plugin may be running).
#[derive(Clone, Debug)]
pub(crate) struct Building {
    /// The provider that found it.
    pub(crate) provider: Arc<str>,
    /// What it waits for.
    pub(crate) what: Redacted,
    /// Since when.
    pub(crate) since: std::time::SystemTime,
}

impl Building {
    /// Its status: syncing, waiting for what it waits for.
    pub(crate) fn status(&self) -> multicluster_core::ClusterStatus {
        multicluster_core::ClusterStatus::from_parts(
            multicluster_core::ClusterState::Syncing,
            self.since,
            0,
            None,
        )
        .waiting_for(self.what.clone())
    }
}

/// The fleet's summary, unusable inventory and duplicates, shared by the
/// manager and its provider. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct FleetView(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    summary: watch::Sender<FleetSummary>,
    /// What could not become a cluster, by name.
    unusable: Mutex<BTreeMap<ClusterName, Unusable>>,
    /// What describes a cluster held under another name, by name.
    duplicates: Mutex<BTreeMap<ClusterName, Duplicate>>,
    /// What is being made into a cluster, by name.
    building: Mutex<BTreeMap<ClusterName, Building>>,
    /// `mcr_inventory_failures{provider}`.
    gauge: Family<Vec<(&'static str, String)>, Gauge>,
}

impl FleetView {
    pub(crate) fn new(gauge: Family<Vec<(&'static str, String)>, Gauge>) -> Self {
        Self(Arc::new(Shared {
            summary: watch::Sender::new(FleetSummary::default()),
            unusable: Mutex::default(),
            duplicates: Mutex::default(),
            building: Mutex::default(),
            gauge,
        }))
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<FleetSummary> {
        self.0.summary.subscribe()
    }

    /// The engaged clusters' counts changed (or one changed state).
    pub(crate) fn engaged(&self, [syncing, ready, degraded, unreachable]: [i64; 4]) {
        let count = |n: i64| usize::try_from(n).unwrap_or_default();
        self.0.summary.send_modify(|summary| {
            summary.syncing = count(syncing);
            summary.ready = count(ready);
            summary.degraded = count(degraded);
            summary.unreachable = count(unreachable);
            summary.changes += 1;
        });
    }

    /// `provider` found `name` but cannot make a cluster of it (again).
    /// Subscribers are told when the object becomes unusable or its reason
    /// changes, not of every attempt.
    pub(crate) fn unusable(&self, provider: &str, name: &ClusterName, reason: Redacted) {
        let mut unusable = lock(&self.0.unusable);
        match unusable.get_mut(name) {
            Some(known) if &*known.provider == provider => {
                known.attempts = known.attempts.saturating_add(1);
                if known.reason == reason {
                    return;
                }
                known.reason = reason;
            }
            _ => {
                let before = unusable.insert(
                    name.clone(),
                    Unusable {
                        provider: provider.into(),
                        reason,
                        since: std::time::SystemTime::now(),
                        attempts: 1,
                    },
                );
                if let Some(was) = before {
                    self.gauge(&was.provider).dec();
                }
                self.gauge(provider).inc();
            }
        }
        self.publish(unusable.len());
    }

    /// `provider` made a cluster of `name` after all, or it is gone.
    pub(crate) fn usable(&self, provider: &str, name: &ClusterName) {
        let mut unusable = lock(&self.0.unusable);
        if unusable
            .get(name)
            .is_some_and(|recorded| &*recorded.provider == provider)
        {
            unusable.remove(name);
            self.gauge(provider).dec();
            self.publish(unusable.len());
        }
    }

    /// What could not become a cluster, sorted by name.
    pub(crate) fn unusable_inventory(&self) -> Vec<(ClusterName, Unusable)> {
        lock(&self.0.unusable)
            .iter()
            .map(|(name, unusable)| (name.clone(), unusable.clone()))
            .collect()
    }

    /// `provider` found `name`, which describes the cluster it holds as
    /// `of`; `None`: `name` is no longer a duplicate (of anything
    /// `provider` holds). Subscribers are told of changes only.
    pub(crate) fn duplicate(&self, provider: &str, name: &ClusterName, of: Option<&ClusterName>) {
        let mut duplicates = lock(&self.0.duplicates);
        let known = duplicates
            .get(name)
            .filter(|known| &*known.provider == provider);
        match (known, of) {
            (Some(known), Some(of)) if &known.of == of => return,
            (None, None) => return,
            (_, Some(of)) => {
                duplicates.insert(
                    name.clone(),
                    Duplicate {
                        provider: provider.into(),
                        of: of.clone(),
                        since: std::time::SystemTime::now(),
                    },
                );
            }
            (Some(_), None) => {
                duplicates.remove(name);
            }
        }
        let count = duplicates.len();
        drop(duplicates);
        self.0.summary.send_modify(|summary| {
            summary.duplicates = count;
            summary.changes += 1;
        });
    }

    /// What describes a cluster held under another name, sorted by name.
    pub(crate) fn duplicates(&self) -> Vec<(ClusterName, Duplicate)> {
        lock(&self.0.duplicates)
            .iter()
            .map(|(name, duplicate)| (name.clone(), duplicate.clone()))
            .collect()
    }

    fn gauge(&self, provider: &str) -> Gauge {
        self.0
            .gauge
            .get_or_create(&vec![("provider", provider.to_string())])
            .clone()
    }

    /// `provider` is making a cluster of `name`, waiting for `what`.
    pub(crate) fn building(&self, provider: &str, name: &ClusterName, what: Redacted) {
        lock(&self.0.building).insert(
            name.clone(),
            Building {
                provider: provider.into(),
                what,
                since: std::time::SystemTime::now(),
            },
        );
        self.0.summary.send_modify(|summary| summary.changes += 1);
    }

    /// `provider` is done making a cluster of `name` (made, failed or
    /// given up).
    pub(crate) fn built(&self, provider: &str, name: &ClusterName) {
        {
            let mut building = lock(&self.0.building);
            if building
                .get(name)
                .is_none_or(|known| &*known.provider != provider)
            {
                return;
            }
            building.remove(name);
        }
        self.0.summary.send_modify(|summary| summary.changes += 1);
    }

    /// Whether `name` is being made into a cluster.
    pub(crate) fn is_building(&self, name: &ClusterName) -> bool {
        lock(&self.0.building).contains_key(name)
    }

    /// What is being made into a cluster, sorted by name.
    pub(crate) fn in_building(&self) -> Vec<(ClusterName, Building)> {
        lock(&self.0.building)
            .iter()
            .map(|(name, building)| (name.clone(), building.clone()))
            .collect()
    }

    fn publish(&self, unusable: usize) {
        self.0.summary.send_modify(|summary| {
            summary.unusable = unusable;
            summary.changes += 1;
        });
    }
}
