//! The clusters one component holds, each under its latest engagement:
//! for components that implement [`Aware`](crate::Aware) outside this
//! crate (webhooks, coordinators), the same rules as the manager's and the
//! controllers'.
//!
//! Every part that receives clusters (the manager, controllers, the
//! coordinators) and the provider-side set obey the same rules, kept here
//! so they cannot drift apart:
//!
//! - a call whose lifetime has already ended is stale (it lost a race with
//!   the cluster leaving or being replaced) and changes nothing;
//! - the same instance under a live engagement is the same engagement;
//! - a new instance under a known name replaces the old one, whose
//!   lifetime ends there, so its work stops even if the provider forgot to
//!   end it;
//! - clean-up after a lifetime ends removes only the engagement it was
//!   started for (its generation), never a newer one under the same name.
//!
//! # One engagement, end to end
//!
//! 1. `provider/clusters.rs`: a provider adds a cluster to its set
//!    (`Clusters::add`, `add_or_replace`; providers that discover from
//!    objects do it from `provider/discovery.rs`, `Discovered::engage`);
//!    the set hands it to the manager in order (`Clusters::hand_over`).
//! 2. `manager/tracking.rs`: `Manager::engage` holds it as syncing (a
//!    replaced instance's lifetime ends here) and spawns
//!    `Manager::bring_up`, which, in this order: probes its API server
//!    (`probe_server`; unreachable meanwhile, retried with backoff); hands
//!    it to the coordinator (`Manager::hand_over`, step 3), whose
//!    components start their watches before it returns; waits up to
//!    `sync_timeout` for those watches to list (`Cache::synced`); and
//!    moves it to the state `Progress::due` gives (`manager/progress.rs`:
//!    ready once every watch listed, degraded or unreachable by a failing
//!    one). Every change of its state goes through `States::move_to`
//!    (counts, gauges, the state-change counter, the log line).
//! 3. `coordinator/mod.rs` (or a coordinator of `multicluster-coordinator`:
//!    `leader_election.rs`, `sharding/`): the coordinator decides whether
//!    this replica works on it and engages the components (`engage_each`).
//! 4. `controller/mod.rs`: `Controller::engage` takes the cluster's
//!    requests from now on and starts its sources (`controller/source.rs`),
//!    which subscribe to the cluster's informers (`cache/`): the informer is
//!    created on the first subscription (`Cache::informer`), and a
//!    subscriber that comes late gets the store's contents first
//!    (`Informer::subscribe`).
//!
//! The lifetimes form a tree of cancellation tokens; ending one ends
//! everything under it:
//!
//! ```text
//! shutdown (given to Manager::run)
//! └─ stop: the controllers' runners take no more requests
//!
//! components_stop (Manager::run ends it once running reconciles are done)
//! └─ the provider's run (RunnableProvider::start)
//!    └─ the set's lifetime of a cluster (Clusters, one per engagement)
//!       └─ the manager's engagement (Manager::engage)
//!          └─ the coordinator's work on it (ended when the Lease is lost
//!             or the fence moves: sync::child_until)
//!             └─ each component's engagement (Controller::engage)
//!                └─ each source's subscription (Source::start)
//! ```
//!
//! Reconciles are not in the tree: the controller's runner stops taking
//! requests at shutdown and lets running ones finish within the grace
//! period; a cluster that leaves has its queued requests dropped. Every
//! wait at shutdown (running reconciles, the coordinator, the provider) is
//! bounded by `sync::stop_within`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use multicluster_core::ClusterName;

/// One cluster as a component holds it.
pub struct Engagement<T> {
    /// The cluster.
    pub cluster: Cluster,
    /// Ends when the cluster leaves the fleet or is replaced.
    pub lifetime: CancellationToken,
    /// Tells this engagement from a later one under the same name.
    pub generation: u64,
    /// What the component keeps for the cluster.
    pub data: T,
}

