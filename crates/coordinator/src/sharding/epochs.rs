//! What a replica knows of its peers' epochs from its own reads of the peer
//! Leases, so that taking a fence held with another peer's Lease need not
//! read that Lease again for every fence.
//!
//! A hand-over of thousands of clusters is thousands of takes, and each
//! take of a fence held with a peer Lease asked the API server whether that
//! peer Lease still holds: one read more per fence, always of the same few
//! Leases. What the registry read a moment ago answers most of them:
//!
//! - **Ended**: an epoch whose peer Lease was seen without a holder (its
//!   replica left, or another replica ended the lapsed epoch: see
//!   `lease::end_epoch`), deleted, or in a newer epoch never holds again.
//!   Its replica resumes an epoch only by writing over its own last write
//!   of the Lease, which any of these makes fail, and it writes a new
//!   epoch only after the old one's work stopped. Known once, true for
//!   good. A Lease seen lapsed has not ended: its replica may renew it in
//!   the same epoch, unless someone ends it first.
//! - **Live**: a peer Lease read live in that epoch, by that holder, until
//!   the moment it would lapse by that read. Answering "held" from this is
//!   the cautious answer: at worst a take waits for the next look.
//!
//! Anything else (a peer Lease never seen, or lapsed) is read from the API
//! server, as before.

use std::collections::{HashMap, HashSet, VecDeque};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::hrw::{self, Peer};
use crate::lease::{self, EndedHold, Heir, Hold, Knowledge, epoch_of};
use crate::lock;
use crate::wire;

/// Ended epochs remembered; the oldest are forgotten first (a forgotten
/// one is read from the API server again, as any unknown one).
const ENDED_KEPT: usize = 4096;

/// Peers that left (their epoch ended, their Lease deleted or cleared) are
/// remembered this long for guessing who holds the fences being taken over:
/// the takes follow a departure within seconds.
const DEPARTED_KEPT_FOR: SignedDuration = SignedDuration::from_secs(120);

/// At most this many departed peers are remembered, the newest.
const DEPARTED_KEPT: usize = 16;

/// The peer Leases as last read, and the epochs known to have ended.
#[derive(Debug, Default)]
pub(crate) struct Epochs {
    seen: HashMap<String, Seen>,
    ended: HashSet<(String, String)>,
    ended_order: VecDeque<(String, String)>,
    /// Peers whose epoch ended lately, oldest first.
    departed: VecDeque<Departed>,
    /// The records of heirs on the peer Leases read.
    pub(crate) heirs: super::heirs::Known,
}

/// A peer whose epoch ended: the fences it held with it name it and it.
#[derive(Debug)]
struct Departed {
    peer: Peer,
    held_with: String,
    at: Timestamp,
}

#[derive(Debug)]
struct Seen {
    holder: Option<String>,
    epoch: Option<String>,
    lapses_at: Option<Timestamp>,
    weight: u32,
    ready: bool,
    leaving: bool,
}

