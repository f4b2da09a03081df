//! Heirs: the clusters of a replica that is gone go on at once, without a
//! write per cluster.
//!
//! With fences held with the peer Lease, a replica's fences are free once
//! its epoch has ended by a write (the others clear a lapsed peer Lease's
//! holder; a replica that stops clears its own). Each next owner then took
//! each fence with a write of its own before working on the cluster: at
//! 100,000 clusters over ten replicas, 10,000 writes after a SIGKILL, which
//! this machine's API server does in 10–15 s, on top of the 20–30 s the
//! Lease takes to lapse; the last clusters waited longer than the Lease
//! and a look.
//!
//! Now the write that ends an epoch also names its heirs
//! ([`wire::HEIRS_ANNOTATION`] on the peer Lease): the live, ready peers
//! with their epochs, as the writer saw them. A fence held in that epoch
//! belongs to the owner among the heirs (rendezvous hashing, as always),
//! for as long as that heir's epoch lives. Every replica follows the same
//! record, so a take of such a fence by anyone else finds it held by the
//! heir. Each heir finds the fences of the ended epoch by their label
//! ([`wire::HELD_WITH_LABEL`]) in what its watch of the namespace's
//! Leases shows ([`super::mirror`]), or with one list when the watch has
//! not shown the record yet, and works on its share at once. It writes
//! each fence as its own later, a few hundred per look
//! ([`REWRITES_PER_LOOK`]), within [`INHERIT_WINDOW`]; an inherited fence
//! not written by then stops being worked on. Records are kept on the
//! Lease for twice that, so a fence still naming the ended epoch after
//! the window has no heir and is free.
//!
//! Listing runs beside the looks, the moment a peer read learns of heirs
//! named (a look with thousands of clusters to hand over or take lasts
//! tens of seconds); while a fresh record naming this replica is listed,
//! the looks take nothing (a take writes the fence, the listing does not).
//! While peers leave or join, the rewrites wait (their hand-overs and
//! takes come first) unless half the window is gone. An inherited fence
//! whose work stopped while the peer Lease went unrenewed resumes as it
//! is, as a replica's own fences do, while the records still name it.
//!
//! An heir whose own epoch ends before it wrote an inherited fence as its
//! own passes it on by its own record: the fence goes from heir to heir
//! (a replica that inherited clusters of a killed one and was restarted
//! moments later), and its next heirs list the earlier epoch's fences too.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::ListParams;
use serde::{Deserialize, Serialize};

use super::hrw::{self, Peer};
use super::lifecycle::Phase;
use super::{ShardedCoordinator, Starting, engage_or_hand_back};
use crate::fence;
use crate::lease::{self, Heir, Hold};
use crate::lock;
use crate::wire;
use multicluster_runtime::ClusterName;
use multicluster_runtime::health::repeats::Telling;
use multicluster_runtime::redact::Redacted;

/// How long an heir works on a fence it inherited without having written
/// it as its own. Writing 10,000 at a few hundred per look takes well
/// under a minute.
pub(crate) const INHERIT_WINDOW: SignedDuration = SignedDuration::from_mins(5);

/// How long a record of heirs is followed (and kept on the peer Lease):
/// twice the window, so replicas whose clocks run somewhat ahead of the
/// heir's still find a fence inherited while the heir may work on it.
const FOLLOWED_FOR: SignedDuration = SignedDuration::from_mins(10);

/// How many inherited fences one look writes as this replica's own: a
/// few hundred per look keeps the writes well below what the API server
/// needs for the hand-overs and takes that make clusters wait.
pub(crate) const REWRITES_PER_LOOK: usize = 256;

/// Whether an inherited fence that may be worked on without being written
/// until `until` should be written now even while peers leave or join:
/// half of its window is gone.
pub(crate) fn rewrite_is_due(until: Timestamp) -> bool {
    Timestamp::now()
        .checked_add(INHERIT_WINDOW / 2)
        .is_ok_and(|half_left| half_left >= until)
}

