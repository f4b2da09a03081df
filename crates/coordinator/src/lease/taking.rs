//! Taking a fence: from nobody, over a lapsed or ended holder, or as an
//! heir, every write guarded by the resourceVersion read.

use super::*;

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
pub(super) async fn take_over_ended(
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

/// What a fence held with `peer_lease` in `epoch` says it is held with
/// (its annotation; the label is a hash of it).
#[cfg(feature = "sharding")]
pub(crate) fn held_with(peer_lease: &str, epoch: &str) -> String {
    format!("{peer_lease}/{epoch}")
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
pub(super) fn prepare_taken(
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
