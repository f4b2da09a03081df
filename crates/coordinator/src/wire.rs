//! The Lease wire protocol: every label and annotation the replicas write
//! on the Leases in the fence namespace, what each means and who writes
//! it. Holder, renew time and duration are the Lease's own fields.
//!
//! Peer Leases (`<peer prefix>-<peer ID>`, one per replica):
//!
//! | key | kind | written by | means |
//! |---|---|---|---|
//! | `app.kubernetes.io/part-of` | label | the replica, on its own | `multicluster-runtime` |
//! | `mcr.sigs.k8s.io/peer` | label | the replica | `"true"`: a peer Lease (the peers are listed and watched by it) |
//! | `mcr.sigs.k8s.io/prefix` | label | the replica | its peer prefix: replicas with other prefixes are not peers |
//! | `mcr.sigs.k8s.io/epoch` | annotation | the replica; emptied by whoever ends the epoch | its standing's epoch: a new one frees every fence held with the old |
//! | `mcr.sigs.k8s.io/weight` | annotation | the replica | its share relative to the others (missing or 0: 1) |
//! | `mcr.sigs.k8s.io/ready` | annotation | the replica | `"false"` until its provider engaged the inventory it first found; missing: ready |
//! | `mcr.sigs.k8s.io/leaving` | annotation | the replica, as it stops | `"true"`: it hands its clusters over and is no owner any more |
//! | `mcr.sigs.k8s.io/heirs` | annotation | whoever ends the epoch (the replica stopping, or a peer ending a lapsed one) | the live, ready peers that inherit the fences held with the ended epoch |
//!
//! Fence Leases (`<fence prefix>-<cluster>`, one per cluster):
//!
//! | key | kind | written by | means |
//! |---|---|---|---|
//! | `mcr.sigs.k8s.io/held-with` | annotation | the holder (fences held with the peer Lease) | `<peer Lease>/<epoch>`: the fence holds while that epoch is live |
//! | `mcr.sigs.k8s.io/held-with` | label | the holder | a hash of the same, so heirs list an ended epoch's fences in one request |
//! | `mcr.sigs.k8s.io/handed-to` | label | the replica handing the fence straight over | a hash of the receiver's `<peer Lease>/<epoch>`, which it watches for |
//! | `mcr.sigs.k8s.io/cluster` | annotation | the replica handing it over | the cluster it is for (long names are hashed in the Lease name) |
//! | `mcr.sigs.k8s.io/handed-by` | annotation | the replica handing it over | who let it go: the receiver does not count that replica as the owner |
//! | `mcr.sigs.k8s.io/inherited-from` | annotation | the heir writing it as its own | the replica whose ended epoch it inherited the fence from |

#[cfg(feature = "sharding")]
use k8s_openapi::api::coordination::v1::Lease;

/// Label every multicluster-runtime peer Lease carries.
#[cfg_attr(not(feature = "sharding"), allow(dead_code))]
pub(crate) const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";
/// Label marking a Lease as a peer's.
#[cfg_attr(not(feature = "sharding"), allow(dead_code))]
pub(crate) const PEER_LABEL: &str = "mcr.sigs.k8s.io/peer";
/// Label naming the peer prefix (replica groups with other prefixes are
/// not peers).
#[cfg_attr(not(feature = "sharding"), allow(dead_code))]
pub(crate) const PREFIX_LABEL: &str = "mcr.sigs.k8s.io/prefix";
/// Annotation on a peer Lease: the epoch of its replica's standing. A
/// replica that could not renew its peer Lease in time starts a new epoch,
/// which frees every fence it held with the old one.
pub(crate) const EPOCH_ANNOTATION: &str = "mcr.sigs.k8s.io/epoch";
/// Annotation holding a peer's weight.
#[cfg_attr(not(feature = "sharding"), allow(dead_code))]
pub(crate) const WEIGHT_ANNOTATION: &str = "mcr.sigs.k8s.io/weight";
/// Annotation saying whether a peer is ready to be handed clusters
/// (`"false"` until its provider has engaged the inventory it first found;
/// missing means ready).
#[cfg_attr(not(feature = "sharding"), allow(dead_code))]
pub(crate) const READY_ANNOTATION: &str = "mcr.sigs.k8s.io/ready";
/// Annotation saying a peer is leaving (`"true"`): it hands its clusters
/// to the others one by one and is no longer counted as their owner, but
/// its epoch, and every fence held with it, holds until its Lease goes.
#[cfg_attr(not(feature = "sharding"), allow(dead_code))]
pub(crate) const LEAVING_ANNOTATION: &str = "mcr.sigs.k8s.io/leaving";
/// Annotation on a peer Lease whose epoch ended naming heirs: who inherits
/// the fences held with that epoch (see `sharding::heirs`).
pub(crate) const HEIRS_ANNOTATION: &str = "mcr.sigs.k8s.io/heirs";

/// Annotation on a fence Lease held with its holder's peer Lease rather than
/// renewed itself: `<peer Lease name>/<epoch>`. The fence holds while that
/// peer Lease is live and announces that epoch.
pub(crate) const HELD_WITH_ANNOTATION: &str = "mcr.sigs.k8s.io/held-with";
/// Label on every fence Lease held with a peer Lease: `lease::label_for`
/// its `<peer Lease>/<epoch>`. When that epoch ends naming heirs, each
/// heir lists the fences it inherits by this label: one request, where
/// taking them was a write each.
pub(crate) const HELD_WITH_LABEL: &str = "mcr.sigs.k8s.io/held-with";
/// Label on a fence Lease handed straight to its next holder: a hash of
/// `<its peer Lease>/<its epoch>`, which that replica watches for, so it
/// finds the fences handed to it without a request each.
pub(crate) const HANDED_TO_LABEL: &str = "mcr.sigs.k8s.io/handed-to";
/// Annotation on a fence Lease handed straight over: the cluster it is
/// for (fence names of long or unusual cluster names are hashed).
pub(crate) const CLUSTER_ANNOTATION: &str = "mcr.sigs.k8s.io/cluster";
/// Annotation on a fence Lease handed straight over: the replica that
/// handed it. The receiver does not count that replica as the cluster's
/// owner: it let the cluster go (a replica that leaves hands its clusters
/// over before the others have all read that it leaves).
pub(crate) const HANDED_BY_ANNOTATION: &str = "mcr.sigs.k8s.io/handed-by";
/// Annotation on a fence Lease an heir wrote as its own: the replica whose
/// ended epoch it inherited the fence from.
pub(crate) const INHERITED_FROM_ANNOTATION: &str = "mcr.sigs.k8s.io/inherited-from";

/// Whether a peer Lease says its replica is ready to be handed clusters
/// (missing: ready, as replicas that never say).
#[cfg(feature = "sharding")]
pub(crate) fn is_ready(lease: &Lease) -> bool {
    annotation(lease, READY_ANNOTATION) != Some("false")
}

/// Whether a peer Lease says its replica is leaving.
#[cfg(feature = "sharding")]
pub(crate) fn is_leaving(lease: &Lease) -> bool {
    annotation(lease, LEAVING_ANNOTATION) == Some("true")
}

/// A peer's weight from its annotation; missing, unreadable or 0 is 1.
#[cfg(feature = "sharding")]
pub(crate) fn weight(lease: &Lease) -> u32 {
    annotation(lease, WEIGHT_ANNOTATION)
        .and_then(|w| w.parse::<u32>().ok())
        .filter(|w| *w > 0)
        .unwrap_or(1)
}

/// The value of a peer Lease's annotation `key`.
#[cfg(feature = "sharding")]
fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}