/// Who inherited the fences of one ended epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Record {
    /// The ended epoch.
    pub(crate) epoch: String,
    /// The replica that held it.
    pub(crate) holder: String,
    /// When it ended (RFC 3339).
    pub(crate) at: String,
    /// The live, ready peers when it ended.
    pub(crate) heirs: Vec<HeirPeer>,
}

/// A peer named heir, as rendezvous hashing weighs it, and the epoch it
/// inherits in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HeirPeer {
    /// Its peer ID.
    pub(crate) id: String,
    /// Its weight.
    pub(crate) weight: u32,
    /// `<its peer Lease>/<its epoch>`.
    pub(crate) held_with: String,
}

impl Record {
    /// A record of `holder`'s `epoch` ending now, inherited by `heirs`.
    pub(crate) fn new(holder: &str, epoch: &str, heirs: Vec<HeirPeer>) -> Self {
        Self {
            epoch: epoch.to_string(),
            holder: holder.to_string(),
            at: Timestamp::now().to_string(),
            heirs,
        }
    }

    fn at(&self) -> Option<Timestamp> {
        self.at.parse().ok()
    }

    /// Until when an heir works on a fence it inherited by this record
    /// without writing it (`None`: never; the record is unreadable).
    pub(crate) fn inherit_until(&self) -> Option<Timestamp> {
        self.at()?.checked_add(INHERIT_WINDOW).ok()
    }

    /// Whether the record is still followed at `now`.
    pub(crate) fn followed_at(&self, now: Timestamp) -> bool {
        self.at()
            .and_then(|at| at.checked_add(FOLLOWED_FOR).ok())
            .is_some_and(|until| now < until)
    }

    /// The heir of `cluster`'s fence: its owner among the heirs.
    pub(crate) fn heir_for(&self, cluster: &str) -> Option<Heir> {
        let mut peers: Vec<Peer> = self
            .heirs
            .iter()
            .map(|heir| Peer {
                id: heir.id.clone(),
                weight: heir.weight,
            })
            .collect();
        peers.sort_by(|a, b| a.id.cmp(&b.id));
        let owner = hrw::owner(cluster, &peers)?;
        let heir = self.heirs.iter().find(|heir| heir.id == owner.id)?;
        Some(Heir {
            id: heir.id.clone(),
            held_with: heir.held_with.clone(),
        })
    }
}

/// The records of heirs on `peer` (a peer Lease); none if unreadable.
pub(crate) fn records(peer: &Lease) -> Vec<Record> {
    peer.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(wire::HEIRS_ANNOTATION))
        .and_then(|value| serde_json::from_str(value).ok())
        .unwrap_or_default()
}

/// The annotation naming `record` and the records on `peer` still followed
/// at `now`.
pub(crate) fn annotation_with(peer: &Lease, record: Record, now: Timestamp) -> Option<String> {
    let mut kept: Vec<Record> = records(peer)
        .into_iter()
        .filter(|kept| kept.followed_at(now) && kept.epoch != record.epoch)
        .collect();
    kept.push(record);
    serde_json::to_string(&kept).ok()
}

/// Whether records written at `at` are no longer followed at `now`.
pub(crate) fn no_longer_followed(at: Timestamp, now: Timestamp) -> bool {
    at.checked_add(FOLLOWED_FOR).is_ok_and(|until| now >= until)
}

/// Whether `peer` (a peer Lease) carries a record of heirs followed at
/// `now`.
pub(crate) fn followed_on(peer: &Lease, now: Timestamp) -> bool {
    records(peer).iter().any(|record| record.followed_at(now))
}

/// The records of heirs a replica knows, by the `<peer Lease>/<epoch>`
/// they are for, and which of them it has listed the fences of.
#[derive(Debug, Default)]
pub(crate) struct Known {
    records: BTreeMap<String, Record>,
    listed: std::collections::HashSet<String>,
}

