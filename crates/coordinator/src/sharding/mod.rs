//! Sharding a fleet over several replicas of one controller.
//!
//! Every replica runs the provider and sees the whole fleet; the
//! [`ShardedCoordinator`] decides which clusters this replica works on:
//!
//! - **Peers.** Each replica keeps a Lease `<peer prefix>-<id>` in the fence
//!   namespace and reads the others' every renew interval, again the moment
//!   one of them would lapse, and whenever its watch of the peer Leases
//!   shows one come, go or change epoch; a peer whose Lease was deleted or
//!   has lapsed is gone (after an outage that kept this replica from
//!   renewing too, lapsed peers get one Lease duration to renew first).
//!   With fences held with the peer Lease ([`FenceHold::WithPeer`]), a
//!   lapsed peer's epoch is ended by a write before its fences are taken,
//!   so a replica that sat through an outage and renews in time resumes
//!   its fences as they are.
//! - **Ownership.** Rendezvous hashing (`owner`) over the live peers names
//!   one owner per cluster. Every replica computes the same answer, and a
//!   peer joining or leaving moves only about 1/N of the clusters. A peer
//!   whose Lease says it is not ready yet (its provider has not engaged
//!   the inventory it first found) is counted, but a cluster it owns stays
//!   with the replica working on it until it is; it takes the clusters
//!   nobody works on as it engages them.
//! - **Fences.** Before working on a cluster the owner takes its Lease
//!   `<fence prefix>-<cluster>`, held by one replica at a time, and renews
//!   it. Work stops the moment a renewal fails, and is handed over only by
//!   releasing the fence, so two replicas never work on one cluster at once
//!   even while they disagree about who the peers are. With fences held
//!   with the peer Lease, a replica handing a cluster to a ready peer
//!   writes the fence as that peer's, in the peer's current epoch: one
//!   write, and the peer, which watches for fences handed to it, starts
//!   without a request.
//! - **The local cluster** is fenced like any other, except for
//!   components that work on it on every replica
//!   ([`Aware::local_on_every_replica`]: a controller whose member
//!   reconciles read the hub), which every replica engages with it
//!   unfenced, for its lifetime.
//! - **Leaving.** With fences held with the peer Lease, a replica that
//!   stops says so in its peer Lease (the others stop counting it as an
//!   owner and wait for its clusters rather than ask for them) and hands
//!   each cluster straight to its next owner, while its controllers still
//!   work on the ones not handed yet ([`Coordinator::leave`], for up to
//!   [`ShardingOptions::leave_handover`]).
//! - **Heirs.** With fences held with the peer Lease, the write that ends
//!   an epoch (a killed replica's, once its Lease lapsed; a stopping
//!   replica's, for what it had not handed over) names the live, ready
//!   peers as its heirs. Each fence of that epoch belongs to its owner
//!   among the heirs, which finds them in its watch of the namespace's
//!   Leases (see `mirror`) and works on them at once, writing each as its
//!   own later (see `heirs`).
//!
//! Names, labels and defaults are Go multicluster-runtime's, so the Leases
//! look the same. Beyond Go: Lease names are unique per cluster and never
//! too long, what a stopping replica still holds moves at once (it deletes
//! its peer Lease; with fences held with that Lease it ends its epoch
//! naming heirs: one request however many clusters), a renewal that hangs
//! counts as failed before the Lease can lapse, ownership is re-examined as
//! soon as peers change rather than at the next probe, and a look takes and
//! hands back several fences at once. Go's single shared fence for the
//! whole fleet is not offered: it lets only one replica work at all. The scores differ from
//! Go's (see `score`): Go's give one of five peers named `x-0` to `x-4`
//! half of the fleet, so Go and Rust replicas must not share one fleet.
//!
//! The replicas need RBAC to get, list, watch, create, update, patch and
//! delete Leases in the fence namespace (without `watch` they still work:
//! peers are then noticed at the next read, up to a renew interval later,
//! and a fence handed over at the new owner's next take, a read;
//! without `patch`, taking a fence of a replica that left is a read and an
//! update instead of one patch).

mod epochs;
mod handover;
mod heirs;
mod hrw;
mod inheritance;
mod lifecycle;
mod look;
mod mirror;
mod options;
mod peers;
mod run;
mod working_set;

use look::{Look, Step, owner_but};

use working_set::{HandedBack, Held, Share, hold};

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lock;
use crate::{dns1123, fence, lease, lease_name};
use multicluster_runtime::Aware;
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::Error;
use multicluster_runtime::coordinator::{Coordinator, add_components, engage_each};
use multicluster_runtime::engagements::{Arrival, when_ended};

pub use hrw::Peer;
pub(crate) use hrw::owner as owner_of;
use lifecycle::Phase;

/// Which of `peers` owns `cluster` (rendezvous hashing by weight): for
/// tests and benches that check a fleet's split (feature `testing`).
#[cfg(feature = "testing")]
pub fn owner<'a>(cluster: &str, peers: &'a [Peer]) -> Option<&'a Peer> {
    hrw::owner(cluster, peers)
}
/// Waits until `replicas` work on exactly the shares of `clusters` that
/// rendezvous hashing over their peer IDs and weights gives them (the
/// local cluster aside), for at most `within`; each one's share, in the
/// order of `replicas`. A split on the way (one replica still holding what
/// it is about to hand over) is not taken for the final one. For tests and
/// benches (feature `testing`).
#[cfg(feature = "testing")]
pub async fn until_split(
    replicas: &[&ShardedCoordinator],
    clusters: &[&str],
    within: std::time::Duration,
) -> Result<Vec<Vec<ClusterName>>, String> {
    let peers: Vec<Peer> = replicas
        .iter()
        .map(|replica| replica.inner.me.clone())
        .collect();
    let shares: Vec<Vec<ClusterName>> = peers
        .iter()
        .map(|peer| {
            let mut share: Vec<ClusterName> = clusters
                .iter()
                .filter(|cluster| hrw::owner(cluster, &peers).is_some_and(|owner| owner == peer))
                .map(|cluster| ClusterName::from(*cluster))
                .collect();
            share.sort();
            share
        })
        .collect();
    let mut sets: Vec<_> = replicas
        .iter()
        .map(|replica| replica.working_set())
        .collect();
    let split = async {
        loop {
            let now: Vec<Vec<ClusterName>> = sets
                .iter_mut()
                .map(|set| {
                    set.borrow_and_update()
                        .iter()
                        .filter(|name| !name.is_local())
                        .cloned()
                        .collect()
                })
                .collect();
            if now == shares {
                return;
            }
            let changes = sets.iter_mut().map(|set| Box::pin(set.changed()));
            let _ = futures::future::select_all(changes).await;
        }
    };
    tokio::time::timeout(within, split)
        .await
        .map_err(|_| format!("the fleet not split as {shares:?} within {within:?}"))?;
    Ok(shares)
}

/// The name of the fence Lease that `prefix` gives `cluster`
/// ([`ShardingOptions`]' fence prefix): for tests and benches that read who
/// holds a cluster (feature `testing`).
#[cfg(feature = "testing")]
pub fn fence_lease_name(prefix: &str, cluster: &str) -> String {
    crate::lease_name(prefix, cluster)
}
pub use options::{FenceHold, ShardingOptions};

/// A [`Coordinator`] that shares the fleet among the replicas of a
/// controller: each cluster is worked on by exactly one of them. See the
/// [module documentation](self).
#[derive(Clone)]
pub struct ShardedCoordinator {
    inner: Arc<Replica>,
}

/// One replica's coordinator: each concept's state in a type of its own.
struct Replica {
    leases: Api<Lease>,
    options: ShardingOptions,
    me: Peer,
    /// Where this replica is in its life (joining, ready, leaving, handed
    /// over, stopping, stopped).
    lifecycle: lifecycle::Lifecycle,
    /// What the reads of the peer Leases tell (written by the registry).
    view: peers::PeersView,
    /// This replica's standing with its peer Lease (fences held with it).
    standing: watch::Sender<fence::Standing>,
    /// The clusters of the fleet and which of them this replica works on.
    working: working_set::WorkingSet,
    /// Fences handed straight to this replica, not taken up yet.
    handed: Arc<handover::Handed>,
    /// What this replica leaves to heirs and inherits from others.
    inheritance: inheritance::Inheritance,
}

