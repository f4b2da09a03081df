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

mod holds;
mod taking;
#[cfg(test)]
pub(crate) mod tests;

pub(crate) use holds::*;
pub(crate) use taking::*;

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