impl Known {
    /// Takes in the records on `peer`, a peer Lease as read; whether one
    /// was new.
    pub(crate) fn learn(&mut self, peer: &Lease, now: Timestamp) -> bool {
        let Some(name) = peer.metadata.name.as_deref() else {
            return false;
        };
        let mut new = false;
        for record in records(peer).into_iter().filter(|r| r.followed_at(now)) {
            let key = format!("{name}/{}", record.epoch);
            if let std::collections::btree_map::Entry::Vacant(entry) = self.records.entry(key) {
                new = true;
                entry.insert(record);
            }
        }
        self.records.retain(|_, record| record.followed_at(now));
        let records = &self.records;
        self.listed.retain(|key| records.contains_key(key));
        new
    }

    /// The hold on `cluster`'s fence held with `(peer_lease, epoch)`, if a
    /// record of heirs followed at `now` is for that epoch.
    pub(crate) fn hold(
        &self,
        peer_lease: &str,
        epoch: &str,
        cluster: &str,
        now: Timestamp,
    ) -> Option<Hold> {
        let record = self.records.get(&lease::held_with(peer_lease, epoch))?;
        if !record.followed_at(now) {
            return None;
        }
        Some(
            record
                .heir_for(cluster)
                .map_or(Hold::Ended, Hold::Inherited),
        )
    }

    /// Whether a record of heirs is known for `held_with`.
    pub(crate) fn has(&self, held_with: &str) -> bool {
        self.records.contains_key(held_with)
    }

    /// The records naming `held_with` (this replica's standing) an heir,
    /// whose fences it has not listed yet and may still inherit at `now`.
    pub(crate) fn unlisted_for(&self, held_with: &str, now: Timestamp) -> Vec<(String, Record)> {
        self.records
            .iter()
            .filter(|(key, _)| !self.listed.contains(*key))
            .filter(|(_, record)| record.heirs.iter().any(|h| h.held_with == held_with))
            .filter(|(_, record)| record.inherit_until().is_some_and(|until| now < until))
            .map(|(key, record)| (key.clone(), record.clone()))
            .collect()
    }

    /// Whether a record naming `held_with` an heir, written less than
    /// `lately` before `now`, has not been listed yet: the looks leave the
    /// takes to the listing meanwhile (a take writes the fence, the
    /// listing does not).
    pub(crate) fn awaits_listing(
        &self,
        held_with: &str,
        now: Timestamp,
        lately: SignedDuration,
    ) -> bool {
        self.unlisted_for(held_with, now).iter().any(|(_, record)| {
            record
                .at()
                .and_then(|at| at.checked_add(lately).ok())
                .is_some_and(|until| now < until)
        })
    }

    /// Remembers that the fences of `key` were listed.
    pub(crate) fn listed(&mut self, key: &str) {
        self.listed.insert(key.to_string());
    }

    /// Where `cluster`'s fence held with `held_with` went, following the
    /// records followed at `now` from heir to heir (an heir whose epoch
    /// ended too passed it on by its own record): the last heir, and until
    /// when it may work on the fence without writing it (the earliest of
    /// the records'). `None` when `held_with` names no record, or a record
    /// on the way names no heir for it.
    pub(crate) fn chain(
        &self,
        held_with: &str,
        cluster: &str,
        now: Timestamp,
    ) -> Option<(Heir, Timestamp)> {
        let mut record = self.records.get(held_with)?;
        let mut until = record.inherit_until()?;
        for _ in 0..lease::MAX_HEIRS_FOLLOWED {
            if !record.followed_at(now) {
                return None;
            }
            let heir = record.heir_for(cluster)?;
            match self.records.get(&heir.held_with) {
                Some(next) => {
                    record = next;
                    until = until.min(next.inherit_until()?);
                }
                None => return Some((heir, until)),
            }
        }
        None
    }