impl<T> Engagement<T> {
    /// Whether its lifetime has not ended.
    pub fn is_live(&self) -> bool {
        !self.lifetime.is_cancelled()
    }
}

/// How an engagement compares with what is held under its name.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Its lifetime ended before it arrived: ignore it.
    Stale,
    /// The instance already held under a live engagement.
    Again,
    /// A cluster not held, or a new instance under a held name.
    New,
}

/// A component's clusters by name.
pub struct Engagements<T> {
    entries: BTreeMap<ClusterName, Engagement<T>>,
}

impl<T> Default for Engagements<T> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
        }
    }
}

impl<T> Engagements<T> {
    /// How `cluster`, engaged under `name` for `lifetime`, relates to what is
    /// held.
    pub fn arrival(
        &self,
        name: &ClusterName,
        cluster: &Cluster,
        lifetime: &CancellationToken,
    ) -> Arrival {
        if lifetime.is_cancelled() {
            return Arrival::Stale;
        }
        match self.entries.get(name) {
            Some(held) if held.is_live() && held.cluster.same_instance(cluster) => Arrival::Again,
            _ => Arrival::New,
        }
    }

    /// Holds `cluster` under `name` with a lifetime that is a child of
    /// `lifetime` (so ending it here never ends the caller's), ending the
    /// engagement it replaces, which is returned.
    pub fn insert(
        &mut self,
        name: ClusterName,
        cluster: Cluster,
        lifetime: &CancellationToken,
        data: T,
    ) -> (&mut Engagement<T>, Option<Engagement<T>>) {
        let (held, replaced) = self.insert_ending_later(name, cluster, lifetime, data);
        if let Some(old) = &replaced {
            old.lifetime.cancel();
        }
        (held, replaced)
    }

    /// Holds `cluster` under `name` as [`Engagements::insert`] does, unless
    /// the call is stale or engages the same instance again
    /// ([`Engagements::arrival`]); returns the new engagement's lifetime and
    /// generation, for the clean-up when it ends.
    pub fn insert_new(
        &mut self,
        name: &ClusterName,
        cluster: &Cluster,
        lifetime: &CancellationToken,
        data: T,
    ) -> Option<(CancellationToken, u64)> {
        if self.arrival(name, cluster, lifetime) != Arrival::New {
            return None;
        }
        let (held, _) = self.insert(name.clone(), cluster.clone(), lifetime, data);
        Some((held.lifetime.clone(), held.generation))
    }

    /// Like [`Engagements::insert`], but the replaced engagement is
    /// returned with its lifetime still running: the caller ends it once
    /// the new one has been handed on, so that nobody downstream sees the
    /// cluster leave in between.
    pub fn insert_ending_later(
        &mut self,
        name: ClusterName,
        cluster: Cluster,
        lifetime: &CancellationToken,
        data: T,
    ) -> (&mut Engagement<T>, Option<Engagement<T>>) {
        let engagement = Engagement {
            cluster,
            lifetime: lifetime.child_token(),
            generation: next_generation(),
            data,
        };
        let replaced = self.entries.insert(name.clone(), engagement);
        let held = self
            .entries
            .get_mut(&name)
            .expect("the entry was inserted above");
        (held, replaced)
    }

    /// The engagement under `name`, live or not.
    pub fn get(&self, name: &ClusterName) -> Option<&Engagement<T>> {
        self.entries.get(name)
    }

    /// The engagement under `name`, live or not.
    pub fn get_mut(&mut self, name: &ClusterName) -> Option<&mut Engagement<T>> {
        self.entries.get_mut(name)
    }

    /// The live engagement under `name`.
    pub fn live(&self, name: &ClusterName) -> Option<&Engagement<T>> {
        self.entries.get(name).filter(|held| held.is_live())
    }

    /// The engagement under `name` if it is still the one of `generation`.
    pub fn current_mut(
        &mut self,
        name: &ClusterName,
        generation: u64,
    ) -> Option<&mut Engagement<T>> {
        self.entries
            .get_mut(name)
            .filter(|held| held.generation == generation)
    }

