//! The Lease reads and writes sharding needs: take, renew and release a
//! fence, and publish a peer. Every write carries the resourceVersion that
//! was read, so two replicas racing for one Lease cannot both win.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::wire;

/// What an attempt to take a Lease found.
#[derive(Debug)]
pub(crate) enum Taken {
    /// This replica holds it now: the Lease as written.
    Yes(Box<Lease>),
    /// Someone else holds it and it has not expired; the holder if known.
    HeldBy(Option<String>),
}

/// Whether the Lease's holder has let it lapse (or never said for how long).
pub(crate) fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(MicroTime(renewed)), Some(seconds)) => {
            renewed.as_millisecond() + i64::from(seconds) * 1000 < now.as_millisecond()
        }
        _ => true,
    }
}

/// How long until the Lease lapses, if it is live now.
#[cfg(feature = "sharding")]
pub(crate) fn lapses_in(spec: &LeaseSpec, now: Timestamp) -> Option<Duration> {
    let (Some(MicroTime(renewed)), Some(seconds)) = (&spec.renew_time, spec.lease_duration_seconds)
    else {
        return None;
    };
    let left = renewed.as_millisecond() + i64::from(seconds) * 1000 - now.as_millisecond();
    u64::try_from(left).ok().map(Duration::from_millis)
}

/// The Lease's holder, if it has a live one.
pub(crate) fn live_holder(lease: &Lease, now: Timestamp) -> Option<&str> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    (!expired(spec, now)).then_some(holder)
}

/// Lease durations are whole seconds; round up so a Lease never claims less
/// than was asked for.
pub(crate) fn seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_millis().div_ceil(1000))
        .unwrap_or(i32::MAX)
        .max(1)
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// Who is thought to hold a fence, in an epoch known to have ended: a take
/// writes over it in one request (a JSON patch whose `test` operations
/// make sure the fence still says so) instead of reading it first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EndedHold {
    /// The holder the fence is thought to name.
    pub(crate) holder: String,
    /// `<its peer Lease>/<its epoch>`, which has ended.
    pub(crate) held_with: String,
}

/// Who a fence held with the peer Lease goes to straight from its holder,
/// instead of being cleared for its next owner to take: one write in all,
/// where a release and a take are two or three, and no moment in which
/// nobody holds it.
#[cfg_attr(not(feature = "sharding"), allow(dead_code))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Next {
    /// The next holder.
    pub(crate) holder: String,
    /// `<its peer Lease>/<its epoch>`, live when it was read.
    pub(crate) held_with: String,
    /// The fence's duration, as its holder would write it.
    pub(crate) duration: Duration,
    /// The cluster the fence is for.
    pub(crate) cluster: String,
}

/// The label value for fences held with `held_with` (`<peer Lease>/<epoch>`)
/// ([`wire::HELD_WITH_LABEL`], [`wire::HANDED_TO_LABEL`]): label values are short,
/// peer IDs need not be.
pub(crate) fn label_for(held_with: &str) -> String {
    format!("{:016x}", super::names::fnv1a(held_with))
}