    /// The records whose fences may have gone, through heirs, to the heirs
    /// of `key`'s record: `key` and every record naming as an heir one
    /// of these.
    pub(crate) fn sources_of(&self, key: &str) -> Vec<String> {
        let mut sources = vec![key.to_string()];
        loop {
            let more: Vec<String> = self
                .records
                .iter()
                .filter(|(source, _)| !sources.contains(source))
                .filter(|(_, record)| {
                    record
                        .heirs
                        .iter()
                        .any(|heir| sources.contains(&heir.held_with))
                })
                .map(|(source, _)| source.clone())
                .collect();
            if more.is_empty() {
                return sources;
            }
            sources.extend(more);
        }
    }
}

impl ShardedCoordinator {
    /// Finds and works on what this replica inherits as soon as the peer
    /// reads learn of heirs named, and again every look interval (a list
    /// that failed, a standing that was not live yet). Not while leaving:
    /// nobody names a leaving replica an heir. Never completes.
    pub(super) async fn keep_inheriting(self) {
        loop {
            tokio::select! {
                () = self.inner.inheritance.until_news() => {}
                () = tokio::time::sleep(self.inner.options.probe_interval) => {}
            }
            if !self.inner.lifecycle.reached(Phase::SaidLeaving) {
                self.inherit().await;
            }
        }
    }

    /// Whether heirs named in the last few seconds include this replica
    /// and their fences have not been listed yet.
    pub(super) fn inheriting(&self) -> bool {
        let standing = self.inner.standing.borrow().clone();
        if standing.live().is_none() {
            return false;
        }
        let mine = standing.held_with();
        let lately = SignedDuration::try_from(self.inner.options.peer_renew_interval)
            .unwrap_or(SignedDuration::ZERO);
        lock(self.inner.view.epochs())
            .heirs
            .awaits_listing(&mine, Timestamp::now(), lately)
    }

    /// `last`, a fence this replica inherited and held as listed before
    /// its work on it stopped, as a fence held again without a request if
    /// the records still name this replica (in its `standing`) its heir;
    /// and until when it may be worked on so.
    pub(super) fn still_inherited(
        &self,
        last: &Lease,
        name: &ClusterName,
        standing: &fence::Standing,
    ) -> Option<(fence::Fence, Timestamp)> {
        let live = standing.live()?;
        let mine = standing.held_with();
        let held_with = lease::held_with_of(last)?;
        let now = Timestamp::now();
        let (heir, until) =
            lock(self.inner.view.epochs())
                .heirs
                .chain(held_with, name.as_str(), now)?;
        if heir.held_with != mine || now >= until {
            return None;
        }
        let fence_name = self.fence_name(name);
        Some((fence::Fence::handed(fence_name, live, last.clone()), until))
    }

