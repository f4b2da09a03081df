//! What a peer Lease says of its replica, beside its holder and renewal:
//! the annotations every replica writes on its own peer Lease and reads
//! on the others' (`peers` writes them, `epochs` and `peers` read them).
//!
//! | annotation | written by | means |
//! |---|---|---|
//! | `mcr.sigs.k8s.io/weight` | the replica, on its peer Lease | its share of the fleet relative to the others (missing or 0: 1) |
//! | `mcr.sigs.k8s.io/ready` | the replica | `"false"` until its provider engaged the inventory it first found; missing: ready |
//! | `mcr.sigs.k8s.io/leaving` | the replica, as it stops | `"true"`: it hands its clusters over and is no owner any more |

use k8s_openapi::api::coordination::v1::Lease;

/// Annotation holding a peer's weight.
pub(crate) const WEIGHT_ANNOTATION: &str = "mcr.sigs.k8s.io/weight";
/// Annotation saying whether a peer is ready to be handed clusters
/// (`"false"` until its provider has engaged the inventory it first found;
/// missing means ready).
pub(crate) const READY_ANNOTATION: &str = "mcr.sigs.k8s.io/ready";
/// Annotation saying a peer is leaving (`"true"`): it hands its clusters
/// to the others one by one and is no longer counted as their owner, but
/// its epoch, and every fence held with it, holds until its Lease goes.
pub(crate) const LEAVING_ANNOTATION: &str = "mcr.sigs.k8s.io/leaving";

/// Whether a peer Lease says its replica is ready to be handed clusters
/// (missing: ready, as replicas that never say).
pub(crate) fn is_ready(lease: &Lease) -> bool {
    annotation(lease, READY_ANNOTATION) != Some("false")
}

/// Whether a peer Lease says its replica is leaving.
pub(crate) fn is_leaving(lease: &Lease) -> bool {
    annotation(lease, LEAVING_ANNOTATION) == Some("true")
}

/// The value of a peer Lease's annotation `key`.
fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// A peer's weight from its annotation; missing, unreadable or 0 is 1.
pub(crate) fn weight(lease: &Lease) -> u32 {
    annotation(lease, WEIGHT_ANNOTATION)
        .and_then(|w| w.parse::<u32>().ok())
        .filter(|w| *w > 0)
        .unwrap_or(1)
}