/// What is known of a peer Lease's epoch, for the fences held with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Live: its fences hold.
    Live,
    /// Ended, naming no heirs: its fences are free.
    Ended,
    /// Ended, naming heirs: the fence in question went to this one.
    Inherited(Heir),
}

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
enum Holder {
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
async fn holds(
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
fn follow(
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
async fn read_hold(
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

/// Takes the Lease `name` for `me` if it is free, lapsed or already ours.
/// With `held_with` (`<this replica's peer Lease>/<its epoch>`) the Lease
/// holds for as long as that peer Lease lives in that epoch, and is not
/// renewed itself. Whether another holder's peer Lease holds is asked of
/// `known` first.
///
/// `last`, what this replica last wrote to the Lease (a fence it held
/// before), spares the read: still held in this replica's current epoch
/// (its work stopped while the peer Lease went unrenewed, and the renewal
/// that came through found the epoch not ended), it is taken as it is,
/// without a request; held in an epoch that ended, it is written over
/// once. Its resourceVersion guards the write; a Lease changed since is
/// read.
pub(crate) async fn take(
    taking: &Taking<'_>,
    known: KnownPeers<'_>,
    last: Option<Lease>,
) -> Result<Taken, kube::Error> {
    let prior = Prior { last, ended: None };
    take_guessing(taking, known, prior)
        .await
        .map(|(taken, _)| taken)
}

/// Who takes which fence, and how: what every take is given.
#[derive(Clone, Copy)]
pub(crate) struct Taking<'a> {
    /// The Leases of the fence namespace.
    pub(crate) api: &'a Api<Lease>,
    /// The fence Lease's name.
    pub(crate) name: &'a str,
    /// The replica taking it.
    pub(crate) me: &'a str,
    /// The fence's duration, as written.
    pub(crate) duration: Duration,
    /// `<peer Lease>/<epoch>` for a fence held with the peer Lease; `None`
    /// for a fence renewed itself.
    pub(crate) held_with: Option<&'a str>,
}

/// What a replica knows of a fence before taking it, each of which spares
/// the read: what it last wrote to it, and who holds it in an epoch that
/// ended.
#[derive(Debug, Default)]
pub(crate) struct Prior {
    /// What this replica last wrote to the fence (see [`take`]).
    pub(crate) last: Option<Lease>,
    /// A guess at who holds it in an epoch that ended: if it is right, one
    /// request takes the fence.
    pub(crate) ended: Option<EndedHold>,
}

/// [`take`], with everything `prior` knows; and the hold in an ended epoch
/// that it found and wrote over after reading the fence, if it did: the
/// caller can guess the next fence of that epoch right (a restarted
/// replica knows its earlier epoch from the first of its fences it reads).
///
/// Long on purpose: the three ways to a fence in the order tried (the guessed
/// hold of an ended epoch, this replica's own last write, a read and a write),
/// each falling through to the next with the same arguments.
pub(crate) async fn take_guessing(
    taking: &Taking<'_>,
    known: KnownPeers<'_>,
    prior: Prior,
) -> Result<(Taken, Option<EndedHold>), kube::Error> {
    let Taking {
        api,
        name,
        me,
        duration,
        held_with,
    } = *taking;
    let Prior { last, ended } = prior;
    let now = Timestamp::now();
    if last.is_none()
        && let (Some(held_with), Some(ended)) = (held_with, &ended)
    {
        match take_over_ended(taking, held_with, ended, now).await {
            Ok(written) => return Ok((Taken::Yes(Box::new(written)), None)),
            // Not as thought (another holder, released, gone): read it. Or
            // not allowed (a Role without `patch` on Leases): read it too.
            Err(kube::Error::Api(status)) if matches!(status.code, 403 | 404 | 422) => {}
            Err(err) => return Err(err),
        }
    }
    if let Some(mut lease) = last.filter(|lease| holder_of(lease) == Some(me)) {
        if held_with.is_some() && held_with_of(&lease) == held_with {
            // Held in the epoch this replica still stands in: nobody could
            // take it, since that takes ending the epoch first.
            return Ok((Taken::Yes(Box::new(lease)), None));
        }
        prepare_taken(&mut lease, me, duration, held_with, now);
        match api.replace(name, &PostParams::default(), &lease).await {
            Ok(written) => return Ok((Taken::Yes(Box::new(written)), None)),
            // Changed since this replica wrote it: read it below.
            Err(err) if is_conflict(&err) => {}
            Err(err) => return Err(err),
        }
    }
    let annotations = held_with.map(|peer_lease| {
        BTreeMap::from([(
            wire::HELD_WITH_ANNOTATION.to_string(),
            peer_lease.to_string(),
        )])
    });
    let labels = held_with.map(|held_with| {
        BTreeMap::from([(wire::HELD_WITH_LABEL.to_string(), label_for(held_with))])
    });
    let Some(mut lease) = api.get_opt(name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                annotations,
                labels,
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(me.to_string()),
                lease_duration_seconds: Some(seconds(duration)),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(written) => Ok((Taken::Yes(Box::new(written)), None)),
            // Another replica created it first.
            Err(err) if is_conflict(&err) => Ok((Taken::HeldBy(None), None)),
            Err(err) => Err(err),
        };
    };
    if held_with.is_some() && holder_of(&lease) == Some(me) && held_with_of(&lease) == held_with {
        // Handed to this replica in its epoch: nothing to write.
        return Ok((Taken::Yes(Box::new(lease)), None));
    }
    // Held by another, or by this replica in an epoch of its that ended
    // (whose heirs may hold it now).
    let mut plain_end = true;
    let mut inherited_from = None;
    if let Some(holder) = holder_of(&lease)
        && (holder != me || held_with_of(&lease) != held_with)
    {
        match holds(api, &lease, holder, held_with, now, known).await? {
            Holder::Other(other) => return Ok((Taken::HeldBy(Some(other)), None)),
            Holder::Free { plain } => plain_end = plain,
            Holder::Mine => {
                plain_end = false;
                inherited_from = Some(holder.to_string());
            }
        }
    }
    // Held in an epoch that has ended naming no heirs: another's, or this
    // replica's own earlier one (it holds with its current epoch only).
    let found = match (holder_of(&lease), held_with_of(&lease)) {
        (Some(holder), Some(before)) if plain_end && held_with.is_some_and(|now| now != before) => {
            Some(EndedHold {
                holder: holder.to_string(),
                held_with: before.to_string(),
            })
        }
        _ => None,
    };
    prepare_taken(&mut lease, me, duration, held_with, now);
    if let Some(from) = inherited_from {
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(wire::INHERITED_FROM_ANNOTATION.to_string(), from);
    }
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(written) => Ok((Taken::Yes(Box::new(written)), found)),
        // Changed since it was read: someone else got there first.
        Err(err) if is_conflict(&err) => Ok((Taken::HeldBy(None), None)),
        Err(err) => Err(err),
    }
}

/// Takes the fence `name` for `me`, held with `held_with`, if it still
/// names `ended`'s holder and epoch (which has ended): one JSON patch whose
/// `test` operations the API server checks against the stored Lease when
/// it applies the rest. Its `leaseTransitions` stays as it was (a patch
/// cannot add one to it); nothing reads it.
async fn take_over_ended(
    taking: &Taking<'_>,
    held_with: &str,
    ended: &EndedHold,
    now: Timestamp,
) -> Result<Lease, kube::Error> {
    let Taking {
        api,
        name,
        me,
        duration,
        ..
    } = *taking;
    let annotation = format!(
        "/metadata/annotations/{}",
        wire::HELD_WITH_ANNOTATION
            .replace('~', "~0")
            .replace('/', "~1")
    );
    let now = serde_json::to_value(MicroTime(now)).map_err(kube::Error::SerdeError)?;
    let mut labels = serde_json::Map::new();
    labels.insert(
        wire::HELD_WITH_LABEL.to_string(),
        label_for(held_with).into(),
    );
    let operations = serde_json::json!([
        {"op": "test", "path": "/spec/holderIdentity", "value": ended.holder},
        {"op": "test", "path": annotation, "value": ended.held_with},
        {"op": "replace", "path": "/spec/holderIdentity", "value": me},
        {"op": "replace", "path": annotation, "value": held_with},
        // The whole map: `add` needs its parent, and a handed-to label
        // left from a hand-over is stale now.
        {"op": "add", "path": "/metadata/labels", "value": labels},
        {"op": "add", "path": "/spec/acquireTime", "value": now},
        {"op": "add", "path": "/spec/renewTime", "value": now},
        {"op": "add", "path": "/spec/leaseDurationSeconds", "value": seconds(duration)},
    ]);
    let patch = serde_json::from_value(operations).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
}

/// The peer Lease and epoch a fence is held with, if it is.
pub(crate) fn held_with_of(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(wire::HELD_WITH_ANNOTATION)
        .map(String::as_str)
}

/// The Lease's holder, if it names one.
pub(crate) fn holder_of(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

/// `lease` as `me` takes it: held with `held_with` (or renewed), acquired
/// now unless `me` held it already, renewed now.
fn prepare_taken(
    lease: &mut Lease,
    me: &str,
    duration: Duration,
    held_with: Option<&str>,
    now: Timestamp,
) {
    let holder = holder_of(lease).map(str::to_string);
    // Held with this peer Lease now, or renewed: the annotation says which,
    // and the label finds it by epoch.
    let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
    // A take is no hand-over: the replica the label names is not woken.
    labels.remove(wire::HANDED_TO_LABEL);
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.remove(wire::HANDED_BY_ANNOTATION);
    annotations.remove(wire::INHERITED_FROM_ANNOTATION);
    match held_with {
        Some(held_with) => {
            annotations.insert(
                wire::HELD_WITH_ANNOTATION.to_string(),
                held_with.to_string(),
            );
            labels.insert(wire::HELD_WITH_LABEL.to_string(), label_for(held_with));
        }
        None => {
            annotations.remove(wire::HELD_WITH_ANNOTATION);
            labels.remove(wire::HELD_WITH_LABEL);
        }
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if holder.as_deref() != Some(me) || spec.acquire_time.is_none() {
        spec.acquire_time = Some(MicroTime(now));
    }
    if holder.as_deref().is_some_and(|h| h != me) {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.holder_identity = Some(me.to_string());
    spec.lease_duration_seconds = Some(seconds(duration));
    spec.renew_time = Some(MicroTime(now));
}

/// Renews `me`'s hold on `name`; `Ok(false)` when the Lease is gone or has
/// another holder.
///
/// `last` is what the previous renewal wrote: the renewal writes over it
/// without reading first, one request instead of two (a fleet of 10,000
/// fences renewed every 10 s is 1,000 requests a second rather than 2,000).
/// Its resourceVersion still guards the write, so a Lease changed since
/// is read and checked before a second try. `last` then holds what this
/// renewal wrote, or nothing after a failure.
pub(crate) async fn renew(
    api: &Api<Lease>,
    name: &str,
    me: &str,
    duration: Duration,
    last: &mut Option<Lease>,
) -> Result<bool, kube::Error> {
    let mut written_over = last.take();
    loop {
        let read = written_over.is_none();
        let mut lease = match written_over.take() {
            Some(lease) => lease,
            None => match api.get_opt(name).await? {
                Some(lease) => lease,
                None => return Ok(false),
            },
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(me) {
            return Ok(false);
        }
        spec.lease_duration_seconds = Some(seconds(duration));
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match api.replace(name, &PostParams::default(), &lease).await {
            Ok(written) => {
                *last = Some(written);
                return Ok(true);
            }
            // Changed since our last write: read it, and renew if it is
            // still ours.
            Err(err) if is_conflict(&err) && !read => {}
            Err(err) if is_conflict(&err) => return Ok(false),
            Err(err) => return Err(err),
        }
    }
}

/// Clears the holder of `name` if it is still `me`, so the next owner need
/// not wait for it to expire; or, with `next`, writes it as held by that
/// replica (see [`Next`]).
///
/// `last`, what this replica last wrote to the Lease, is written over
/// without reading first (a hand-over of thousands of clusters is that
/// many requests fewer); its resourceVersion guards the write, so a Lease
/// changed since is read and checked before a second try.
pub(crate) async fn release(
    api: &Api<Lease>,
    name: &str,
    me: &str,
    last: Option<Lease>,
    next: Option<&Next>,
) -> Result<(), kube::Error> {
    let mut written_over = last;
    loop {
        let read = written_over.is_none();
        let mut lease = match written_over.take() {
            Some(lease) => lease,
            None => match api.get_opt(name).await? {
                Some(lease) => lease,
                None => return Ok(()),
            },
        };
        // What this replica last wrote, or a fence it inherited as listed
        // (naming the holder whose epoch ended): the write is guarded by
        // its resourceVersion. A Lease read now must name this replica.
        if lease.spec.is_none() || (read && holder_of(&lease) != Some(me)) {
            return Ok(());
        }
        match next {
            Some(next) => {
                prepare_taken(
                    &mut lease,
                    &next.holder,
                    next.duration,
                    Some(&next.held_with),
                    Timestamp::now(),
                );
                lease
                    .metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(
                        wire::HANDED_TO_LABEL.to_string(),
                        label_for(&next.held_with),
                    );
                let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
                annotations.insert(wire::CLUSTER_ANNOTATION.to_string(), next.cluster.clone());
                annotations.insert(wire::HANDED_BY_ANNOTATION.to_string(), me.to_string());
            }
            None => {
                if let Some(labels) = lease.metadata.labels.as_mut() {
                    labels.remove(wire::HANDED_TO_LABEL);
                }
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = None;
                }
            }
        }
        match api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => return Ok(()),
            // Changed since our write: read it, and clear it if still ours.
            Err(err) if is_conflict(&err) && !read => {}
            // Taken over meanwhile: nothing of ours left to clear.
            Err(err) if is_conflict(&err) => return Ok(()),
            Err(err) => return Err(err),
        }
    }
}

/// Writes `inherited`, a fence as listed that this replica inherited from
/// an ended epoch (see `sharding::heirs`), as held by `me` with
/// `held_with`, naming whom it came from: one write, guarded by what was
/// listed. `None` when the fence changed since (someone else wrote it).
#[cfg(feature = "sharding")]
pub(crate) async fn inherit(
    api: &Api<Lease>,
    me: &str,
    duration: Duration,
    held_with: &str,
    mut inherited: Lease,
) -> Result<Option<Lease>, kube::Error> {
    let Some(name) = inherited.metadata.name.clone() else {
        return Ok(None);
    };
    let from = holder_of(&inherited).unwrap_or_default().to_string();
    prepare_taken(
        &mut inherited,
        me,
        duration,
        Some(held_with),
        Timestamp::now(),
    );
    inherited
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(wire::INHERITED_FROM_ANNOTATION.to_string(), from);
    match api.replace(&name, &PostParams::default(), &inherited).await {
        Ok(written) => Ok(Some(written)),
        // Written since: by a take of this replica's (it found itself the
        // heir), or by someone else.
        Err(err) if is_conflict(&err) => Ok(api
            .get_opt(&name)
            .await?
            .filter(|read| holder_of(read) == Some(me) && held_with_of(read) == Some(held_with))),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn spec(renewed_ms_ago: i64, seconds: Option<i32>) -> (LeaseSpec, Timestamp) {
        let now = Timestamp::from_millisecond(1_000_000_000).expect("time");
        let renewed = Timestamp::from_millisecond(1_000_000_000 - renewed_ms_ago).expect("time");
        (
            LeaseSpec {
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: seconds,
                ..LeaseSpec::default()
            },
            now,
        )
    }

    #[test]
    fn expiry_is_renew_time_plus_duration() {
        let (fresh, now) = spec(19_000, Some(20));
        assert!(!expired(&fresh, now));
        let (stale, now) = spec(21_000, Some(20));
        assert!(expired(&stale, now));
        let (no_duration, now) = spec(0, None);
        assert!(expired(&no_duration, now));
        assert!(expired(&LeaseSpec::default(), now));
    }

    #[cfg(feature = "sharding")]
    #[test]
    fn a_live_lease_lapses_at_renew_time_plus_duration() {
        let (fresh, now) = spec(19_000, Some(20));
        assert_eq!(lapses_in(&fresh, now), Some(Duration::from_secs(1)));
        let (stale, now) = spec(21_000, Some(20));
        assert_eq!(lapses_in(&stale, now), None);
        let (no_duration, now) = spec(0, None);
        assert_eq!(lapses_in(&no_duration, now), None);
    }

    /// Lease reads (GET, not LIST) the API server has answered so far, from
    /// its metrics.
    pub(crate) async fn lease_reads(client: &kube::Client) -> f64 {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("request");
        let metrics = client.request_text(request).await.expect("metrics");
        metrics
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
            .filter(|l| l.contains("resource=\"leases\"") && l.contains("verb=\"GET\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_writes_over_the_last_one_without_reading_and_still_sees_changes() {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let duration = Duration::from_secs(20);
        assert!(matches!(
            take(
                &Taking {
                    api: &api,
                    name: "fence",
                    me: "me",
                    duration,
                    held_with: None
                },
                &NothingKnown,
                None
            )
            .await
            .expect("take"),
            Taken::Yes(_)
        ));
        let mut last = None;
        assert!(
            renew(&api, "fence", "me", duration, &mut last)
                .await
                .expect("renew")
        );
        let before = lease_reads(&client).await;
        for _ in 0..5 {
            assert!(
                renew(&api, "fence", "me", duration, &mut last)
                    .await
                    .expect("renew")
            );
        }
        assert_eq!(
            lease_reads(&client).await,
            before,
            "renewals after the first read nothing"
        );

        // Someone else changed the Lease but it is still ours: the stale
        // write conflicts, and the renewal reads and succeeds.
        let mut touched = api.get("fence").await.expect("get");
        touched
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("touched".to_string(), "yes".to_string());
        api.replace("fence", &PostParams::default(), &touched)
            .await
            .expect("touch");
        assert!(
            renew(&api, "fence", "me", duration, &mut last)
                .await
                .expect("renew")
        );

        // Taken by another: the renewal says so.
        let mut taken = api.get("fence").await.expect("get");
        taken.spec.as_mut().expect("spec").holder_identity = Some("other".to_string());
        api.replace("fence", &PostParams::default(), &taken)
            .await
            .expect("take over");
        assert!(
            !renew(&api, "fence", "me", duration, &mut last)
                .await
                .expect("renew")
        );
        assert!(
            last.is_none(),
            "nothing to write over after a failed renewal"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_writes_over_the_take_without_reading_and_still_sees_changes() {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let duration = Duration::from_secs(20);
        let holder = |lease: Lease| lease.spec.and_then(|spec| spec.holder_identity);
        let take_one = |name: &'static str| {
            let api = api.clone();
            async move {
                match take(
                    &Taking {
                        api: &api,
                        name,
                        me: "me",
                        duration,
                        held_with: None,
                    },
                    &NothingKnown,
                    None,
                )
                .await
                .expect("take")
                {
                    Taken::Yes(written) => *written,
                    Taken::HeldBy(other) => panic!("{name} held by {other:?}"),
                }
            }
        };

        // Nothing changed since the take: one write, no read.
        let written = take_one("quiet").await;
        let before = lease_reads(&client).await;
        release(&api, "quiet", "me", Some(written), None)
            .await
            .expect("release");
        assert_eq!(lease_reads(&client).await, before, "the release read");
        assert_eq!(holder(api.get("quiet").await.expect("get")), None);

        // Changed since, still ours: the stale write conflicts, and the
        // release reads and clears it.
        let written = take_one("touched").await;
        let mut touched = api.get("touched").await.expect("get");
        touched
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("touched".to_string(), "yes".to_string());
        api.replace("touched", &PostParams::default(), &touched)
            .await
            .expect("touch");
        release(&api, "touched", "me", Some(written), None)
            .await
            .expect("release");
        assert_eq!(holder(api.get("touched").await.expect("get")), None);

        // Taken by another since: left alone.
        let written = take_one("taken").await;
        let mut taken = api.get("taken").await.expect("get");
        taken.spec.as_mut().expect("spec").holder_identity = Some("other".to_string());
        api.replace("taken", &PostParams::default(), &taken)
            .await
            .expect("take over");
        release(&api, "taken", "me", Some(written), None)
            .await
            .expect("release");
        assert_eq!(
            holder(api.get("taken").await.expect("get")).as_deref(),
            Some("other")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_is_taken_again_over_what_this_replica_last_wrote() {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let duration = Duration::from_secs(20);
        let take_with = |name: &'static str, epoch: &'static str, last: Option<Lease>| {
            let api = api.clone();
            async move {
                take(
                    &Taking {
                        api: &api,
                        name,
                        me: "me",
                        duration,
                        held_with: Some(epoch),
                    },
                    &NothingKnown,
                    last,
                )
                .await
                .expect("take")
            }
        };
        let held_with = |lease: &Lease| {
            lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(wire::HELD_WITH_ANNOTATION).cloned())
        };
        let Taken::Yes(first) = take_with("quiet", "peer/e1", None).await else {
            panic!("not taken");
        };

        // Unchanged since: one write over it, no read, in the new epoch.
        let before = lease_reads(&client).await;
        let Taken::Yes(again) = take_with("quiet", "peer/e2", Some(*first)).await else {
            panic!("not taken again");
        };
        assert_eq!(lease_reads(&client).await, before, "the take read");
        assert_eq!(held_with(&again).as_deref(), Some("peer/e2"));

        // Taken by another since (its epoch ended, say): the write over the
        // stale copy conflicts, the Lease is read, and it is not ours.
        let mut taken = api.get("quiet").await.expect("get");
        taken.spec.as_mut().expect("spec").holder_identity = Some("other".to_string());
        taken
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .remove(wire::HELD_WITH_ANNOTATION);
        api.replace("quiet", &PostParams::default(), &taken)
            .await
            .expect("take over");
        let answer = take_with("quiet", "peer/e3", Some(*again)).await;
        assert!(
            matches!(answer, Taken::HeldBy(Some(ref other)) if other == "other"),
            "{answer:?}"
        );
    }

    /// A peer Lease `name` held by `holder` in `epoch`, renewed
    /// `renewed_secs_ago` with a 30 s duration.
    #[cfg(feature = "sharding")]
    pub(crate) fn peer_lease(
        name: &str,
        holder: &str,
        epoch: &str,
        renewed_secs_ago: i64,
    ) -> Lease {
        let renewed = Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(
                renewed_secs_ago,
            ))
            .expect("time");
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
                holder_identity: Some(holder.to_string()),
                lease_duration_seconds: Some(30),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[cfg(feature = "sharding")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_held_with_a_lapsed_peer_lease_is_taken_only_once_that_epoch_is_ended() {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let params = PostParams::default();
        let duration = Duration::from_secs(20);
        let holder = |lease: &Lease| holder_of(lease).map(str::to_string);
        // Two fences of replica `p`, held with its peer Lease in epoch e1.
        for fence in ["one", "two"] {
            let taken = take(
                &Taking {
                    api: &api,
                    name: fence,
                    me: "p",
                    duration,
                    held_with: Some("peer-p/e1"),
                },
                &NothingKnown,
                None,
            )
            .await
            .expect("take");
            assert!(matches!(taken, Taken::Yes(_)));
        }

        // Live: the fence is busy, and the peer Lease is left alone.
        api.create(&params, &peer_lease("peer-p", "p", "e1", 5))
            .await
            .expect("peer lease");
        let answer = take(
            &Taking {
                api: &api,
                name: "one",
                me: "me",
                duration,
                held_with: Some("peer-me/e7"),
            },
            &NothingKnown,
            None,
        )
        .await
        .expect("take");
        assert!(
            matches!(answer, Taken::HeldBy(Some(ref h)) if h == "p"),
            "{answer:?}"
        );

        // Lapsed: `p` may still renew it in e1, so the take first ends e1
        // by clearing the peer Lease's holder, then takes the fence.
        let mut lapsed = api.get("peer-p").await.expect("get");
        let lapsed_at = peer_lease("peer-p", "p", "e1", 60);
        lapsed.spec = lapsed_at.spec;
        api.replace("peer-p", &params, &lapsed)
            .await
            .expect("lapse");
        let answer = take(
            &Taking {
                api: &api,
                name: "one",
                me: "me",
                duration,
                held_with: Some("peer-me/e7"),
            },
            &NothingKnown,
            None,
        )
        .await
        .expect("take");
        assert!(matches!(answer, Taken::Yes(_)), "{answer:?}");
        let peer = api.get("peer-p").await.expect("get");
        assert_eq!(holder(&peer), None, "the lapsed epoch was not ended");
        // Ended: the other fence is free without another write to it.
        let version = peer.metadata.resource_version.clone();
        let answer = take(
            &Taking {
                api: &api,
                name: "two",
                me: "me",
                duration,
                held_with: Some("peer-me/e7"),
            },
            &NothingKnown,
            None,
        )
        .await
        .expect("take");
        assert!(matches!(answer, Taken::Yes(_)), "{answer:?}");
        let peer = api.get("peer-p").await.expect("get");
        assert_eq!(peer.metadata.resource_version, version);

        // A renewal that came first wins over the end: the take waits.
        api.create(&params, &peer_lease("peer-q", "q", "f1", 60))
            .await
            .expect("peer lease");
        take(
            &Taking {
                api: &api,
                name: "three",
                me: "q",
                duration,
                held_with: Some("peer-q/f1"),
            },
            &NothingKnown,
            None,
        )
        .await
        .expect("take");
        let read = api.get("three").await.expect("fence");
        // What a replica read before the renewal: lapsed.
        let stale = api.get("peer-q").await.expect("get");
        let mut renewed = stale.clone();
        renewed.spec = peer_lease("peer-q", "q", "f1", 0).spec;
        api.replace("peer-q", &params, &renewed)
            .await
            .expect("renew");
        assert!(
            matches!(
                end_epoch(&api, stale, "q", "f1", None).await.expect("end"),
                EpochEnd::Live
            ),
            "an epoch renewed since it was read was ended"
        );
        assert_eq!(
            holder(&api.get("peer-q").await.expect("get")).as_deref(),
            Some("q")
        );
        assert_eq!(
            holds(&api, &read, "q", None, Timestamp::now(), &NothingKnown)
                .await
                .expect("holds"),
            Holder::Other("q".to_string())
        );
    }

    #[cfg(feature = "sharding")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_still_held_in_the_current_epoch_is_taken_back_without_a_request() {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let duration = Duration::from_secs(20);
        let Taken::Yes(written) = take(
            &Taking {
                api: &api,
                name: "fence",
                me: "me",
                duration,
                held_with: Some("peer-me/e1"),
            },
            &NothingKnown,
            None,
        )
        .await
        .expect("take") else {
            panic!("not taken");
        };
        let version = written.metadata.resource_version.clone();
        let before = lease_reads(&client).await;
        let Taken::Yes(again) = take(
            &Taking {
                api: &api,
                name: "fence",
                me: "me",
                duration,
                held_with: Some("peer-me/e1"),
            },
            &NothingKnown,
            Some(*written),
        )
        .await
        .expect("take") else {
            panic!("not taken back");
        };
        assert_eq!(lease_reads(&client).await, before, "the take read");
        assert_eq!(again.metadata.resource_version, version);
        let stored = api.get("fence").await.expect("get");
        assert_eq!(
            stored.metadata.resource_version, version,
            "the take wrote the fence"
        );
    }

    #[cfg(feature = "sharding")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_handed_to_a_replica_in_its_epoch_is_taken_as_it_is() {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let duration = Duration::from_secs(20);
        let Taken::Yes(written) = take(
            &Taking {
                api: &api,
                name: "fence",
                me: "before",
                duration,
                held_with: Some("peer-before/b1"),
            },
            &NothingKnown,
            None,
        )
        .await
        .expect("take") else {
            panic!("not taken");
        };
        let next = Next {
            holder: "me".to_string(),
            held_with: "peer-me/e1".to_string(),
            duration,
            cluster: "c".to_string(),
        };
        release(&api, "fence", "before", Some(*written), Some(&next))
            .await
            .expect("hand over");
        let handed = api.get("fence").await.expect("get");
        assert_eq!(holder_of(&handed), Some("me"));
        assert_eq!(held_with_of(&handed), Some("peer-me/e1"));
        assert_eq!(
            handed
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(wire::HANDED_TO_LABEL))
                .map(String::as_str),
            Some(label_for("peer-me/e1").as_str())
        );
        // Taken by "me" without knowing it was handed: read, not written.
        let take_in = |held_with: &'static str| {
            let api = api.clone();
            async move {
                let taking = Taking {
                    api: &api,
                    name: "fence",
                    me: "me",
                    duration,
                    held_with: Some(held_with),
                };
                take(&taking, &NothingKnown, None).await
            }
        };
        assert!(matches!(take_in("peer-me/e1").await, Ok(Taken::Yes(_))));
        let stored = api.get("fence").await.expect("get");
        assert_eq!(
            stored.metadata.resource_version, handed.metadata.resource_version,
            "the take wrote a fence handed to it"
        );
        // In a later epoch of "me" (it restarted) it is written, the label
        // goes, and the take tells of the earlier epoch it found.
        let (taken, found) = take_guessing(
            &Taking {
                api: &api,
                name: "fence",
                me: "me",
                duration,
                held_with: Some("peer-me/e2"),
            },
            &NothingKnown,
            Prior::default(),
        )
        .await
        .expect("take");
        assert!(matches!(taken, Taken::Yes(_)));
        assert_eq!(
            found,
            Some(EndedHold {
                holder: "me".to_string(),
                held_with: "peer-me/e1".to_string(),
            })
        );
        let stored = api.get("fence").await.expect("get");
        assert_eq!(held_with_of(&stored), Some("peer-me/e2"));
        assert!(
            stored
                .metadata
                .labels
                .as_ref()
                .is_none_or(|labels| !labels.contains_key(wire::HANDED_TO_LABEL)),
            "a take left the hand-over label"
        );
    }

    #[cfg(feature = "sharding")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_held_in_an_ended_epoch_is_taken_in_one_request_when_its_holder_is_known() {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let duration = Duration::from_secs(20);
        for (fence, holder, held_with) in [("one", "p", "peer-p/e1"), ("two", "q", "peer-q/f1")] {
            let taken = take(
                &Taking {
                    api: &api,
                    name: fence,
                    me: holder,
                    duration,
                    held_with: Some(held_with),
                },
                &NothingKnown,
                None,
            )
            .await
            .expect("take");
            assert!(matches!(taken, Taken::Yes(_)));
        }
        let ended = |holder: &str, held_with: &str| EndedHold {
            holder: holder.to_string(),
            held_with: held_with.to_string(),
        };
        let take_over = |fence: &'static str, guess: EndedHold| {
            let api = api.clone();
            async move {
                take_guessing(
                    &Taking {
                        api: &api,
                        name: fence,
                        me: "me",
                        duration,
                        held_with: Some("peer-me/m1"),
                    },
                    &NothingKnown,
                    Prior {
                        last: None,
                        ended: Some(guess),
                    },
                )
                .await
                .map(|(taken, _)| taken)
                .expect("take")
            }
        };
        let holder_of_fence = |fence: &'static str| {
            let api = api.clone();
            async move {
                let lease = api.get(fence).await.expect("fence");
                (
                    holder_of(&lease).map(str::to_string),
                    held_with_of(&lease).map(str::to_string),
                )
            }
        };

        // Guessed right: written over without reading it (or p's Lease).
        let before = lease_reads(&client).await;
        let answer = take_over("one", ended("p", "peer-p/e1")).await;
        assert!(matches!(answer, Taken::Yes(_)), "{answer:?}");
        assert_eq!(lease_reads(&client).await, before, "the take read");
        assert_eq!(
            holder_of_fence("one").await,
            (Some("me".to_string()), Some("peer-me/m1".to_string()))
        );

        // Guessed wrong (held by q, not p): the patch is refused, and the
        // fence is read and taken as any other (q's Lease does not exist).
        let answer = take_over("two", ended("p", "peer-p/e1")).await;
        assert!(matches!(answer, Taken::Yes(_)), "{answer:?}");
        assert!(
            lease_reads(&client).await > before,
            "a wrong guess was not checked"
        );
        assert_eq!(
            holder_of_fence("two").await,
            (Some("me".to_string()), Some("peer-me/m1".to_string()))
        );

        // No such fence: created.
        let answer = take_over("three", ended("p", "peer-p/e1")).await;
        assert!(matches!(answer, Taken::Yes(_)), "{answer:?}");

        // Right holder, but another epoch of it: refused, then read; p's
        // Lease is live in e2, so the fence is busy.
        api.create(&PostParams::default(), &peer_lease("peer-p", "p", "e2", 0))
            .await
            .expect("peer lease");
        let taken = take(
            &Taking {
                api: &api,
                name: "four",
                me: "p",
                duration,
                held_with: Some("peer-p/e2"),
            },
            &NothingKnown,
            None,
        )
        .await
        .expect("take");
        assert!(matches!(taken, Taken::Yes(_)));
        let answer = take_over("four", ended("p", "peer-p/e1")).await;
        assert!(
            matches!(answer, Taken::HeldBy(Some(ref h)) if h == "p"),
            "{answer:?}"
        );
        assert_eq!(
            holder_of_fence("four").await,
            (Some("p".to_string()), Some("peer-p/e2".to_string()))
        );
        // A Role without `patch` on Leases (written before it was needed):
        // refused, the take reads and updates as before.
        let verbs = ["get", "list", "watch", "create", "update"].map(String::from);
        cp.grant_service_account_in_namespace(
            "default",
            "default",
            "no-patch",
            vec![k8s_openapi::api::rbac::v1::PolicyRule {
                api_groups: Some(vec!["coordination.k8s.io".to_string()]),
                resources: Some(vec!["leases".to_string()]),
                verbs: verbs.to_vec(),
                ..Default::default()
            }],
        )
        .await
        .expect("grant");
        let kubeconfig = cp
            .service_account_kubeconfig("default", "no-patch", Duration::from_secs(600))
            .await
            .expect("kubeconfig");
        let restricted: Api<Lease> = Api::namespaced(
            multicluster_envtest::client_for(&kubeconfig)
                .await
                .expect("client"),
            "default",
        );
        let taken = take(
            &Taking {
                api: &api,
                name: "five",
                me: "p",
                duration,
                held_with: Some("peer-p/e1"),
            },
            &NothingKnown,
            None,
        )
        .await
        .expect("take");
        assert!(matches!(taken, Taken::Yes(_)));
        let answer = take_guessing(
            &Taking {
                api: &restricted,
                name: "five",
                me: "me",
                duration,
                held_with: Some("peer-me/m1"),
            },
            &NothingKnown,
            Prior {
                last: None,
                ended: Some(ended("p", "peer-p/e1")),
            },
        )
        .await
        .map(|(taken, _)| taken)
        .expect("take without patch");
        // p's Lease is live in e2, not e1: e1 ended, the fence is free.
        assert!(matches!(answer, Taken::Yes(_)), "{answer:?}");
        assert_eq!(
            holder_of_fence("five").await,
            (Some("me".to_string()), Some("peer-me/m1".to_string()))
        );
    }

    #[test]
    fn durations_round_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_millis(1500)), 2);
        assert_eq!(seconds(Duration::from_secs(20)), 20);
        assert_eq!(seconds(Duration::ZERO), 1);
    }
}