/// How many fences one look takes or hands back at once. A hand-over of
/// thousands of clusters one Lease request after another waits for each
/// answer in turn; a few at once keep the API server busy without
/// flooding it. Ten replicas on a two-core API server took a killed
/// replica's 9,900 fences at about 950 a second at 16, 650 at 8, and were
/// slower at 32.
const CONCURRENT_STEPS: usize = 16;

/// How many clusters a leaving replica hands over at once. A hand-over is
/// one write and nothing else waits for it; two replicas leaving together
/// at 100,000 clusters handed about 280 a second each at 16 at once.
const LEAVING_STEPS: usize = 64;

/// How long after it is ready a replica whose share has not settled
/// starts following the fences anyway.
const MIRROR_UNSETTLED: std::time::Duration = std::time::Duration::from_secs(120);

impl ShardedCoordinator {
    /// Whether this replica follows the fences with a watch that has
    /// listed them (fences held with the peer Lease; it starts once the
    /// replica's share has settled): for tests (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn follows_fences(&self) -> bool {
        self.inner.inheritance.mirror.synced()
    }

    /// Completes once this replica follows the fences with a watch that
    /// has listed them ([`ShardedCoordinator::follows_fences`]): for tests
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub async fn until_following_fences(&self) {
        self.inner.inheritance.mirror.until_synced().await;
    }

    /// How many lists of inherited fences this replica needed, rather than
    /// finding them in what it follows: for tests (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn inheritance_lists(&self) -> usize {
        self.inner
            .inheritance
            .lists
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A coordinator keeping its Leases through `client` (the cluster the
    /// replicas share, usually the local one). Fails on invalid options.
    pub fn new(client: kube::Client, options: ShardingOptions) -> Result<Self, Error> {
        options.check()?;
        let id = options.peer_id.clone().unwrap_or_else(|| {
            gethostname::gethostname()
                .to_str()
                .map(str::to_string)
                .unwrap_or_default()
        });
        let me = Peer {
            id: dns1123(&id),
            weight: options.peer_weight.max(1),
        };
        let standing =
            fence::Standing::not_yet(lease_name(&options.peer_prefix, &me.id), peers::new_epoch());
        Ok(Self {
            inner: Arc::new(Replica {
                leases: Api::namespaced(client, &options.namespace),
                lifecycle: lifecycle::Lifecycle::new(
                    options.fence_hold == FenceHold::WithPeer && !options.leave_handover.is_zero(),
                ),
                view: peers::PeersView::new(me.clone()),
                standing: watch::Sender::new(standing),
                working: working_set::WorkingSet::default(),
                handed: Arc::default(),
                inheritance: inheritance::Inheritance::default(),
                me,
                options,
            }),
        })
    }

    /// This replica's peer ID.
    pub fn peer_id(&self) -> &str {
        &self.inner.me.id
    }

    /// The live peers as last read, this replica included, sorted by ID.
    pub fn peers(&self) -> Vec<Peer> {
        self.inner.view.peers.borrow().clone()
    }

    /// Follows the clusters this replica works on, sorted (what
    /// [`Coordinator::working_on`] lists), told after every look, hand-over
    /// and inheritance: wait on it (`wait_for`) rather than poll
    /// `working_on`.
    pub fn working_set(&self) -> watch::Receiver<Vec<ClusterName>> {
        self.inner.working.follow()
    }

    /// Follows the live peers as the reads find them, this replica
    /// included, sorted by ID ([`ShardedCoordinator::peers`]).
    pub fn peer_set(&self) -> watch::Receiver<Vec<Peer>> {
        self.inner.view.peers.subscribe()
    }

    /// The fence Lease name for a cluster.
    pub fn fence_name(&self, cluster: &ClusterName) -> String {
        lease_name(&self.inner.options.fence_prefix, cluster.as_str())
    }

    fn timing(&self) -> fence::Timing {
        fence::Timing {
            duration: self.inner.options.fence_lease_duration,
            renew: self.inner.options.fence_renew_interval,
            deadline: None,
        }
    }

    /// Looks at every cluster once: takes the fences of clusters this
    /// replica owns, hands back those it no longer owns. Returns how many
    /// it handed straight to another replica, or `None` when this replica
    /// is leaving and the peers changed during the look: it stopped handing
    /// over, and the next look starts at once.
    async fn balance(&self, stop: &CancellationToken) -> Option<usize> {
        self.release_again().await;
        // A look with thousands of takes lasts long; once the peers change
        // (one left, came back or became ready) its remaining takes are
        // left to the next look, which starts at once. Looks at 100,000
        // clusters lasted tens of seconds, and a peer that left meanwhile
        // had its clusters wait for them.
        let peers_then = self.inner.view.peers.subscribe();
        let joining_then = self.inner.view.joining.subscribe();
        let leaving_then = self.inner.view.leaving.subscribe();
        let outdated = || {
            [
                peers_then.has_changed(),
                joining_then.has_changed(),
                leaving_then.has_changed(),
            ]
            .into_iter()
            .any(|changed| changed.unwrap_or(false))
        };
        let leaving = self.inner.lifecycle.reached(Phase::SaidLeaving);
        // A leaving replica hands its clusters over as the look sees the
        // peers: once another peer is seen leaving too, the clusters still
        // to go would be handed to it, and passed on again.
        let cut_short = || leaving && outdated();
        let look = Look {
            inheriting: self.inheriting(),
            ..self.look()
        };
        let names = lock(&self.inner.working.clusters).names();
        let handed = std::sync::atomic::AtomicUsize::new(0);
        let steps = if leaving {
            LEAVING_STEPS
        } else {
            CONCURRENT_STEPS
        };
        futures::stream::iter(names)
            .for_each_concurrent(steps, |name| {
                let (look, outdated, handed, cut_short) = (&look, &outdated, &handed, &cut_short);
                async move {
                    if cut_short() {
                        return;
                    }
                    if self.balance_one(&name, look, outdated, stop).await {
                        handed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
            .await;
        self.give_back_unclaimed().await;
        self.inner.working.show();
        if look.moves.into_inner() == 0 && self.inner.lifecycle.reached(Phase::Ready) && !leaving {
            self.inner.working.settled.cancel();
        }
        (!cut_short()).then(|| handed.into_inner())
    }

    /// The peers as one look sees them.
    fn look(&self) -> Look {
        let peers = self.peers();
        let joining = self.inner.view.joining.borrow().clone();
        // Only a ready replica stands in, and only for peers that came back.
        let came_back = if self.inner.lifecycle.reached(Phase::Ready) {
            let epochs = lock(&self.inner.view.epochs);
            let now = Timestamp::now();
            joining
                .iter()
                .filter(|id| epochs.departed_lately(id, now))
                .cloned()
                .collect()
        } else {
            std::collections::BTreeSet::new()
        };
        self.inner.working.standing_in.send_if_modified(|before| {
            if *before == came_back {
                return false;
            }
            tracing::info!(came_back = ?came_back, joining = ?joining, "standing in for peers that restarted and are not ready yet");
            before.clone_from(&came_back);
            true
        });
        let ready: Vec<Peer> = peers
            .iter()
            .filter(|peer| !joining.contains(&peer.id))
            .cloned()
            .collect();
        let next = if self.inner.options.fence_hold == FenceHold::WithPeer {
            let epochs = lock(&self.inner.view.epochs);
            let now = Timestamp::now();
            let options = &self.inner.options;
            ready
                .iter()
                .filter(|peer| peer.id != self.inner.me.id)
                .filter_map(|peer| {
                    let peer_lease = lease_name(&options.peer_prefix, &peer.id);
                    let epoch = epochs.live_epoch(&peer_lease, &peer.id, now)?;
                    let held_with = format!("{peer_lease}/{epoch}");
                    let next = lease::Next {
                        holder: peer.id.clone(),
                        held_with,
                        duration: options.fence_lease_duration,
                        cluster: String::new(),
                    };
                    Some((peer.id.clone(), next))
                })
                .collect()
        } else {
            std::collections::HashMap::new()
        };
        let leaving = self.inner.view.leaving.borrow().clone();
        let mut with_leaving = peers.clone();
        with_leaving.extend(leaving.iter().cloned());
        with_leaving.sort_by(|a, b| a.id.cmp(&b.id));
        with_leaving.dedup_by(|a, b| a.id == b.id);
        Look {
            peers,
            joining,
            came_back,
            ready,
            next,
            leaving: leaving.into_iter().map(|peer| peer.id).collect(),
            with_leaving,
            rewrites_left: heirs::REWRITES_PER_LOOK.into(),
            // Only the looks take; `balance` says.
            inheriting: false,
            moves: 0.into(),
        }
    }

    /// Looks at `name`; whether it handed it straight to another replica.
    async fn balance_one(
        &self,
        name: &ClusterName,
        look: &Look,
        outdated: &(dyn Fn() -> bool + Sync),
        stop: &CancellationToken,
    ) -> bool {
        if stop.is_cancelled() {
            // The rest of the look is left to the hand-back, which frees
            // what is held with the peer Lease in one request, not a write
            // per cluster (the clusters' lifetimes end with the stop: each
            // would be "leaving the fleet"). Read here, not from a task
            // woken by the stop: ending 100,000 lifetimes takes seconds,
            // and the look goes on meanwhile.
            return false;
        }
        let step = self.decide(name, look);
        if matches!(step, Step::Take { .. } | Step::Release { .. }) {
            look.moves
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        match step {
            Step::Nothing => false,
            Step::Release {
                held,
                why,
                settle,
                next,
            } => {
                held.work.cancel();
                tracing::info!(cluster = %name, peer = %self.inner.me.id, %why, "stopped working on the cluster");
                // Reconciles already running finish before the next owner
                // may start; the fence is still renewed meanwhile.
                let settled = futures::future::join_all(settle.iter().map(|c| c.settled(name)));
                if tokio::time::timeout(self.inner.options.handover_timeout, settled)
                    .await
                    .is_err()
                {
                    tracing::warn!(cluster = %name, timeout = ?self.inner.options.handover_timeout, "reconciles still running; handing the cluster over anyway");
                }
                self.release(held.fence, next.as_deref()).await;
                next.is_some()
            }
            Step::Rewrite {
                generation,
                inherited,
            } => {
                self.rewrite(name, generation, *inherited).await;
                false
            }
            Step::Take { .. } if outdated() => false,
            Step::Take { generation } => {
                self.take(name, generation, &look.peers).await;
                false
            }
        }
    }

    /// What to do with `name` now, as `look` sees the peers.
    ///
    /// Long on purpose: one rule per case, in the order they apply (gone,
    /// inherited and overdue, leaving, kept for a joiner, rewrite, release,
    /// take); split up, that order would be spread over several functions.
    fn decide(&self, name: &ClusterName, look: &Look) -> Step {
        let mut clusters = lock(&self.inner.working.clusters);
        let Some(entry) = clusters.get_mut(name) else {
            return Step::Nothing;
        };
        if !entry.is_live() {
            let held = clusters.remove(name).and_then(|entry| entry.data.held);
            return held.map_or(Step::Nothing, |held| Step::Release {
                held,
                why: "the cluster left the fleet".to_string(),
                settle: Vec::new(),
                next: None,
            });
        }
        let generation = entry.generation;
        let entry = &mut entry.data;
        let now = Instant::now();
        if let Some(mut held) = entry.held.take_if(|held| held.is_lost()) {
            entry.retry_at = Some(now + self.inner.options.fence_retry_delay);
            entry.last_written = held.fence.take_written();
            return Step::Release {
                held,
                why: "its fence was lost (not renewed, or this replica's epoch ended)".to_string(),
                settle: Vec::new(),
                next: None,
            };
        }
        if entry
            .held
            .as_ref()
            .and_then(|held| held.inherited_until)
            .is_some_and(|until| Timestamp::now() >= until)
            && let Some(held) = entry.held.take()
        {
            held.work.cancel();
            entry.retry_at = Some(now + self.inner.options.fence_retry_delay);
            tracing::warn!(cluster = %name, "an inherited fence was not written as this replica's own in time; stopped working on the cluster");
            return Step::Nothing;
        }
        let me = &self.inner.me.id;
        if self.inner.lifecycle.reached(Phase::SaidLeaving) {
            // Leaving: every cluster goes to its next owner, one by one,
            // while the controllers work on those not handed yet. One with
            // nobody ready to take it is freed with the peer Lease.
            return match entry.held.take() {
                Some(held) => match look.hand_over_to(name, me) {
                    Some(next) => Step::Release {
                        held,
                        why: format!("this replica is leaving; handed to {}", next.holder),
                        settle: entry.components.clone(),
                        next: Some(Box::new(next)),
                    },
                    None => {
                        entry.held = Some(held);
                        Step::Nothing
                    }
                },
                None => Step::Nothing,
            };
        }
        let owner = owner_of(name.as_str(), &look.peers);
        // Kept for an owner that has not engaged its inventory yet: handed
        // over now, it would sit unworked until its provider got to it.
        let keep_for_joiner = owner.is_some_and(|peer| look.joining.contains(&peer.id));
        let owns = owner.is_some_and(|peer| peer.id == *me)
            || keep_for_joiner && look.stands_in_for(name.as_str(), owner, me);
        // While peers leave or join, their hand-overs and takes come first
        // (rewrites would slow them down), unless the window is half gone.
        let settled = look.leaving.is_empty() && look.joining.is_empty();
        let inherited = entry
            .held
            .as_ref()
            .filter(|held| !held.is_lost())
            .filter(|held| {
                held.inherited_until
                    .is_some_and(|until| settled || heirs::rewrite_is_due(until))
            })
            .and_then(|held| held.fence.written());
        // Kept for a joiner too: it may not be ready before the window ends.
        let keeps = owns || keep_for_joiner;
        if let Some(inherited) = inherited.filter(|_| keeps && look.may_rewrite()) {
            return Step::Rewrite {
                generation,
                inherited: Box::new(inherited.clone()),
            };
        }
        match (owns, entry.held.take()) {
            (false, Some(held)) if keep_for_joiner && !held.is_lost() => {
                entry.held = Some(held);
                Step::Nothing
            }
            (false, Some(held)) => Step::Release {
                held,
                why: format!(
                    "now owned by {}",
                    owner.map_or("nobody", |peer| peer.id.as_str())
                ),
                settle: entry.components.clone(),
                next: look.next_for(owner, name).map(Box::new),
            },
            // Handed over by the leaving peer that holds it, or freed with
            // its Lease.
            (true, None) if look.awaits_hand_over(name.as_str()) => Step::Nothing,
            // Most likely inherited: listed in a moment, without a write.
            (true, None) if look.inheriting => Step::Nothing,
            (true, None) if entry.retry_at.is_none_or(|at| now >= at) => Step::Take { generation },
            (owns, held) => {
                entry.held = held;
                if !owns {
                    // A retry due for a cluster that is another's now would
                    // have the loop look again at once, over and over.
                    entry.retry_at = None;
                    entry.busy = 0;
                }
                Step::Nothing
            }
        }
    }

    /// Long on purpose: the take for each way of holding fences, and what each
    /// answer means for the cluster.
    async fn take(&self, name: &ClusterName, generation: u64, peers: &[Peer]) {
        let fence_name = self.fence_name(name);
        let taken = match self.inner.options.fence_hold {
            FenceHold::Renewed => {
                fence::Fence::take(
                    &self.inner.leases,
                    fence_name.clone(),
                    &self.inner.me.id,
                    self.timing(),
                    self.inner.working.wake.clone(),
                )
                .await
            }
            FenceHold::WithPeer => {
                let standing = self.inner.standing.borrow().clone();
                if standing.live().is_none() {
                    // Until the peer Lease is renewed again; the registry
                    // wakes the loop then.
                    self.retry_later(name, generation);
                    return;
                }
                let epochs = &self.inner.view.epochs;
                let known = epochs::TakeKnowledge {
                    epochs,
                    cluster: name.as_str(),
                };
                let last = lock(&self.inner.working.clusters)
                    .current_mut(name, generation)
                    .and_then(|entry| entry.data.last_written.take());
                // Inherited and not written yet when its work stopped (the
                // peer Lease went unrenewed a while, in the same epoch):
                // still this replica's by the records, and nobody took it
                // (that takes ending this epoch first). Resumed as it is.
                if let Some((resumed, until)) = last
                    .as_ref()
                    .and_then(|last| self.still_inherited(last, name, &standing))
                {
                    self.start(name, generation, resumed, &fence_name, Some(until))
                        .await;
                    return;
                }
                // This replica's own earlier epoch too, once a take found it
                // (see `Epochs::learn`): after a restart, the fences nobody
                // stood in for are still held in it, and those stood in for
                // are handed back without a take.
                let ended = lock(epochs).ended_hold(name.as_str(), peers, Timestamp::now());
                fence::Fence::take_with_peer(
                    &self.inner.leases,
                    fence_name.clone(),
                    &self.inner.me.id,
                    &standing,
                    self.timing(),
                    &known,
                    lease::Prior { last, ended },
                )
                .await
            }
        };
        let fence = match taken {
            fence::Attempt::Taken(mut fence) => {
                if let Some(found) = fence.take_over_found() {
                    let weight = self
                        .peers()
                        .iter()
                        .find(|peer| peer.id == found.holder)
                        .map_or(1, |peer| peer.weight);
                    lock(&self.inner.view.epochs).learn(&found, weight, Timestamp::now());
                }
                fence
            }
            fence::Attempt::Busy(holder) => {
                tracing::debug!(cluster = %name, lease = %fence_name, holder = holder.as_deref().unwrap_or("unknown"), "fence busy; trying again later");
                self.retry_busy_later(name, generation);
                return;
            }
            fence::Attempt::Failed(reason) => {
                tracing::warn!(cluster = %name, lease = %fence_name, %reason, "could not take the fence; trying again later");
                self.retry_later(name, generation);
                return;
            }
        };
        self.start(name, generation, fence, &fence_name, None).await;
    }

    /// Starts the work on `name` under `fence`, just taken; hands the
    /// fence back if the cluster was replaced or left meanwhile.
    async fn start(
        &self,
        name: &ClusterName,
        generation: u64,
        fence: fence::Fence,
        fence_name: &str,
        inherited_until: Option<Timestamp>,
    ) {
        let start = {
            let mut clusters = lock(&self.inner.working.clusters);
            match clusters.current_mut(name, generation) {
                Some(entry) if entry.data.held.is_none() && entry.is_live() => {
                    let start = hold(entry, fence);
                    if let Some(held) = entry.data.held.as_mut() {
                        held.inherited_until = inherited_until;
                    }
                    Ok(start)
                }
                // Handed to this replica and taken up meanwhile: the
                // same hold, nothing to give back.
                Some(entry)
                    if entry
                        .data
                        .held
                        .as_ref()
                        .is_some_and(|held| held.fence.name == fence.name) =>
                {
                    return;
                }
                // Replaced or gone while the fence was taken: the next
                // look starts over.
                _ => Err(fence),
            }
        };
        match start {
            Ok((work, cluster, components)) => {
                tracing::info!(cluster = %name, peer = %self.inner.me.id, lease = %fence_name, "working on the cluster");
                engage_or_hand_back(&components, &work, name, &cluster);
            }
            Err(fence) => {
                self.release(fence, None).await;
                self.inner.working.wake.notify_one();
            }
        }
    }

    /// Writes `inherited`, the fence of `name` as listed when this replica
    /// inherited it, as its own (see `heirs`). Should someone else have
    /// written it since, the work on it stops: the fence is not this
    /// replica's. A failure is tried again at the next look.
    async fn rewrite(&self, name: &ClusterName, generation: u64, inherited: Lease) {
        let standing = self.inner.standing.borrow().clone();
        if standing.live().is_none() {
            return;
        }
        let held_with = format!("{}/{}", standing.peer_lease, standing.epoch);
        let options = &self.inner.options;
        let call = lease::inherit(
            &self.inner.leases,
            &self.inner.me.id,
            options.fence_lease_duration,
            &held_with,
            inherited,
        );
        let outcome = tokio::time::timeout(options.fence_renew_interval, call).await;
        let fence_name = self.fence_name(name);
        let mut clusters = lock(&self.inner.working.clusters);
        let Some(entry) = clusters.current_mut(name, generation) else {
            return;
        };
        let share = &mut entry.data;
        let still_inherited = share
            .held
            .as_ref()
            .is_some_and(|held| held.fence.name == fence_name && held.inherited_until.is_some());
        if !still_inherited {
            return;
        }
        match outcome {
            Ok(Ok(Some(written))) => {
                if let Some(held) = share.held.as_mut() {
                    held.fence.set_written(written);
                    held.inherited_until = None;
                }
            }
            Ok(Ok(None)) => {
                if let Some(held) = share.held.take() {
                    held.work.cancel();
                }
                share.retry_at = Some(Instant::now() + options.fence_retry_delay);
                tracing::warn!(cluster = %name, lease = %fence_name, "an inherited fence was written by another replica; stopped working on the cluster");
            }
            Ok(Err(err)) => {
                tracing::debug!(cluster = %name, lease = %fence_name, error = %crate::kube_error(&err), "could not write an inherited fence as this replica's own; trying again");
            }
            Err(_) => {
                tracing::debug!(cluster = %name, lease = %fence_name, "no answer writing an inherited fence as this replica's own; trying again");
            }
        }
    }

    /// Clears `fence` (or hands it to `next`); one whose release failed is
    /// cleared again at the next look.
    async fn release(&self, fence: fence::Fence, next: Option<&lease::Next>) {
        let timeout = self.inner.options.fence_renew_interval;
        if let Some(unreleased) = fence
            .release(&self.inner.leases, &self.inner.me.id, timeout, next)
            .await
        {
            lock(&self.inner.working.unreleased).push(unreleased);
        }
    }

    /// Tries again to release the fences whose release failed, but not one
    /// this replica has taken again since (its cluster came back to it):
    /// clearing that would let another replica take a cluster worked on
    /// here. Only the balancing loop takes fences by a write, and this runs
    /// in it, so none is taken while this looks (a fence handed over is
    /// one another replica held, never one of these).
    async fn release_again(&self) {
        let unreleased = std::mem::take(&mut *lock(&self.inner.working.unreleased));
        for fence in unreleased {
            let taken_again = lock(&self.inner.working.clusters).values().any(|entry| {
                entry
                    .data
                    .held
                    .as_ref()
                    .is_some_and(|held| held.fence.name == fence.name)
            });
            if !taken_again {
                self.release(fence, None).await;
            }
        }
    }

    fn retry_later(&self, name: &ClusterName, generation: u64) {
        if let Some(entry) = lock(&self.inner.working.clusters).current_mut(name, generation) {
            entry.data.retry_at = Some(Instant::now() + self.inner.options.fence_retry_delay);
        }
    }

    /// A fence found held by another replica (which hands it over once it
    /// sees this one own the cluster, or which this one sees gone) is tried
    /// again after the retry delay, doubled with each busy attempt in a row
    /// up to the probe interval: a replica that joins a large fleet finds
    /// thousands of fences busy at once, and asking for each of them every
    /// retry delay would load the API server the releases go through.
    fn retry_busy_later(&self, name: &ClusterName, generation: u64) {
        let options = &self.inner.options;
        if let Some(entry) = lock(&self.inner.working.clusters).current_mut(name, generation) {
            let share = &mut entry.data;
            let delay = options
                .fence_retry_delay
                .saturating_mul(1 << share.busy.min(16))
                .min(options.probe_interval.max(options.fence_retry_delay));
            share.busy = share.busy.saturating_add(1);
            share.retry_at = Some(Instant::now() + delay);
        }
    }

    /// When the next look is due: the probe interval, or sooner when a busy
    /// fence may be tried again.
    fn next_look(&self) -> Instant {
        let probe = Instant::now() + self.inner.options.probe_interval;
        lock(&self.inner.working.clusters)
            .values()
            .filter(|entry| entry.data.held.is_none())
            .filter_map(|entry| entry.data.retry_at)
            .fold(probe, Instant::min)
    }

    /// Stops all work and hands every fence back once it has stopped (as a
    /// hand-over does, within the hand-over timeout). Fences held with the
    /// peer Lease are not written one by one: the registry deletes the peer
    /// Lease right after, in a new epoch, which frees all of them with one
    /// request (or, should that fail, when the Lease lapses, as after a
    /// crash).
    async fn release_all(&self) {
        let held: Vec<HandedBack> = lock(&self.inner.working.clusters)
            .iter_mut()
            .filter_map(|(name, entry)| {
                let held = entry.data.held.take()?;
                Some((name.clone(), held, entry.data.components.clone()))
            })
            .collect();
        self.inner.working.show();
        let count = held.len();
        self.inner
            .inheritance
            .left_behind
            .store(count, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(clusters = count, peer = %self.inner.me.id, "shutting down: handing every cluster back");
        let with_peer = self.inner.options.fence_hold == FenceHold::WithPeer;
        let mut renewed = Vec::new();
        let mut settling = Vec::new();
        for (name, held, components) in held {
            held.work.cancel();
            tracing::debug!(cluster = %name, "shutting down: handing the cluster back");
            settling.extend(components.iter().map(|component| component.settled(&name)));
            if !with_peer {
                renewed.push(held.fence);
            }
        }
        let timeout = self.inner.options.handover_timeout;
        if tokio::time::timeout(timeout, futures::future::join_all(settling))
            .await
            .is_err()
        {
            tracing::warn!(
                ?timeout,
                "work still running; handing the clusters back anyway"
            );
        }
        let timeout = self.inner.options.fence_renew_interval;
        let unreleased = std::mem::take(&mut *lock(&self.inner.working.unreleased));
        // What a release leaves unreleased is freed when the peer Lease goes.
        futures::stream::iter(renewed.into_iter().chain(unreleased))
            .for_each_concurrent(CONCURRENT_STEPS, |fence| async move {
                fence
                    .release(&self.inner.leases, &self.inner.me.id, timeout, None)
                    .await;
            })
            .await;
    }
}

/// Engages the components under the fence's `work`; a failure stops the
/// work, so the cluster is handed back and tried again rather than left
/// half-engaged.
fn engage_or_hand_back(
    components: &[Arc<dyn Aware>],
    work: &CancellationToken,
    name: &ClusterName,
    cluster: &Cluster,
) {
    if let Err(err) = engage_each(components, work, name, cluster) {
        tracing::error!(cluster = %name, error = %err, "engaging a component failed; handing the cluster back");
        work.cancel();
    }
}

#[async_trait::async_trait]
impl Coordinator for ShardedCoordinator {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
        components: &[Arc<dyn Aware>],
    ) -> Result<(), Error> {
        // The hub of components whose members' work reads it: engaged on
        // every replica, unfenced, for the cluster's lifetime (Go's
        // multicluster-runtime never shards the local cluster either).
        let (everywhere, components): (Vec<_>, Vec<_>) = components
            .iter()
            .cloned()
            .partition(|component| name.is_local() && component.local_on_every_replica());
        if !everywhere.is_empty() {
            engage_each(&everywhere, &lifetime, &name, &cluster)?;
        }
        let components = components.as_slice();
        let start = {
            let mut clusters = lock(&self.inner.working.clusters);
            match clusters.arrival(&name, &cluster, &lifetime) {
                Arrival::Stale => return Ok(()),
                Arrival::Again => {
                    // More components for a cluster already here.
                    let entry = clusters
                        .get_mut(&name)
                        .expect("an engagement seen again is held");
                    let share = &mut entry.data;
                    let new = add_components(&mut share.components, components);
                    share
                        .held
                        .as_ref()
                        .filter(|held| !held.work.is_cancelled())
                        .map(|held| (held.work.clone(), cluster.clone(), new))
                }
                Arrival::New => {
                    // A new cluster, or a new instance under the same name
                    // (rotated credentials): the old engagement's work ends,
                    // a fence held for it stays, and the work restarts on
                    // the new instance.
                    let share = Share {
                        components: components.to_vec(),
                        held: None,
                        retry_at: None,
                        busy: 0,
                        last_written: None,
                    };
                    let (entry, replaced) =
                        clusters.insert(name.clone(), cluster.clone(), &lifetime, share);
                    let wake = self.inner.working.wake.clone();
                    when_ended(&entry.lifetime, move || wake.notify_one());
                    let kept = replaced
                        .and_then(|old| old.data.held)
                        .filter(|held| !held.is_lost());
                    kept.map(|held| {
                        let held = Held::new(held.fence, &entry.lifetime);
                        let work = held.work.clone();
                        entry.data.held = Some(held);
                        (work, cluster.clone(), components.to_vec())
                    })
                }
            }
        };
        if let Some((work, cluster, components)) = start {
            engage_or_hand_back(&components, &work, &name, &cluster);
        }
        self.inner.working.wake.notify_one();
        Ok(())
    }

    fn owns(&self, name: &ClusterName) -> bool {
        lock(&self.inner.working.clusters)
            .live(name)
            .and_then(|entry| entry.data.held.as_ref())
            .is_some_and(|held| !held.work.is_cancelled())
    }

    fn replicas(&self) -> Option<multicluster_runtime::coordinator::Replicas> {
        let peers = self.peers();
        Some(multicluster_runtime::coordinator::Replicas {
            me: self.inner.me.id.clone(),
            live: peers.iter().map(|peer| peer.id.clone()).collect(),
            owner: Arc::new(move |name: &ClusterName| {
                owner_of(name.as_str(), &peers).map(|peer| peer.id.clone())
            }),
        })
    }

    /// The clusters this replica works on now (it holds their fences),
    /// sorted.
    fn working_on(&self) -> Option<Vec<ClusterName>> {
        Some(self.inner.working.working_on())
    }

    fn inventory_engaged(&self) {
        self.inner.lifecycle.advance(Phase::Ready);
    }

    /// Hands every cluster over one by one (fences held with the peer
    /// Lease; for up to `leave_handover`): the peer Lease says this replica
    /// is leaving, so the others no longer count it as an owner and wait
    /// for its clusters rather than ask for them, and each look hands the
    /// clusters straight to their next owners until one finds none left.
    fn hands_over_on_leave(&self) -> bool {
        let options = &self.inner.options;
        options.fence_hold == FenceHold::WithPeer && !options.leave_handover.is_zero()
    }

    async fn leave(&self) {
        if !self.hands_over_on_leave() {
            return;
        }
        let options = &self.inner.options;
        let began = Instant::now();
        self.inner.lifecycle.advance(Phase::Leaving);
        tracing::info!(peer = %self.inner.me.id, "leaving: handing the clusters over to the others");
        // Or no longer balancing (it failed or ended): nothing would hand
        // anything over.
        let done = self.inner.lifecycle.until(Phase::HandedOver);
        match tokio::time::timeout(options.leave_handover, done).await {
            Ok(()) => {
                tracing::info!(peer = %self.inner.me.id, took = ?began.elapsed(), "leaving: handed over every cluster a ready peer could take");
            }
            Err(_) => {
                let left = self.working_on().map_or(0, |names| names.len());
                tracing::info!(peer = %self.inner.me.id, clusters = left, "leaving: time is up; the rest go with the peer Lease");
            }
        }
    }

    /// Runs the replica as a list of steps (each in `run.rs`): ready at
    /// the latest after `inventory_wait`, the peer registry, the fences
    /// followed (held with the peer Lease), the looks until `stop`, then
    /// everything handed back before the peer Lease goes.
    async fn run(&self, stop: CancellationToken) -> Result<(), Error> {
        let _stopped = self.inner.lifecycle.stops_on_drop();
        let _stop_waiting = self.ready_after_the_inventory_wait(&stop);
        let registry = self.registry();
        let known = registry.known.clone();
        let registry_stop = CancellationToken::new();
        // Should this future be dropped before the end (the manager's stop
        // deadline passed), the registry stops renewing rather than go on
        // for a replica that no longer runs.
        let abandoned = CancellationToken::new();
        let _abandon_when_dropped = abandoned.clone().drop_guard();
        let registry_task = tokio::spawn(registry.run(registry_stop.clone(), abandoned));
        let _stop_following = self.follow_fences();
        tracing::info!(peer = %self.inner.me.id, namespace = %self.inner.options.namespace, "sharding the fleet");
        self.look_until(&stop, &known).await;
        self.inner.lifecycle.advance(Phase::Stopping);
        self.release_all().await;
        registry_stop.cancel();
        registry_task.await.map_err(|source| Error::TaskFailed {
            task: "the peer registry",
            source,
        })
    }
}

impl std::fmt::Debug for ShardedCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedCoordinator")
            .field("peer", &self.inner.me)
            .field("working_on", &self.working_on())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::wire;

    use super::*;

    #[test]
    fn the_defaults_are_gos_and_valid() {
        let options = ShardingOptions::default();
        assert!(options.check().is_ok());
        assert_eq!(options.namespace, "kube-system");
        assert_eq!(options.peer_prefix, "mcr-peer");
        assert_eq!(options.fence_prefix, "mcr-shard");
        assert_eq!(options.fence_lease_duration, Duration::from_secs(20));
        assert_eq!(options.probe_interval, Duration::from_secs(5));
    }

    fn offline_client() -> kube::Client {
        let config = kube::Config::new("https://127.0.0.1:1".parse().expect("uri"));
        kube::Client::try_from(config).expect("client")
    }

    /// Replica "me", its API server never reachable.
    fn replica_me() -> ShardedCoordinator {
        ShardedCoordinator::new(
            offline_client(),
            ShardingOptions::default().peer_id("me".to_string()),
        )
        .expect("coordinator")
    }

    /// Replica "me" with a live standing, and what a fence held with that
    /// standing says it is held with.
    fn standing_replica() -> (ShardedCoordinator, CancellationToken, String) {
        let coordinator = replica_me();
        let live = CancellationToken::new();
        coordinator.inner.standing.send_modify(|standing| {
            standing.live = Some(live.clone());
        });
        let held_with = {
            let standing = coordinator.inner.standing.borrow();
            format!("{}/{}", standing.peer_lease, standing.epoch)
        };
        (coordinator, live, held_with)
    }

    /// A fence of `cluster` handed to "me" with `held_with`, by `by`.
    fn handed_fence(held_with: &str, cluster: &str, by: Option<&str>) -> Lease {
        let mut annotations = std::collections::BTreeMap::from([
            (
                wire::HELD_WITH_ANNOTATION.to_string(),
                held_with.to_string(),
            ),
            (wire::CLUSTER_ANNOTATION.to_string(), cluster.to_string()),
        ]);
        if let Some(by) = by {
            annotations.insert(wire::HANDED_BY_ANNOTATION.to_string(), by.to_string());
        }
        Lease {
            metadata: kube::api::ObjectMeta {
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some("me".to_string()),
                ..Default::default()
            }),
        }
    }

    /// Engages `cluster` (never reachable) with no components.
    fn engage_offline(coordinator: &ShardedCoordinator, cluster: &str) {
        coordinator
            .engage(
                CancellationToken::new(),
                ClusterName::from(cluster),
                Cluster::new(cluster, offline_client()),
                &[],
            )
            .expect("engage");
    }

    #[tokio::test]
    async fn a_fence_handed_over_names_its_cluster_so_that_the_receiver_finds_it() {
        let coordinator = replica_me();
        let peer = Peer {
            id: "p".to_string(),
            weight: 1,
        };
        let next = lease::Next {
            holder: "p".to_string(),
            held_with: "mcr-peer-p/e1".to_string(),
            duration: Duration::from_secs(20),
            cluster: String::new(),
        };
        let look = Look {
            next: std::collections::HashMap::from([("p".to_string(), next)]),
            ..Look::default()
        };
        // The local cluster (shown as `<local>`), a plain name, and one
        // whose fence name is hashed.
        for name in ["", "zoo", "Team/Prod_1"] {
            let name = ClusterName::from(name);
            let handed = look.next_for(Some(&peer), &name).expect("handed");
            assert_eq!(
                coordinator.fence_name(&ClusterName::from(handed.cluster.as_str())),
                coordinator.fence_name(&name),
                "{name:?}"
            );
        }
        assert!(look.next_for(None, &ClusterName::from("zoo")).is_none());
    }

    #[tokio::test]
    async fn a_fence_handed_over_is_taken_up_at_once_but_not_while_stopping() {
        let (coordinator, _live, held_with) = standing_replica();
        let handed_for = |cluster: &str| handed_fence(&held_with, cluster, None);
        // This replica alone: it owns both clusters.
        for cluster in ["one", "two"] {
            engage_offline(&coordinator, cluster);
        }
        let one = ClusterName::from("one");
        coordinator
            .arrived(coordinator.fence_name(&one), handed_for("one"))
            .await;
        assert_eq!(coordinator.working_on(), Some(vec![one]));
        coordinator.inner.lifecycle.advance(Phase::Stopping);
        let two = ClusterName::from("two");
        coordinator
            .arrived(coordinator.fence_name(&two), handed_for("two"))
            .await;
        assert_eq!(
            coordinator.working_on(),
            Some(vec![ClusterName::from("one")]),
            "a fence handed while stopping was taken up"
        );
    }

    #[tokio::test]
    async fn a_retry_left_on_a_cluster_owned_by_another_does_not_hurry_the_next_look() {
        let coordinator = replica_me();
        let name = ClusterName::from("elsewhere");
        let cluster = Cluster::new("elsewhere", offline_client());
        coordinator
            .engage(CancellationToken::new(), name.clone(), cluster, &[])
            .expect("engage");
        // A take that failed while this replica still thought it owned the
        // cluster (before it knew its peers, say).
        let generation = lock(&coordinator.inner.working.clusters)
            .get(&name)
            .expect("held")
            .generation;
        coordinator.retry_later(&name, generation);
        tokio::time::sleep(coordinator.inner.options.fence_retry_delay).await;
        // The peers are known now, and another owns the cluster.
        let other = Peer {
            id: "other".to_string(),
            weight: 1,
        };
        let peers = [coordinator.inner.me.clone(), other.clone()];
        let peers: Vec<Peer> = if owner_of(name.as_str(), &peers) == Some(&other) {
            peers.to_vec()
        } else {
            // Make `other` win: weight it far above this replica.
            vec![
                coordinator.inner.me.clone(),
                Peer {
                    weight: u32::MAX,
                    ..other
                },
            ]
        };
        assert_eq!(
            owner(name.as_str(), &peers).map(|p| p.id.as_str()),
            Some("other")
        );
        assert!(matches!(
            coordinator.decide(
                &name,
                &Look {
                    peers: peers.to_vec(),
                    ..Look::default()
                }
            ),
            Step::Nothing
        ));
        let next = coordinator.next_look();
        assert!(
            next > Instant::now(),
            "a stale retry of a cluster this replica does not own makes the loop look again at once, over and over"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_found_busy_again_and_again_is_tried_less_often() {
        let coordinator = replica_me();
        let name = ClusterName::from("joined");
        coordinator
            .engage(
                CancellationToken::new(),
                name.clone(),
                Cluster::new("joined", offline_client()),
                &[],
            )
            .expect("engage");
        let generation = lock(&coordinator.inner.working.clusters)
            .get(&name)
            .expect("held")
            .generation;
        let delay = |coordinator: &ShardedCoordinator| {
            coordinator.retry_busy_later(&name, generation);
            let retry_at = lock(&coordinator.inner.working.clusters)
                .get(&name)
                .and_then(|entry| entry.data.retry_at)
                .expect("a retry");
            (retry_at - Instant::now()).as_millis()
        };
        let delays: Vec<u128> = (0..6).map(|_| delay(&coordinator)).collect();
        // 750 ms doubled each time, up to the look every 5 s.
        assert_eq!(delays, [750, 1500, 3000, 5000, 5000, 5000]);
        // Another replica's cluster now: the count starts over.
        let other = Peer {
            id: "other".to_string(),
            weight: u32::MAX,
        };
        let peers = [coordinator.inner.me.clone(), other];
        assert!(matches!(
            coordinator.decide(
                &name,
                &Look {
                    peers: peers.to_vec(),
                    ..Look::default()
                }
            ),
            Step::Nothing
        ));
        assert_eq!(delay(&coordinator), 750);
    }

    #[tokio::test]
    async fn a_fence_taken_again_is_not_released_by_an_earlier_failed_release() {
        let coordinator = ShardedCoordinator::new(
            offline_client(),
            ShardingOptions::default()
                .peer_id("me".to_string())
                .fence_hold(FenceHold::WithPeer)
                .fence_renew_interval(Duration::from_millis(200)),
        )
        .expect("coordinator");
        let standing = CancellationToken::new();
        let (again, other) = (ClusterName::from("again"), ClusterName::from("other"));
        for name in [&again, &other] {
            let cluster = Cluster::new(name.clone(), offline_client());
            coordinator
                .engage(CancellationToken::new(), name.clone(), cluster, &[])
                .expect("engage");
        }
        // Both fences failed to be released earlier; `again` has been
        // taken again since and is worked on here.
        for name in [&again, &other] {
            let fence = fence::Fence::held_with_peer(&coordinator.fence_name(name), &standing);
            lock(&coordinator.inner.working.unreleased).push(fence);
        }
        {
            let mut clusters = lock(&coordinator.inner.working.clusters);
            let entry = clusters.get_mut(&again).expect("held");
            let fence = fence::Fence::held_with_peer(&coordinator.fence_name(&again), &standing);
            entry.data.held = Some(Held::new(fence, &entry.lifetime));
        }
        coordinator.release_again().await;
        // The API server is unreachable, so a release that is tried fails
        // and comes back; the one taken again must not have been tried.
        let left: Vec<String> = lock(&coordinator.inner.working.unreleased)
            .iter()
            .map(|fence| fence.name.clone())
            .collect();
        assert_eq!(left, [coordinator.fence_name(&other)]);
    }

    type Spoil = fn(&mut ShardingOptions);

    /// A replica "me" in a live standing, with twelve clusters whose fences
    /// "gone" held in its epoch "e1", and the peer Lease of "gone" as its
    /// end left it: naming "me" and "q" its heirs.
    struct Inheritance {
        _cp: multicluster_envtest::ControlPlane,
        coordinator: ShardedCoordinator,
        api: Api<Lease>,
        clusters: Vec<String>,
        /// `<peer Lease>/<epoch>` of "me".
        mine: String,
        /// The clusters whose heir is "me", sorted.
        mine_to_inherit: Vec<String>,
        gone: Lease,
    }

    async fn inheritance() -> Inheritance {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let options = ShardingOptions::default()
            .peer_id("me".to_string())
            .fence_hold(FenceHold::WithPeer);
        let coordinator = ShardedCoordinator::new(client, options).expect("coordinator");
        coordinator.inner.standing.send_modify(|standing| {
            standing.live = Some(CancellationToken::new());
        });
        let mine = {
            let standing = coordinator.inner.standing.borrow();
            format!("{}/{}", standing.peer_lease, standing.epoch)
        };
        let api = coordinator.inner.leases.clone();
        let clusters: Vec<String> = (0..12).map(|i| format!("shard-{i}")).collect();
        // Every fence held by "gone" in the epoch that ended.
        for cluster in &clusters {
            engage_offline(&coordinator, cluster);
            let fence = coordinator.fence_name(&ClusterName::from(cluster.as_str()));
            let taken = lease::take(
                &lease::Taking {
                    api: &api,
                    name: &fence,
                    me: "gone",
                    duration: Duration::from_secs(30),
                    held_with: Some("mcr-peer-gone/e1"),
                },
                &lease::NothingKnown,
                None,
            )
            .await
            .expect("take");
            assert!(matches!(taken, lease::Taken::Yes(_)));
        }
        // Its end named "me" (in its current epoch) and "q" its heirs.
        let record = heirs::Record::new(
            "gone",
            "e1",
            vec![
                heirs::HeirPeer {
                    id: "me".to_string(),
                    weight: 1,
                    held_with: mine.clone(),
                },
                heirs::HeirPeer {
                    id: "q".to_string(),
                    weight: 1,
                    held_with: "mcr-peer-q/q1".to_string(),
                },
            ],
        );
        let mut mine_to_inherit: Vec<String> = clusters
            .iter()
            .filter(|cluster| record.heir_for(cluster).is_some_and(|heir| heir.id == "me"))
            .cloned()
            .collect();
        mine_to_inherit.sort();
        assert!(
            !mine_to_inherit.is_empty() && mine_to_inherit.len() < clusters.len(),
            "the heirs do not share the fences: {mine_to_inherit:?}"
        );
        let mut gone = lease::tests::peer_lease("mcr-peer-gone", "gone", "e1", 60);
        gone.spec.as_mut().expect("spec").holder_identity = None;
        let value = heirs::annotation_with(&gone, record, Timestamp::now()).expect("record");
        gone.metadata
            .annotations
            .get_or_insert_default()
            .insert(wire::HEIRS_ANNOTATION.to_string(), value);
        Inheritance {
            _cp: cp,
            coordinator,
            api,
            clusters,
            mine,
            mine_to_inherit,
            gone,
        }
    }

    /// How many lists of inherited fences `coordinator` needed.
    fn lists(coordinator: &ShardedCoordinator) -> usize {
        coordinator
            .inner
            .inheritance
            .lists
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn working_on(coordinator: &ShardedCoordinator) -> Vec<String> {
        let mut working: Vec<String> = coordinator
            .working_on()
            .unwrap_or_default()
            .iter()
            .map(|name| name.to_string())
            .collect();
        working.sort();
        working
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_heir_works_on_what_it_inherits_before_writing_it_and_writes_it_later() {
        let Inheritance {
            _cp,
            coordinator,
            api,
            clusters,
            mine,
            mine_to_inherit,
            gone,
        } = inheritance().await;
        assert!(lock(&coordinator.inner.view.epochs).record(&[gone], Timestamp::now()));

        let holder_of = |cluster: &str| {
            let (api, fence) = (
                api.clone(),
                coordinator.fence_name(&ClusterName::from(cluster)),
            );
            async move { api.get(&fence).await.expect("fence") }
        };
        let working = || working_on(&coordinator);
        let all_still_name_gone = |why: &'static str| {
            let holder_of = &holder_of;
            let clusters = &clusters;
            async move {
                for cluster in clusters {
                    let fence = holder_of(cluster).await;
                    assert_eq!(lease::holder_of(&fence), Some("gone"), "{cluster}: {why}");
                }
            }
        };
        // Without its watch of the Leases, it lists them.
        coordinator.inherit().await;
        assert_eq!(lists(&coordinator), 1);
        assert_eq!(
            working(),
            mine_to_inherit,
            "not working on what it inherited"
        );
        all_still_name_gone("its fence was written before the work started").await;

        // Its peer Lease went unrenewed a while, in the same epoch: the
        // work stops, and resumes without a write.
        let stop = CancellationToken::new();
        coordinator.inner.standing.send_modify(|standing| {
            if let Some(live) = standing.live.replace(CancellationToken::new()) {
                live.cancel();
            }
        });
        coordinator.balance(&stop).await;
        assert_eq!(coordinator.working_on().unwrap_or_default(), Vec::new());
        // The test drives the looks itself (no `run`): each one is a step
        // of the replica, and the standing comes back with the next read.
        let deadline = Instant::now() + Duration::from_secs(30);
        while working() != mine_to_inherit {
            assert!(Instant::now() < deadline, "not resumed: {:?}", working());
            tokio::time::sleep(Duration::from_millis(50)).await;
            coordinator.balance(&stop).await;
        }
        all_still_name_gone("its fence was written to resume the work").await;

        // The next look writes what it inherited as its own, and finds the
        // rest held by the other heir (whose epoch it has not seen end).
        coordinator.balance(&stop).await;
        for cluster in &clusters {
            let fence = holder_of(cluster).await;
            let inherited_from = fence
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(wire::INHERITED_FROM_ANNOTATION))
                .cloned();
            if mine_to_inherit.contains(cluster) {
                assert_eq!(lease::holder_of(&fence), Some("me"), "{cluster}");
                assert_eq!(lease::held_with_of(&fence), Some(mine.as_str()));
                assert_eq!(inherited_from.as_deref(), Some("gone"), "{cluster}");
            } else {
                assert_eq!(
                    lease::holder_of(&fence),
                    Some("gone"),
                    "{cluster} taken from q"
                );
            }
        }
        assert_eq!(working(), mine_to_inherit);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_heir_finds_what_it_inherits_in_its_watch_of_the_leases_without_a_list() {
        let inheritance = inheritance().await;
        let (coordinator, api) = (&inheritance.coordinator, &inheritance.api);
        let mirror = coordinator.inner.inheritance.mirror.clone();
        let following = tokio::spawn({
            let (mirror, api) = (mirror.clone(), api.clone());
            async move { mirror.follow(api).await }
        });
        tokio::time::timeout(Duration::from_secs(30), mirror.until_synced())
            .await
            .expect("the watch lists the Leases within 30 s");
        // The end is written, and the peer read learns of it from what the
        // write answered: the watch shows it a moment later.
        let gone = api
            .create(&kube::api::PostParams::default(), &inheritance.gone)
            .await
            .expect("the end of gone's epoch");
        assert!(lock(&coordinator.inner.view.epochs).record(&[gone], Timestamp::now()));

        coordinator.inherit().await;
        assert_eq!(lists(coordinator), 0);
        assert_eq!(working_on(coordinator), inheritance.mine_to_inherit);
        for cluster in &inheritance.clusters {
            let fence = api
                .get(&coordinator.fence_name(&ClusterName::from(cluster.as_str())))
                .await
                .expect("fence");
            assert_eq!(lease::holder_of(&fence), Some("gone"), "{cluster} written");
        }
        following.abort();
    }

    #[tokio::test]
    async fn a_look_under_way_at_the_stop_leaves_every_cluster_to_the_hand_back() {
        let (coordinator, live, _) = standing_replica();
        let one = ClusterName::from("one");
        let lifetime = CancellationToken::new();
        coordinator
            .engage(
                lifetime.clone(),
                one.clone(),
                Cluster::new("one", offline_client()),
                &[],
            )
            .expect("engage");
        {
            let mut clusters = lock(&coordinator.inner.working.clusters);
            let entry = clusters.get_mut(&one).expect("engaged");
            let fence = fence::Fence::held_with_peer(&coordinator.fence_name(&one), &live);
            drop(hold(entry, fence));
        }
        // The manager stops: the clusters' lifetimes end with it.
        let stop = CancellationToken::new();
        stop.cancel();
        lifetime.cancel();
        let handed = coordinator
            .balance_one(&one, &Look::default(), &|| false, &stop)
            .await;
        assert!(!handed);
        let held = lock(&coordinator.inner.working.clusters)
            .get_mut(&one)
            .is_some_and(|entry| entry.data.held.is_some());
        assert!(
            held,
            "the fence was let go of one by one, not left to the hand-back"
        );
    }

    fn peer(id: &str) -> Peer {
        Peer {
            id: id.to_string(),
            weight: 1,
        }
    }

    fn handed_to(id: &str) -> lease::Next {
        let held_with = format!("mcr-peer-{id}/e1");
        lease::Next {
            holder: id.to_string(),
            held_with,
            duration: Duration::from_secs(20),
            cluster: String::new(),
        }
    }

    /// A cluster whose owner among `peers` is `id`.
    fn owned_by(id: &str, peers: &[Peer]) -> String {
        (0..)
            .map(|i| format!("c{i}"))
            .find(|name| owner_of(name, peers).is_some_and(|peer| peer.id == id))
            .expect("some cluster")
    }

    #[tokio::test]
    async fn a_fence_handed_by_its_owner_is_taken_up_but_one_handed_to_a_leaving_replica_goes_on() {
        let (coordinator, _live, held_with) = standing_replica();
        // As far as this replica has read, "x" is a peer like any other.
        coordinator
            .inner
            .view
            .peers
            .send_replace(vec![peer("me"), peer("x")]);
        let of_x = owned_by("x", &[peer("me"), peer("x")]);
        let handed_by_x = |cluster: &str| handed_fence(&held_with, cluster, Some("x"));
        engage_offline(&coordinator, &of_x);
        // "x" let it go (it leaves, and this replica has not read that yet):
        // not handed back to it.
        let name = ClusterName::from(of_x.as_str());
        coordinator
            .arrived(coordinator.fence_name(&name), handed_by_x(&of_x))
            .await;
        assert_eq!(coordinator.working_on(), Some(vec![name]));

        // Leaving itself, this replica passes a fence handed to it on.
        let another = (0..)
            .map(|i| format!("d{i}"))
            .find(|name| owner_of(name, &[peer("me"), peer("x")]).is_some_and(|p| p.id == "x"))
            .expect("some cluster");
        engage_offline(&coordinator, &another);
        coordinator.inner.lifecycle.advance(Phase::SaidLeaving);
        let name = ClusterName::from(another.as_str());
        coordinator
            .arrived(coordinator.fence_name(&name), handed_by_x(&another))
            .await;
        assert!(
            !coordinator.working_on().unwrap_or_default().contains(&name),
            "a leaving replica took up a fence handed to it"
        );
    }

    #[test]
    fn a_leaving_replica_hands_each_cluster_to_its_next_owner_or_its_keeper() {
        // "me" leaves; "a" is ready; "j" has joined but is not ready.
        let look = Look {
            peers: vec![peer("a"), peer("j"), peer("me")],
            joining: ["j".to_string()].into(),
            ready: vec![peer("a"), peer("me")],
            next: [("a".to_string(), handed_to("a"))].into(),
            ..Look::default()
        };
        let others = [peer("a"), peer("j")];
        let for_a = ClusterName::from(owned_by("a", &others).as_str());
        let for_j = ClusterName::from(owned_by("j", &others).as_str());
        let next = look.hand_over_to(&for_a, "me").expect("handed to a");
        assert_eq!(
            (next.holder.as_str(), next.cluster.as_str()),
            ("a", for_a.as_str())
        );
        // The joining owner's cluster goes to the ready peer that keeps it.
        let next = look.hand_over_to(&for_j, "me").expect("kept by a");
        assert_eq!(next.holder, "a");
        // Nobody ready to take it: freed with the peer Lease instead.
        let alone = Look {
            next: std::collections::HashMap::new(),
            ..look
        };
        assert!(alone.hand_over_to(&for_a, "me").is_none());
    }

    #[test]
    fn a_cluster_a_leaving_peer_holds_is_waited_for_not_asked_for() {
        let look = Look {
            peers: vec![peer("a"), peer("me")],
            leaving: ["x".to_string()].into(),
            with_leaving: vec![peer("a"), peer("me"), peer("x")],
            ..Look::default()
        };
        let all = [peer("a"), peer("me"), peer("x")];
        assert!(look.awaits_hand_over(&owned_by("x", &all)));
        assert!(!look.awaits_hand_over(&owned_by("me", &all)));
        let nobody_leaves = Look {
            peers: vec![peer("a"), peer("me")],
            ..Look::default()
        };
        assert!(!nobody_leaves.awaits_hand_over(&owned_by("x", &all)));
    }

    #[test]
    fn invalid_options_are_named() {
        let cases: [(Spoil, &str); 5] = [
            (
                |o| o.peer_prefix = "Peers!".into(),
                "peer_prefix \"Peers!\"",
            ),
            (|o| o.fence_prefix = String::new(), "fence_prefix \"\""),
            (|o| o.namespace = String::new(), "namespace is empty"),
            (
                |o| o.fence_renew_interval = o.fence_lease_duration,
                "the fence renew interval (20s) must be above zero and below the fence lease duration (20s)",
            ),
            (
                |o| o.peer_renew_interval = Duration::ZERO,
                "the peer renew interval (0ns)",
            ),
        ];
        for (spoil, message) in cases {
            let mut options = ShardingOptions::default();
            spoil(&mut options);
            let err = options.check().expect_err(message).to_string();
            assert!(err.starts_with("sharding options: "), "{err}");
            assert!(err.contains(message), "{err} does not contain {message}");
        }
    }
}