    /// Removes the engagement of `generation` once its lifetime has ended;
    /// a newer one under the same name stays.
    pub fn end(&mut self, name: &ClusterName, generation: u64) -> Option<Engagement<T>> {
        self.current_mut(name, generation)?;
        self.entries.remove(name)
    }

    /// Removes the engagement under `name` and ends its lifetime.
    pub fn remove(&mut self, name: &ClusterName) -> Option<Engagement<T>> {
        let removed = self.entries.remove(name)?;
        removed.lifetime.cancel();
        Some(removed)
    }

    /// Keeps the engagements for which `keep` is true and ends the others.
    pub fn retain(&mut self, mut keep: impl FnMut(&ClusterName, &mut Engagement<T>) -> bool) {
        self.entries.retain(|name, held| {
            let kept = keep(name, held);
            if !kept {
                held.lifetime.cancel();
            }
            kept
        });
    }

    /// Forgets engagements whose lifetime has ended.
    pub fn prune(&mut self) {
        self.entries.retain(|_, held| held.is_live());
    }

    /// Names held, live or not, sorted.
    pub fn names(&self) -> Vec<ClusterName> {
        self.entries.keys().cloned().collect()
    }

    /// The engagements held, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&ClusterName, &Engagement<T>)> {
        self.entries.iter()
    }

    /// The engagements held, by name, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&ClusterName, &mut Engagement<T>)> {
        self.entries.iter_mut()
    }

    /// The engagements held.
    pub fn values(&self) -> impl Iterator<Item = &Engagement<T>> {
        self.entries.values()
    }
}

/// Runs `then` once `lifetime` has ended.
pub fn when_ended(lifetime: &CancellationToken, then: impl FnOnce() + Send + 'static) {
    let lifetime = lifetime.clone();
    tokio::spawn(async move {
        lifetime.cancelled().await;
        then();
    });
}

/// A number no other call in this process returns.
fn next_generation() -> u64 {
    static GENERATION: AtomicU64 = AtomicU64::new(0);
    GENERATION.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str) -> Cluster {
        let config = kube::Config::new("https://127.0.0.1:1".parse().expect("uri"));
        Cluster::new(name, kube::Client::try_from(config).expect("client"))
    }

    #[tokio::test]
    async fn the_same_instance_is_the_same_engagement_and_a_new_one_replaces_it() {
        let mut held = Engagements::default();
        let provider = CancellationToken::new();
        let first = cluster("a");
        assert_eq!(held.arrival(&"a".into(), &first, &provider), Arrival::New);
        let (engagement, replaced) = held.insert("a".into(), first.clone(), &provider, ());
        let (old_lifetime, old_generation) = (engagement.lifetime.clone(), engagement.generation);
        assert!(replaced.is_none());
        assert_eq!(held.arrival(&"a".into(), &first, &provider), Arrival::Again);

        let second = cluster("a");
        assert_eq!(held.arrival(&"a".into(), &second, &provider), Arrival::New);
        let (_, replaced) = held.insert("a".into(), second, &provider, ());
        assert!(replaced.is_some_and(|old| old.generation == old_generation));
        assert!(old_lifetime.is_cancelled(), "the replaced engagement ends");
        assert!(!provider.is_cancelled(), "the caller's lifetime does not");
        assert!(
            held.end(&"a".into(), old_generation).is_none(),
            "the old engagement's clean-up leaves the new one"
        );
        assert!(held.live(&"a".into()).is_some());
    }

    #[tokio::test]
    async fn an_engagement_whose_lifetime_ended_is_stale() {
        let held = Engagements::<()>::default();
        let ended = CancellationToken::new();
        ended.cancel();
        assert_eq!(
            held.arrival(&"a".into(), &cluster("a"), &ended),
            Arrival::Stale
        );
    }
}