impl Epochs {
    /// Takes in a fresh list of the peer Leases, read at `now`; whether it
    /// named heirs not known before.
    pub(crate) fn record(&mut self, leases: &[Lease], now: Timestamp) -> bool {
        let mut seen = HashMap::with_capacity(leases.len());
        let mut new_heirs = false;
        for peer in leases {
            let Some(name) = peer.metadata.name.clone() else {
                continue;
            };
            // Before the end is taken in: whoever knows an epoch ended
            // knows its heirs (named in the same write).
            new_heirs |= self.heirs.learn(peer, now);
            let entry = Seen {
                holder: peer
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.holder_identity.clone()),
                epoch: epoch_of(peer).map(str::to_string),
                lapses_at: peer
                    .spec
                    .as_ref()
                    .and_then(|spec| lease::lapses_in(spec, now))
                    .and_then(|left| SignedDuration::try_from(left).ok())
                    .and_then(|left| now.checked_add(left).ok()),
                weight: wire::weight(peer),
                ready: wire::is_ready(peer),
                leaving: wire::is_leaving(peer),
            };
            if let Some(epoch) = &entry.epoch
                && entry.holder.as_deref().is_none_or(str::is_empty)
            {
                self.end(&name, epoch);
                if let Some(peer) = self.seen_in(&name, epoch) {
                    self.depart(&name, epoch, peer, now);
                }
            }
            if let Some(before) = self.seen.get(&name).and_then(|s| s.epoch.clone())
                && entry.epoch.as_ref() != Some(&before)
            {
                // Written in a new epoch since: its replica left (restarted,
                // or came back after an outage), even if no read saw its
                // Lease gone in between.
                match self.seen_in(&name, &before) {
                    Some(peer) => self.depart(&name, &before, peer, now),
                    None => self.end(&name, &before),
                }
            }
            seen.insert(name, entry);
        }
        // Deleted since the last read.
        let gone: Vec<(String, String)> = self
            .seen
            .iter()
            .filter(|(name, _)| !seen.contains_key(*name))
            .filter_map(|(name, before)| Some((name.clone(), before.epoch.clone()?)))
            .collect();
        for (name, epoch) in gone {
            self.end(&name, &epoch);
            if let Some(peer) = self.seen_in(&name, &epoch) {
                self.depart(&name, &epoch, peer, now);
            }
        }
        self.seen = seen;
        new_heirs
    }

    /// The peer the last read saw holding `peer_lease` in `epoch`.
    fn seen_in(&self, peer_lease: &str, epoch: &str) -> Option<Peer> {
        let seen = self.seen.get(peer_lease)?;
        let holder = seen.holder.as_deref().filter(|h| !h.is_empty())?;
        (seen.epoch.as_deref() == Some(epoch)).then(|| Peer {
            id: holder.to_string(),
            weight: seen.weight,
        })
    }

    /// Remembers that `peer` left: `peer_lease`'s `epoch`, which it held,
    /// ended at `now`.
    pub(crate) fn depart(&mut self, peer_lease: &str, epoch: &str, peer: Peer, now: Timestamp) {
        self.end(peer_lease, epoch);
        let held_with = lease::held_with(peer_lease, epoch);
        if self.departed.iter().any(|d| d.held_with == held_with) {
            return;
        }
        self.departed.push_back(Departed {
            peer,
            held_with,
            at: now,
        });
        if self.departed.len() > DEPARTED_KEPT {
            self.departed.pop_front();
        }
    }

    /// Who most likely holds `cluster`'s fence in an epoch that ended: the
    /// peer that owned it before it left, as rendezvous hashing over the
    /// `peers` and those that left lately names it. Only a guess; a take
    /// built on it checks it.
    pub(crate) fn ended_hold(
        &self,
        cluster: &str,
        peers: &[Peer],
        now: Timestamp,
    ) -> Option<EndedHold> {
        // A fence of an epoch that named heirs is an heir's, not free.
        let recent: Vec<&Departed> = self
            .departed
            .iter()
            .rev()
            .filter(|d| now.duration_since(d.at) < DEPARTED_KEPT_FOR)
            .filter(|d| !self.heirs.has(&d.held_with))
            .collect();
        if recent.is_empty() {
            return None;
        }
        let mut before: Vec<Peer> = peers.to_vec();
        for departed in &recent {
            if !before.iter().any(|p| p.id == departed.peer.id) {
                before.push(departed.peer.clone());
            }
        }
        before.sort_by(|a, b| a.id.cmp(&b.id));
        let owner = hrw::owner(cluster, &before)?;
        recent
            .iter()
            .find(|d| d.peer.id == owner.id)
            .map(|d| EndedHold {
                holder: d.peer.id.clone(),
                held_with: d.held_with.clone(),
            })
    }

    /// Remembers what a take found by reading a fence: `ended`, a hold in
    /// an epoch that has ended, whose peer is taken to weigh `weight`. The
    /// next fences of that epoch are guessed right (a restarted replica,
    /// whose earlier epoch no read of the peer Leases showed, takes the
    /// rest of its old fences in one request each).
    pub(crate) fn learn(&mut self, ended: &EndedHold, weight: u32, now: Timestamp) {
        let Some((peer_lease, epoch)) = ended.held_with.rsplit_once('/') else {
            return;
        };
        let peer = Peer {
            id: ended.holder.clone(),
            weight,
        };
        self.depart(peer_lease, epoch, peer, now);
    }

    /// Whether the peer `id` left lately (and may have come back since).
    pub(crate) fn departed_lately(&self, id: &str, now: Timestamp) -> bool {
        self.departed
            .iter()
            .any(|d| d.peer.id == id && now.duration_since(d.at) < DEPARTED_KEPT_FOR)
    }

    /// Remembers that `peer_lease`'s `epoch` ended (seen, or ended by this
    /// replica).
    pub(crate) fn end(&mut self, peer_lease: &str, epoch: &str) {
        let key = (peer_lease.to_string(), epoch.to_string());
        if self.ended.insert(key.clone()) {
            self.ended_order.push_back(key);
            if self.ended_order.len() > ENDED_KEPT
                && let Some(oldest) = self.ended_order.pop_front()
            {
                self.ended.remove(&oldest);
            }
        }
    }

    /// Whether `holder` holds `cluster`'s fence held with `peer_lease` in
    /// `epoch`, if known without asking the API server: ended (or its heir,
    /// when the end named heirs) for an ended epoch, live while the last
    /// read showed it live, `None` otherwise.
    pub(crate) fn holds(
        &self,
        peer_lease: &str,
        epoch: &str,
        holder: &str,
        cluster: &str,
        now: Timestamp,
    ) -> Option<Hold> {
        if let Some(hold) = self.heirs.hold(peer_lease, epoch, cluster, now) {
            return Some(hold);
        }
        if self
            .ended
            .contains(&(peer_lease.to_string(), epoch.to_string()))
        {
            return Some(Hold::Ended);
        }
        let seen = self.seen.get(peer_lease)?;
        let live = seen.holder.as_deref() == Some(holder)
            && seen.epoch.as_deref() == Some(epoch)
            && seen.lapses_at.is_some_and(|at| now < at);
        live.then_some(Hold::Live)
    }

    /// Takes in what ending `peer_lease`'s epoch found: the heirs the peer
    /// Lease as it is now names.
    pub(crate) fn ended_with(&mut self, peer: Option<&Lease>, now: Timestamp) -> bool {
        peer.is_some_and(|peer| self.heirs.learn(peer, now))
    }

    /// The epoch the last read saw `holder` live and ready in (and not
    /// leaving), with its peer Lease `peer_lease`: what a fence handed to
    /// it names.
    pub(crate) fn live_epoch(
        &self,
        peer_lease: &str,
        holder: &str,
        now: Timestamp,
    ) -> Option<&str> {
        let seen = self.seen.get(peer_lease)?;
        let live = seen.ready
            && !seen.leaving
            && seen.holder.as_deref() == Some(holder)
            && seen.lapses_at.is_some_and(|at| now < at);
        live.then_some(seen.epoch.as_deref()).flatten()
    }

    /// Whether `peer` differs from what the last read saw in what matters
    /// for ownership (a new Lease, another holder or epoch; not a renewal).
    pub(crate) fn is_news(&self, peer: &Lease) -> bool {
        let Some(name) = peer.metadata.name.as_deref() else {
            return false;
        };
        let Some(seen) = self.seen.get(name) else {
            return true;
        };
        seen.holder.as_deref()
            != peer
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
            || seen.epoch.as_deref() != epoch_of(peer)
            || seen.ready != wire::is_ready(peer)
            || seen.leaving != wire::is_leaving(peer)
    }

    /// Whether the last read saw a Lease named `name`.
    pub(crate) fn has_seen(&self, name: &str) -> bool {
        self.seen.contains_key(name)
    }
}

