//! The fences of the namespace, as one watch of its Leases follows them,
//! so that an heir finds what it inherits without a request.
//!
//! An heir used to list the fences of an ended epoch by their label the
//! moment it learned of the record naming it. At 100,000 clusters over ten
//! replicas that was nine lists at once, each making the API server filter
//! every fence: 3.6–4.4 s on a quiet machine, 5.5–11 s after a kill just
//! after a renewal, over 30 s while two restarted replicas listed their
//! namespaces beside them, when the clusters had waited the peer Lease's
//! 30 s already.
//!
//! Why one watch of every Lease in the namespace, peer Leases and fences
//! alike, and not of the fences alone: the API server sends one watch's
//! events in the order it wrote them. Once the mirror shows the record of
//! an ended epoch on its peer Lease, it has taken in every write to a
//! fence before that one, so what it holds for that epoch is what a list
//! then would have answered (later writes are the heirs' rewrites, each of
//! its own share; a list would miss those written after it as well).
//! Until the mirror has shown every record an heir needs, or before it has
//! synced at all, the heir waits for it a little and then lists.
//!
//! Only fences held with a peer Lease and peer Leases carrying records are
//! kept, without their managed fields: at 100,000 clusters about 200 MiB
//! more per replica (1,638 MiB against 1,442). A replica follows them once
//! it is ready (only ready replicas are named heirs) and its share has
//! settled: followed from a cold start, each of the start's 100,000 fence
//! writes went to every replica, and the start took a quarter longer.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;

use super::heirs;
use crate::lease;
use crate::lock;

/// The fences the watch has shown, by the epoch they are held with.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    state: std::sync::Mutex<State>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Whether a first list has been taken in: before, nothing is known.
    synced: bool,
    shown: Shown,
    /// Filled by a (re)list until it is complete, then shown.
    relisting: Option<Shown>,
}

#[derive(Debug, Default)]
struct Shown {
    /// Fences by `<peer Lease>/<epoch>` they are held with, then by name.
    fences: HashMap<String, HashMap<String, Lease>>,
    /// The epoch each fence is held with, to move or drop it.
    held_with: HashMap<String, String>,
    /// The `<peer Lease>/<epoch>` of every record of heirs on each peer
    /// Lease.
    records: HashMap<String, HashSet<String>>,
}

impl Shown {
    fn apply(&mut self, mut lease: Lease) {
        let Some(name) = lease.metadata.name.clone() else {
            return;
        };
        self.remove(&name);
        let records: HashSet<String> = heirs::records(&lease)
            .into_iter()
            .map(|record| format!("{name}/{}", record.epoch))
            .collect();
        if !records.is_empty() {
            self.records.insert(name.clone(), records);
        }
        let Some(held_with) = lease::held_with_of(&lease).map(str::to_string) else {
            return;
        };
        lease.metadata.managed_fields = None;
        self.held_with.insert(name.clone(), held_with.clone());
        self.fences
            .entry(held_with)
            .or_default()
            .insert(name, lease);
    }

    fn remove(&mut self, name: &str) {
        self.records.remove(name);
        let Some(held_with) = self.held_with.remove(name) else {
            return;
        };
        if let Some(fences) = self.fences.get_mut(&held_with) {
            fences.remove(name);
            if fences.is_empty() {
                self.fences.remove(&held_with);
            }
        }
    }

    fn has_record(&self, key: &str) -> bool {
        key.split_once('/')
            .and_then(|(peer_lease, _)| self.records.get(peer_lease))
            .is_some_and(|records| records.contains(key))
    }
}

impl Mirror {
    /// Whether the watch has listed the Leases once: until then the mirror
    /// shows nothing.
    pub(crate) fn synced(&self) -> bool {
        lock(&self.state).synced
    }

