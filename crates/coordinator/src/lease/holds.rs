//! Who holds a fence: the holder a Lease names, checked against the peer
//! Lease it is held with (its epoch live, ended, or handed to heirs).

use super::*;

/// The replica a fence held in an ended epoch went to, without a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Heir {
    /// Its peer ID.
    pub(crate) id: String,
    /// `<its peer Lease>/<its epoch>` when the heirs were named: it holds
    /// the fence while that epoch lives.
    pub(crate) held_with: String,
}

/// What the caller knows of the peers, for the takes of fences held with
/// their Leases.
pub(crate) trait Knowledge: Sync {
    /// Whether a fence held with `(peer_lease, epoch)` by `holder` holds at
    /// `now`, if known without asking the API server.
    fn holds(&self, peer_lease: &str, epoch: &str, holder: &str, now: Timestamp) -> Option<Hold>;

    /// The heir of the fence being taken that `peer` (a peer Lease as just
    /// read) names for its ended `epoch`, if it names heirs.
    fn heir_in(&self, peer: &Lease, epoch: &str) -> Option<Heir>;
}

/// The knowledge of whoever knows nothing: every peer Lease is read.
pub(crate) type KnownPeers<'a> = &'a dyn Knowledge;

/// Knows nothing: every peer Lease is read, and no heirs are followed.
pub(crate) struct NothingKnown;

impl Knowledge for NothingKnown {
    fn holds(&self, _: &str, _: &str, _: &str, _: Timestamp) -> Option<Hold> {
        None
    }

    fn heir_in(&self, _: &Lease, _: &str) -> Option<Heir> {
        None
    }
}

/// Who holds a fence, as a take finds it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Holder {
    /// Another replica, live (or not known to have ended).
    Other(String),
    /// Nobody: its hold ended. `plain` when it ended naming no heirs
    /// (every fence of that epoch is free, worth remembering).
    Free { plain: bool },
    /// This replica, as the heir of an ended epoch, in its current one:
    /// the take writes the fence as its own.
    Mine,
}

/// Who holds `lease`, named `holder` in it, for `me` holding with
/// `held_with`: by the Lease's own renewal, or for a fence held with a peer
/// Lease, while that peer Lease names `holder` in the epoch the fence was
/// taken in, or the heir that the epoch's end named, while the heir's epoch
/// lives (or its heir, if its own end named one). The peer Lease is read
/// now unless `known` answers: a peer that has just joined may not be
/// known yet.
///
/// A peer Lease that has lapsed in that epoch is ended here before the
/// fence counts as free (`end_epoch`): its replica stopped working when it
/// could no longer renew, but would resume the same epoch, fences and all,
/// with its next renewal if nobody had ended it.
pub(super) async fn holds(
    api: &Api<Lease>,
    lease: &Lease,
    holder: &str,
    held_with: Option<&str>,
    now: Timestamp,
    known: KnownPeers<'_>,
) -> Result<Holder, kube::Error> {
    let Some(fence_held_with) = held_with_of(lease) else {
        return Ok(match &lease.spec {
            Some(spec) if !expired(spec, now) => Holder::Other(holder.to_string()),
            _ => Holder::Free { plain: false },
        });
    };
    let Some((peer_lease, epoch)) = fence_held_with.rsplit_once('/') else {
        return Ok(Holder::Free { plain: false });
    };
    let hold = match known.holds(peer_lease, epoch, holder, now) {
        Some(hold) => hold,
        None => read_hold(api, peer_lease, epoch, holder, now, known).await?,
    };
    Ok(match hold {
        Hold::Live => Holder::Other(holder.to_string()),
        Hold::Ended => Holder::Free { plain: true },
        Hold::Inherited(heir) => follow(heir, held_with, now, known),
    })
}

/// Who holds a fence that went to `heir`: this replica if `heir` is it
/// (holding with `held_with`), the heir while its epoch is not known to
/// have ended, the heir's own heir if its end named one, and so on.
pub(super) fn follow(
    mut heir: Heir,
    held_with: Option<&str>,
    now: Timestamp,
    known: KnownPeers<'_>,
) -> Holder {
    // A record never names the epoch it ends, so this ends; the bound is
    // for records written by something else.
    for _ in 0..MAX_HEIRS_FOLLOWED {
        if held_with == Some(heir.held_with.as_str()) {
            return Holder::Mine;
        }
        let Some((peer_lease, epoch)) = heir.held_with.rsplit_once('/') else {
            return Holder::Free { plain: false };
        };
        match known.holds(peer_lease, epoch, &heir.id, now) {
            // Not known to have ended: it may be working on it.
            Some(Hold::Live) | None => return Holder::Other(heir.id),
            Some(Hold::Ended) => return Holder::Free { plain: false },
            Some(Hold::Inherited(next)) => heir = next,
        }
    }
    Holder::Other(heir.id)
}