    /// Works on the clusters this replica inherited from ended epochs
    /// whose records name it an heir in its current epoch: each epoch's
    /// fences as the [mirror](super::mirror) shows them (or one list of
    /// them), and no write before the work starts. A list that fails is
    /// tried again at the next look (until then a look's take of such a
    /// fence finds this replica the heir and writes it).
    pub(super) async fn inherit(&self) {
        let standing = self.inner.standing.borrow().clone();
        let Some(live) = standing.live().cloned() else {
            return;
        };
        let mine = standing.held_with();
        let records = lock(self.inner.view.epochs())
            .heirs
            .unlisted_for(&mine, Timestamp::now());
        if records.is_empty() {
            return;
        }
        let names: std::collections::HashMap<String, ClusterName> = self
            .inner
            .working
            .names()
            .into_iter()
            .map(|name| (self.fence_name(&name), name))
            .collect();
        // Every epoch whose fences may have come to this replica, listed at
        // once: one after another they took seconds each at 100,000
        // clusters while two restarted replicas started up.
        let sources: Vec<(String, Vec<String>)> = {
            let epochs = lock(self.inner.view.epochs());
            records
                .iter()
                .map(|(key, _)| (key.clone(), epochs.heirs.sources_of(key)))
                .collect()
        };
        let mut to_list: Vec<&String> = sources.iter().flat_map(|(_, of)| of).collect();
        to_list.sort();
        to_list.dedup();
        let (lists, listed) = self.fences_held_with(&to_list).await;
        let mut inherited = 0_usize;
        let mut failed = std::collections::HashSet::new();
        for (held_with, fences) in lists {
            match fences {
                Some(fences) => inherited += self.adopt(held_with, fences, &mine, &live, &names),
                None => {
                    failed.insert(held_with.clone());
                }
            }
        }
        for (key, of) in &sources {
            if !of.iter().any(|source| failed.contains(source)) {
                lock(self.inner.view.epochs()).heirs.listed(key);
            }
        }
        let from: Vec<&str> = records
            .iter()
            .map(|(_, record)| record.holder.as_str())
            .collect();
        tracing::info!(
            ?from,
            clusters = inherited,
            lists = listed,
            "inherited the clusters of replicas that are gone"
        );
        // The looks took nothing while this listed: the rest is theirs now.
        self.inner.working.wake();
    }

