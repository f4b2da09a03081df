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
//! Where each part lives: `lifecycle` (the replica's phase), `peers` (the
//! peer Leases: the registry, lapsed peers' epochs), `hrw` (ownership),
//! `look` and `balance` (a look at the fleet, and the decision per
//! cluster), `taking` (taking, starting, releasing fences), `working_set`
//! (what this replica holds), `handover` (fences handed to it), `epochs`,
//! `heirs`, `mirror` and `inheritance` (what a replica leaves and
//! inherits), `coordinating` (the [`Coordinator`] contract), `run` (the
//! replica's steps), `options`; the crate README draws the state machines.
//!
//! The replicas need RBAC to get, list, watch, create, update, patch and
//! delete Leases in the fence namespace (without `watch` they still work:
//! peers are then noticed at the next read, up to a renew interval later,
//! and a fence handed over at the new owner's next take, a read;
//! without `patch`, taking a fence of a replica that left is a read and an
//! update instead of one patch).

mod balance;
mod coordinating;
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
mod taking;
#[cfg(feature = "testing")]
mod testing;
#[cfg(test)]
mod tests;
mod working_set;

use coordinating::engage_or_hand_back;
use look::{Look, owner_but};

use working_set::{HandedBack, Starting, Step};

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
use multicluster_runtime::coordinator::{Coordinator, engage_each};

pub use hrw::Peer;
pub(crate) use hrw::owner as owner_of;
use lifecycle::Phase;

pub use options::{FenceHold, ShardingOptions};
#[cfg(feature = "testing")]
pub use testing::{fence_lease_name, owner, until_split};

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
        self.inner.inheritance.mirror().synced()
    }

    /// Completes once this replica follows the fences with a watch that
    /// has listed them ([`ShardedCoordinator::follows_fences`]): for tests
    /// (feature `testing`).
    #[cfg(feature = "testing")]
    pub async fn until_following_fences(&self) {
        self.inner.inheritance.mirror().until_synced().await;
    }

    /// How many lists of inherited fences this replica needed, rather than
    /// finding them in what it follows: for tests (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn inheritance_lists(&self) -> usize {
        self.inner.inheritance.lists()
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
        self.inner.view.peers()
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
        self.inner.view.follow()
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
}