    /// Completes once the watch has listed the Leases once (for tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) async fn until_synced(&self) {
        loop {
            // Registered before the check: a list taken in between wakes it.
            let changed = self.changed.notified();
            if self.synced() {
                return;
            }
            changed.await;
        }
    }

    /// The fences held with each of `epochs` (`<peer Lease>/<epoch>`, each
    /// ended by a record of heirs), if the watch has shown every one of
    /// those records: then nothing written before them is missing.
    pub(crate) fn fences_of(&self, epochs: &[&String]) -> Option<Vec<Vec<Lease>>> {
        let state = lock(&self.state);
        if !state.synced || !epochs.iter().all(|key| state.shown.has_record(key)) {
            return None;
        }
        Some(
            epochs
                .iter()
                .map(|key| {
                    state
                        .shown
                        .fences
                        .get(key.as_str())
                        .map(|fences| fences.values().cloned().collect())
                        .unwrap_or_default()
                })
                .collect(),
        )
    }

    /// [`fences_of`](Self::fences_of), waiting up to `patience` for the
    /// watch to show the records (it follows the same writes the peer reads
    /// found, a moment apart); `None` if it has not synced or did not.
    pub(crate) async fn wait_for(
        &self,
        epochs: &[&String],
        patience: Duration,
    ) -> Option<Vec<Vec<Lease>>> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let changed = self.changed.notified();
            if let Some(fences) = self.fences_of(epochs) {
                return Some(fences);
            }
            if !self.synced() {
                return None;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }

    fn take_in(&self, event: watcher::Event<Lease>) {
        let mut state = lock(&self.state);
        match event {
            watcher::Event::Init => state.relisting = Some(Shown::default()),
            watcher::Event::InitApply(lease) => {
                if let Some(relisting) = state.relisting.as_mut() {
                    relisting.apply(lease);
                }
            }
            watcher::Event::InitDone => {
                if let Some(relisted) = state.relisting.take() {
                    if !state.synced {
                        let fences = relisted.held_with.len();
                        tracing::info!(
                            fences,
                            "following the fences: what this replica inherits is found without a list"
                        );
                    }
                    state.shown = relisted;
                    state.synced = true;
                }
            }
            watcher::Event::Apply(lease) => state.shown.apply(lease),
            watcher::Event::Delete(lease) => {
                if let Some(name) = lease.metadata.name.as_deref() {
                    state.shown.remove(name);
                }
            }
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Follows the Leases of `api`'s namespace. Never completes; a watch
    /// that fails starts over (with a list) after a backoff, and until its
    /// list is complete the mirror shows what it showed before.
    pub(crate) async fn follow(&self, api: Api<Lease>) {
        // From the API server's watch cache: what matters is the order of
        // what follows, not that the first list is the latest.
        let config = watcher::Config::default().any_semantic();
        let mut events = watcher(api, config)
            .backoff(multicluster_runtime::cache::WatchBackoff::default().strategy())
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => self.take_in(event),
                Err(err) => {
                    tracing::debug!(error = %crate::watcher_error(&err), "following the fences failed; retrying");
                }
            }
        }
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn fence(name: &str, held_with: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                annotations: Some(
                    [(
                        wire::HELD_WITH_ANNOTATION.to_string(),
                        held_with.to_string(),
                    )]
                    .into(),
                ),
                managed_fields: Some(vec![Default::default()]),
                ..ObjectMeta::default()
            },
            ..Lease::default()
        }
    }

    fn ended(peer_lease: &str, epoch: &str) -> Lease {
        let record = heirs::Record::new("gone", epoch, Vec::new());
        Lease {
            metadata: ObjectMeta {
                name: Some(peer_lease.to_string()),
                annotations: Some(
                    [(
                        wire::HEIRS_ANNOTATION.to_string(),
                        serde_json::to_string(&[record]).expect("json"),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..Lease::default()
        }
    }

    fn names(fences: &[Lease]) -> Vec<String> {
        let mut names: Vec<String> = fences
            .iter()
            .filter_map(|fence| fence.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_epochs_fences_are_shown_once_its_record_is_and_only_after_a_complete_list() {
        let mirror = Mirror::default();
        let e1 = "mcr-peer-gone/e1".to_string();
        mirror.take_in(watcher::Event::Init);
        mirror.take_in(watcher::Event::InitApply(fence("f1", &e1)));
        mirror.take_in(watcher::Event::InitApply(ended("mcr-peer-gone", "e1")));
        assert!(
            mirror.fences_of(&[&e1]).is_none(),
            "shown before the list was complete"
        );
        mirror.take_in(watcher::Event::InitDone);
        let shown = mirror.fences_of(&[&e1]).expect("shown");
        assert_eq!(names(&shown[0]), ["f1"]);
        assert!(shown[0][0].metadata.managed_fields.is_none());

        // A fence rewritten by its heir moves; one deleted goes.
        mirror.take_in(watcher::Event::Apply(fence("f2", &e1)));
        mirror.take_in(watcher::Event::Apply(fence("f1", "mcr-peer-me/m1")));
        assert_eq!(names(&mirror.fences_of(&[&e1]).expect("shown")[0]), ["f2"]);
        mirror.take_in(watcher::Event::Delete(fence("f2", &e1)));
        assert_eq!(mirror.fences_of(&[&e1]).expect("shown"), vec![Vec::new()]);

        // An epoch whose record the watch has not shown yet: nothing.
        let e2 = "mcr-peer-other/e2".to_string();
        mirror.take_in(watcher::Event::Apply(fence("f3", &e2)));
        assert!(mirror.fences_of(&[&e1, &e2]).is_none());
        mirror.take_in(watcher::Event::Apply(ended("mcr-peer-other", "e2")));
        let shown = mirror.fences_of(&[&e1, &e2]).expect("shown");
        assert_eq!(names(&shown[1]), ["f3"]);

        // A relist shows what it found once it is complete.
        mirror.take_in(watcher::Event::Init);
        mirror.take_in(watcher::Event::InitApply(ended("mcr-peer-other", "e2")));
        assert_eq!(names(&mirror.fences_of(&[&e2]).expect("shown")[0]), ["f3"]);
        mirror.take_in(watcher::Event::InitDone);
        assert_eq!(mirror.fences_of(&[&e2]).expect("shown"), vec![Vec::new()]);
        assert!(
            mirror.fences_of(&[&e1]).is_none(),
            "a record gone with its Lease"
        );
    }
}