/// What a take of `cluster`'s fence knows: the peer reads, and the heirs
/// a peer Lease it reads names.
pub(crate) struct TakeKnowledge<'a> {
    pub(crate) epochs: &'a std::sync::Mutex<Epochs>,
    pub(crate) cluster: &'a str,
}

impl Knowledge for TakeKnowledge<'_> {
    fn holds(&self, peer_lease: &str, epoch: &str, holder: &str, now: Timestamp) -> Option<Hold> {
        lock(self.epochs).holds(peer_lease, epoch, holder, self.cluster, now)
    }

    fn heir_in(&self, peer: &Lease, epoch: &str) -> Option<Heir> {
        let now = Timestamp::now();
        super::heirs::records(peer)
            .into_iter()
            .find(|record| record.epoch == epoch && record.followed_at(now))?
            .heir_for(self.cluster)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    use super::*;

    fn peer(name: &str, epoch: &str, renewed_secs_ago: i64, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                annotations: Some(BTreeMap::from([(
                    wire::EPOCH_ANNOTATION.to_string(),
                    epoch.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.to_string()),
                lease_duration_seconds: Some(30),
                renew_time: Some(MicroTime(
                    now.checked_sub(SignedDuration::from_secs(renewed_secs_ago))
                        .expect("time"),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_live_epoch_holds_until_its_lapse_and_an_ended_one_never_again() {
        let now = Timestamp::from_second(1_000_000).expect("time");
        let later = |secs| now.checked_add(SignedDuration::from_secs(secs)).expect("t");
        let mut epochs = Epochs::default();
        assert_eq!(epochs.holds("p", "e1", "p", "c", now), None, "never read");

        epochs.record(&[peer("p", "e1", 10, now)], now);
        assert_eq!(epochs.holds("p", "e1", "p", "c", now), Some(Hold::Live));
        assert_eq!(
            epochs.holds("p", "e1", "q", "c", now),
            None,
            "another holder"
        );
        assert_eq!(
            epochs.holds("p", "e0", "p", "c", now),
            None,
            "an epoch not seen"
        );
        assert_eq!(
            epochs.holds("p", "e1", "p", "c", later(21)),
            None,
            "past the lapse the last read says nothing"
        );

        // A new epoch ends the one before, for good.
        epochs.record(&[peer("p", "e2", 0, now)], now);
        assert_eq!(epochs.holds("p", "e1", "p", "c", now), Some(Hold::Ended));
        assert_eq!(epochs.holds("p", "e2", "p", "c", now), Some(Hold::Live));

        // Seen lapsed: not known either way (its replica may renew it in
        // the same epoch unless someone ends it first).
        epochs.record(&[peer("p", "e2", 31, now)], now);
        assert_eq!(epochs.holds("p", "e2", "p", "c", now), None);

        // Ended by another replica (the holder cleared): ended.
        let mut cleared = peer("p", "e2", 31, now);
        cleared.spec.as_mut().expect("spec").holder_identity = None;
        epochs.record(&[cleared], now);
        assert_eq!(epochs.holds("p", "e2", "p", "c", now), Some(Hold::Ended));

        // Deleted: ended (its replica writes a new epoch when it finds its
        // Lease gone).
        epochs.record(&[peer("q", "f1", 0, now)], now);
        epochs.record(&[], now);
        assert_eq!(epochs.holds("q", "f1", "q", "c", now), Some(Hold::Ended));
        assert!(!epochs.has_seen("q"));
    }

    #[test]
    fn the_holder_of_a_fence_in_an_ended_epoch_is_guessed_from_the_peers_that_left() {
        let now = Timestamp::from_second(1_000_000).expect("time");
        let later = |secs| now.checked_add(SignedDuration::from_secs(secs)).expect("t");
        let member = |id: &str| Peer {
            id: id.to_string(),
            weight: 1,
        };
        let mut epochs = Epochs::default();
        epochs.record(
            &[
                peer("p", "e1", 0, now),
                peer("q", "f1", 0, now),
                peer("r", "g1", 0, now),
            ],
            now,
        );
        let everyone = [member("p"), member("q"), member("r")];
        let left = [member("p"), member("q")];
        let clusters: Vec<String> = (0..60).map(|i| format!("c{i}")).collect();
        for cluster in &clusters {
            assert_eq!(
                epochs.ended_hold(cluster, &left, now),
                None,
                "nobody left yet"
            );
        }
        // r's Lease is deleted (it left): its clusters are guessed held by
        // it in g1, the others by nobody that left.
        epochs.record(&[peer("p", "e1", 0, now), peer("q", "f1", 0, now)], now);
        let mut guessed = 0;
        for cluster in &clusters {
            let owner = hrw::owner(cluster, &everyone).expect("owner").id.clone();
            let guess = epochs.ended_hold(cluster, &left, now);
            if owner == "r" {
                guessed += 1;
                assert_eq!(
                    guess,
                    Some(EndedHold {
                        holder: "r".to_string(),
                        held_with: "r/g1".to_string(),
                    })
                );
            } else {
                assert_eq!(guess, None, "{cluster} was {owner}'s");
            }
        }
        assert!(guessed > 0, "r owned none of {clusters:?}");
        // Back (restarted under its ID, in a new epoch): the fences it
        // left are still guessed held in the old one; none after a while.
        let some = clusters
            .iter()
            .find(|c| hrw::owner(c, &everyone).is_some_and(|p| p.id == "r"))
            .expect("one of r's");
        assert_eq!(
            epochs.ended_hold(some, &everyone, now).map(|e| e.held_with),
            Some("r/g1".to_string())
        );
        assert!(epochs.departed_lately("r", later(119)));
        assert!(!epochs.departed_lately("p", now));
        assert_eq!(epochs.ended_hold(some, &left, later(121)), None);
        assert!(!epochs.departed_lately("r", later(121)));
        assert!(epochs.ended_hold(some, &left, later(119)).is_some());
    }

    #[test]
    fn a_peer_read_in_a_new_epoch_left_even_if_no_read_saw_it_gone() {
        // A replica that restarts within a moment is deleted and written
        // again between two reads: only its new epoch tells it left.
        let now = Timestamp::from_second(1_000_000).expect("time");
        let member = |id: &str| Peer {
            id: id.to_string(),
            weight: 1,
        };
        let mut epochs = Epochs::default();
        epochs.record(&[peer("p", "e1", 0, now), peer("r", "g1", 0, now)], now);
        assert!(!epochs.departed_lately("r", now));
        epochs.record(&[peer("p", "e1", 0, now), peer("r", "g2", 0, now)], now);
        assert!(
            epochs.departed_lately("r", now),
            "r came back in a new epoch"
        );
        assert!(!epochs.departed_lately("p", now));
        let everyone = [member("p"), member("r")];
        let of_r = (0..60)
            .map(|i| format!("c{i}"))
            .find(|c| hrw::owner(c, &everyone).is_some_and(|p| p.id == "r"))
            .expect("one of r's");
        assert_eq!(
            epochs
                .ended_hold(&of_r, &everyone, now)
                .map(|e| e.held_with),
            Some("r/g1".to_string()),
            "its fences are guessed held in the epoch it left"
        );
    }

    #[test]
    fn an_ended_hold_found_by_a_take_is_guessed_for_the_next_fences() {
        let now = Timestamp::from_second(1_000_000).expect("time");
        let me = Peer {
            id: "me".to_string(),
            weight: 1,
        };
        let other = Peer {
            id: "p".to_string(),
            weight: 1,
        };
        let mut epochs = Epochs::default();
        // Restarted: the peer reads show only this replica's new epoch.
        epochs.record(&[peer("me", "m2", 0, now), peer("p", "e1", 0, now)], now);
        let peers = [me.clone(), other];
        let mine: Vec<String> = (0..60)
            .map(|i| format!("c{i}"))
            .filter(|c| hrw::owner(c, &peers).is_some_and(|p| p.id == "me"))
            .collect();
        assert!(mine.len() > 1, "me owns too few");
        assert_eq!(epochs.ended_hold(&mine[1], &peers, now), None);
        // The first take read its fence and found it held in m1.
        let found = EndedHold {
            holder: "me".to_string(),
            held_with: "me/m1".to_string(),
        };
        epochs.learn(&found, 1, now);
        assert_eq!(epochs.holds("me", "m1", "me", "c", now), Some(Hold::Ended));
        assert_eq!(epochs.ended_hold(&mine[1], &peers, now), Some(found));
    }

    #[test]
    fn renewals_are_not_news_but_holders_and_epochs_are() {
        let now = Timestamp::from_second(1_000_000).expect("time");
        let mut epochs = Epochs::default();
        epochs.record(&[peer("p", "e1", 5, now)], now);
        assert!(!epochs.is_news(&peer("p", "e1", 0, now)));
        assert!(epochs.is_news(&peer("p", "e2", 0, now)));
        assert!(epochs.is_news(&peer("q", "e1", 0, now)));
        let mut released = peer("p", "e1", 0, now);
        released.spec.as_mut().expect("spec").holder_identity = None;
        assert!(epochs.is_news(&released));
    }

    #[test]
    fn the_oldest_ended_epochs_are_forgotten_first() {
        let now = Timestamp::from_second(1_000_000).expect("time");
        let mut epochs = Epochs::default();
        for i in 0..=ENDED_KEPT {
            epochs.end("p", &i.to_string());
        }
        assert_eq!(epochs.holds("p", "0", "p", "c", now), None);
        assert_eq!(epochs.holds("p", "1", "p", "c", now), Some(Hold::Ended));
        assert_eq!(epochs.ended.len(), ENDED_KEPT);
    }
}