    /// The fences held with each of `epochs` (ended, with records of
    /// heirs): from the mirror once it shows their records, which it
    /// usually does by the time the peer reads found them; else, after a
    /// look's wait, one list each, all at once (`None` for one that
    /// failed). And how many lists that took.
    async fn fences_held_with<'a>(
        &self,
        epochs: &[&'a String],
    ) -> (Vec<(&'a String, Option<Vec<Lease>>)>, usize) {
        let patience = self.inner.options.probe_interval;
        let mirror = self.inner.inheritance.mirror();
        if let Some(shown) = mirror.wait_for(epochs, patience).await {
            let fences = epochs.iter().copied().zip(shown.into_iter().map(Some));
            return (fences.collect(), 0);
        }
        self.inner.inheritance.listing(epochs.len());
        let lists =
            futures::future::join_all(epochs.iter().map(|held_with| async move {
                (*held_with, self.list_held_with(held_with).await)
            }))
            .await;
        (lists, epochs.len())
    }

    /// The fences held with `held_with` (by their label), or `None` when
    /// the list failed (tried again at the next look; until then a look's
    /// take of such a fence finds this replica the heir and writes it).
    async fn list_held_with(&self, held_with: &str) -> Option<Vec<Lease>> {
        let selector = format!("{}={}", wire::HELD_WITH_LABEL, lease::label_for(held_with));
        let params = ListParams::default().labels(&selector);
        let call = self.inner.leases.list(&params);
        // A peer Lease's duration, not a renew interval: the API server
        // filters every fence for each heir at once, and at 100,000
        // clusters, with two replicas starting beside it, two lists ran
        // past 10 s; cut short, they started again a look later.
        let reason = match tokio::time::timeout(self.inner.options.peer_lease_duration, call).await
        {
            Ok(Ok(list)) => {
                if let Some(failures) = self.inner.inheritance.listed() {
                    tracing::info!(failures, "listed the fences inherited again");
                }
                return Some(list.items);
            }
            Ok(Err(err)) => Redacted::kube(&err),
            Err(_) => Redacted::new("no answer"),
        };
        // Tried again every look while a record names this replica: told
        // once, not at each try.
        match self.inner.inheritance.list_failed(&reason) {
            Telling::New => {
                tracing::warn!(error = %reason, "could not list the fences inherited from a replica that is gone; trying again");
            }
            Telling::Reminder(attempts) => {
                tracing::warn!(error = %reason, attempts, "still cannot list the fences inherited from a replica that is gone");
            }
            Telling::Repeat(attempts) => {
                tracing::debug!(error = %reason, attempts, "could not list the fences inherited again");
            }
        }
        None
    }

    /// Works on each of `fences` (held with `held_with`, an ended epoch)
    /// that went to this replica, holding with `mine` while `live` lasts;
    /// `names` finds a fence's cluster. How many it took up.
    fn adopt(
        &self,
        held_with: &str,
        fences: Vec<Lease>,
        mine: &str,
        live: &tokio_util::sync::CancellationToken,
        names: &std::collections::HashMap<String, ClusterName>,
    ) -> usize {
        let now = Timestamp::now();
        let mut inherited = 0;
        for fence in fences {
            let Some(fence_name) = fence.metadata.name.clone() else {
                continue;
            };
            // The label is a hash: the annotation says.
            if lease::held_with_of(&fence) != Some(held_with) || lease::holder_of(&fence).is_none()
            {
                continue;
            }
            let Some(name) = names.get(&fence_name) else {
                continue;
            };
            let chain = lock(self.inner.view.epochs())
                .heirs
                .chain(held_with, name.as_str(), now);
            let Some((heir, until)) = chain.filter(|(heir, _)| heir.held_with == mine) else {
                continue;
            };
            let held = fence::Fence::handed(fence_name.clone(), live, fence);
            // Held or gone already, or handed back: it was never this
            // replica's to release.
            if let Starting::Started((work, cluster, components)) =
                self.inner.working.start(name, None, held, Some(until))
            {
                tracing::info!(cluster = %name, peer = %heir.id, lease = %fence_name, "working on the cluster (inherited)");
                engage_or_hand_back(&components, &work, name, &cluster);
                inherited += 1;
            }
        }
        if inherited > 0 {
            self.inner.working.show();
        }
        inherited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heir(id: &str) -> HeirPeer {
        HeirPeer {
            id: id.to_string(),
            weight: 1,
            held_with: format!("mcr-peer-{id}/e-{id}"),
        }
    }

    fn peer_lease(records: &[Record]) -> Lease {
        let value = serde_json::to_string(records).expect("json");
        Lease {
            metadata: kube::api::ObjectMeta {
                name: Some("mcr-peer-gone".to_string()),
                annotations: Some(BTreeMap::from([(
                    wire::HEIRS_ANNOTATION.to_string(),
                    value,
                )])),
                ..Default::default()
            },
            spec: None,
        }
    }

    #[test]
    fn each_fence_of_an_ended_epoch_goes_to_its_owner_among_the_heirs() {
        let record = Record::new("gone", "e1", vec![heir("a"), heir("b"), heir("c")]);
        let peers: Vec<Peer> = ["a", "b", "c"]
            .map(|id| Peer {
                id: id.to_string(),
                weight: 1,
            })
            .to_vec();
        let mut seen = std::collections::BTreeSet::new();
        for cluster in (0..30).map(|i| format!("shard-{i}")) {
            let heir = record.heir_for(&cluster).expect("heir");
            let owner = hrw::owner(&cluster, &peers).expect("owner");
            assert_eq!(heir.id, owner.id, "{cluster}");
            assert_eq!(heir.held_with, format!("mcr-peer-{0}/e-{0}", owner.id));
            seen.insert(heir.id);
        }
        assert_eq!(seen.len(), 3, "one heir took every fence");
        let nobody = Record::new("gone", "e1", Vec::new());
        assert_eq!(nobody.heir_for("shard-0"), None);
    }

    #[test]
    fn a_record_is_followed_for_its_time_and_then_dropped() {
        let now = Timestamp::now();
        let mut old = Record::new("gone", "e0", vec![heir("a")]);
        old.at = (now - FOLLOWED_FOR - SignedDuration::from_secs(1)).to_string();
        let recent = Record::new("gone", "e1", vec![heir("a")]);
        let lease = peer_lease(&[old.clone(), recent.clone()]);

        let mut known = Known::default();
        assert!(known.learn(&lease, now), "new records were not news");
        assert!(
            !known.learn(&lease, now),
            "the same records were news again"
        );
        assert_eq!(known.hold("mcr-peer-gone", "e0", "shard-0", now), None);
        assert_eq!(
            known.hold("mcr-peer-gone", "e1", "shard-0", now),
            Some(Hold::Inherited(Heir {
                id: "a".to_string(),
                held_with: "mcr-peer-a/e-a".to_string(),
            }))
        );
        // The next record written keeps the recent one, not the old one.
        let next = Record::new("gone", "e2", vec![heir("b")]);
        let value = annotation_with(&lease, next.clone(), now).expect("annotation");
        let kept: Vec<Record> = serde_json::from_str(&value).expect("json");
        assert_eq!(kept, vec![recent, next]);
    }

    #[test]
    fn an_heir_lists_each_record_naming_it_once_and_only_within_the_window() {
        let now = Timestamp::now();
        let mut late = Record::new("gone", "e0", vec![heir("a")]);
        late.at = (now - INHERIT_WINDOW - SignedDuration::from_secs(1)).to_string();
        let naming_a = Record::new("gone", "e1", vec![heir("a"), heir("b")]);
        let naming_b = Record::new("gone", "e2", vec![heir("b")]);
        let mut known = Known::default();
        known.learn(&peer_lease(&[late, naming_a, naming_b]), now);

        assert_eq!(known.unlisted_for("mcr-peer-b/e-b", now).len(), 2);
        let for_a = known.unlisted_for("mcr-peer-a/e-a", now);
        let keys: Vec<&str> = for_a.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(keys, ["mcr-peer-gone/e1"]);
        known.listed("mcr-peer-gone/e1");
        assert!(known.unlisted_for("mcr-peer-a/e-a", now).is_empty());
        // An heir in an epoch the record does not name inherits nothing.
        assert!(known.unlisted_for("mcr-peer-a/e-other", now).is_empty());
    }

    #[test]
    fn a_fence_goes_from_heir_to_heir_when_an_heir_ends_before_writing_it() {
        let now = Timestamp::now();
        // "gone" ended naming q alone; then q ended naming a and b.
        let first = Record::new("gone", "e1", vec![heir("q")]);
        let mut second = Record::new("q", "e-q", vec![heir("a"), heir("b")]);
        second.at = (now + SignedDuration::from_secs(60)).to_string();
        let mut known = Known::default();
        known.learn(&peer_lease(std::slice::from_ref(&first)), now);
        let mut q_lease = peer_lease(std::slice::from_ref(&second));
        q_lease.metadata.name = Some("mcr-peer-q".to_string());
        known.learn(&q_lease, now);

        for cluster in (0..20).map(|i| format!("shard-{i}")) {
            let (heir, until) = known
                .chain("mcr-peer-gone/e1", &cluster, now)
                .expect("an heir");
            assert_eq!(Some(heir), second.heir_for(&cluster), "{cluster}");
            // Written within the first record's window: the fence still
            // names the first epoch.
            assert_eq!(Some(until), first.inherit_until());
        }
        // q's heirs list q's fences and those q inherited.
        let mut sources = known.sources_of("mcr-peer-q/e-q");
        sources.sort();
        assert_eq!(sources, ["mcr-peer-gone/e1", "mcr-peer-q/e-q"]);
        assert_eq!(known.sources_of("mcr-peer-gone/e1"), ["mcr-peer-gone/e1"]);
        assert_eq!(known.chain("mcr-peer-other/e9", "shard-0", now), None);
    }

    #[test]
    fn unreadable_records_name_no_heirs() {
        let mut lease = peer_lease(&[]);
        lease.metadata.annotations = Some(BTreeMap::from([(
            wire::HEIRS_ANNOTATION.to_string(),
            "{not json".to_string(),
        )]));
        assert!(records(&lease).is_empty());
    }
}