/// How many heirs in a row a take follows (each an epoch that ended before
/// its heir wrote the fence as its own).
pub(crate) const MAX_HEIRS_FOLLOWED: usize = 8;

/// Whether `holder`'s hold on `peer_lease` in `epoch` lasts, read from the
/// API server; a lapsed one is ended first.
pub(super) async fn read_hold(
    api: &Api<Lease>,
    peer_lease: &str,
    epoch: &str,
    holder: &str,
    now: Timestamp,
    known: KnownPeers<'_>,
) -> Result<Hold, kube::Error> {
    let Some(peer) = api.get_opt(peer_lease).await? else {
        // Deleted: its replica left, or starts a new epoch.
        return Ok(Hold::Ended);
    };
    let ended = |peer: &Lease| {
        known
            .heir_in(peer, epoch)
            .map_or(Hold::Ended, Hold::Inherited)
    };
    if !in_epoch(&peer, holder, epoch) {
        return Ok(ended(&peer));
    }
    if peer.spec.as_ref().is_some_and(|spec| !expired(spec, now)) {
        return Ok(Hold::Live);
    }
    let end = end_epoch(api, peer, holder, epoch, None).await?;
    if matches!(end, EpochEnd::Ended(_)) {
        tracing::info!(lease = %peer_lease, %epoch, "ended a lapsed peer's epoch; its clusters can move");
    }
    Ok(match end {
        EpochEnd::Live => Hold::Live,
        EpochEnd::Ended(Some(peer)) => ended(&peer),
        EpochEnd::Ended(None) => Hold::Ended,
    })
}

/// Whether `peer` (a peer Lease) still names `holder` in `epoch`: neither
/// released, ended by another replica, nor in a newer epoch.
pub(crate) fn in_epoch(peer: &Lease, holder: &str, epoch: &str) -> bool {
    holder_of(peer) == Some(holder) && epoch_of(peer) == Some(epoch)
}

/// How an attempt to end a lapsed epoch came out.
#[derive(Debug)]
pub(crate) enum EpochEnd {
    /// Renewed since it was read: it goes on.
    Live,
    /// Ended, by this write or another's: the peer Lease as it is now
    /// (`None` once deleted), which names the heirs if the end did.
    Ended(Option<Box<Lease>>),
}

/// Ends the lapsed `peer` Lease's `epoch` by clearing its holder, written
/// over the copy read (so a renewal that came first wins); with `heirs`,
/// the value of the annotation naming who inherits its fences
/// ([`wire::HEIRS_ANNOTATION`]), set in the same write. Fences held with an
/// epoch are free (or their heirs') only once it has ended by a write: a
/// replica resumes its epoch only by writing over its own last write,
/// which this write makes fail.
pub(crate) async fn end_epoch(
    api: &Api<Lease>,
    mut peer: Lease,
    holder: &str,
    epoch: &str,
    heirs: Option<String>,
) -> Result<EpochEnd, kube::Error> {
    let Some(name) = peer.metadata.name.clone() else {
        return Ok(EpochEnd::Live);
    };
    if let Some(spec) = peer.spec.as_mut() {
        spec.holder_identity = None;
    }
    if let Some(heirs) = heirs {
        peer.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(wire::HEIRS_ANNOTATION.to_string(), heirs);
    }
    match api.replace(&name, &PostParams::default(), &peer).await {
        Ok(written) => Ok(EpochEnd::Ended(Some(Box::new(written)))),
        // Renewed, or ended by another replica, since it was read.
        Err(err) if is_conflict(&err) => Ok(match api.get_opt(&name).await? {
            Some(peer) if in_epoch(&peer, holder, epoch) => EpochEnd::Live,
            peer => EpochEnd::Ended(peer.map(Box::new)),
        }),
        Err(err) => Err(err),
    }
}

/// The epoch a peer Lease announces.
pub(crate) fn epoch_of(peer: &Lease) -> Option<&str> {
    peer.metadata
        .annotations
        .as_ref()?
        .get(wire::EPOCH_ANNOTATION)
        .map(String::as_str)
}
