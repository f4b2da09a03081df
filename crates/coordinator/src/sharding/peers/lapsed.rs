//! Peers whose Leases lapsed: their epochs ended (one write each, naming
//! the live, ready peers as heirs) before their fences are taken, and
//! peers that left forgotten.

use super::*;

impl Registry {
    /// Ends the epochs of the peers whose Leases lapsed and that are no
    /// longer counted (`peers`), before the others take their clusters: one
    /// write per lapsed peer, and the takes of its fences then know the
    /// epoch ended without reading its Lease each. Several replicas may
    /// try at once; one write wins, and the others read what it wrote.
    ///
    /// Not while lapsed peers are still kept (this replica could not renew
    /// either, lately, or has just started): after an outage every Lease
    /// has lapsed, and ending the others' epochs then would have each take
    /// its fences again. A take of such a peer's fence still ends its
    /// epoch first.
    /// Whether an end it wrote or found named heirs.
    pub(super) async fn end_lapsed(
        &self,
        leases: &[Lease],
        peers: &BTreeMap<String, Peer>,
        now: Timestamp,
    ) -> bool {
        if self.keep_lapsed_until(Instant::now()).is_some() {
            return false;
        }
        let mut heirs_named = false;
        for peer in leases {
            let Some(spec) = peer.spec.as_ref() else {
                continue;
            };
            let (Some(name), Some(holder), Some(epoch)) = (
                peer.metadata.name.as_deref(),
                lease::holder_of(peer),
                lease::epoch_of(peer),
            ) else {
                continue;
            };
            if holder == self.me.id || peers.contains_key(holder) || !lease::expired(spec, now) {
                continue;
            }
            let heirs = self.heirs(peers.values(), holder, now);
            let record =
                (self.with_heirs && !heirs.is_empty()).then(|| Record::new(holder, epoch, heirs));
            let annotation = record.and_then(|record| heirs::annotation_with(peer, record, now));
            let call = lease::end_epoch(&self.api, peer.clone(), holder, epoch, annotation);
            match tokio::time::timeout(self.renew, call).await {
                Ok(Ok(EpochEnd::Ended(now_lease))) => {
                    let named = now_lease
                        .as_deref()
                        .is_some_and(|now| heirs::records(now).iter().any(|r| r.epoch == epoch));
                    tracing::info!(lease = %name, %epoch, heirs = named, "a lapsed peer's epoch ended; its clusters move");
                    let departed = Peer {
                        id: holder.to_string(),
                        weight: wire::weight(peer),
                    };
                    let mut epochs = lock(self.view.epochs());
                    heirs_named |= epochs.ended_with(now_lease.as_deref(), now);
                    epochs.depart(name, epoch, departed, now);
                }
                Ok(Ok(EpochEnd::Live)) => {}
                Ok(Err(err)) => {
                    tracing::debug!(lease = %name, error = %crate::kube_error(&err), "could not end a lapsed peer's epoch; its fences' takes try");
                }
                Err(_) => {
                    tracing::debug!(lease = %name, "no answer ending a lapsed peer's epoch; its fences' takes try");
                }
            }
        }
        heirs_named
    }

    /// The heirs of an epoch of `gone` that ends now: the live, ready
    /// `peers` that are not leaving, in the epochs the peer reads saw
    /// them in (this replica in its standing, if it is live and ready).
    pub(super) fn heirs<'a>(
        &self,
        peers: impl Iterator<Item = &'a Peer>,
        gone: &str,
        now: Timestamp,
    ) -> Vec<HeirPeer> {
        let epochs = lock(self.view.epochs());
        peers
            .filter(|peer| peer.id != gone)
            .filter_map(|peer| {
                let held_with = if peer.id == self.me.id {
                    let standing = self.standing.borrow();
                    standing.live().filter(|_| self.lifecycle.may_inherit())?;
                    standing.held_with()
                } else {
                    let peer_lease = lease_name(&self.prefix, &peer.id);
                    let epoch = epochs.live_epoch(&peer_lease, &peer.id, now)?;
                    lease::held_with(&peer_lease, epoch)
                };
                Some(HeirPeer {
                    id: peer.id.clone(),
                    weight: peer.weight,
                    held_with,
                })
            })
            .collect()
    }

    /// Ends this replica's `epoch` as it stops, naming its heirs: what it
    /// had not handed over goes to them at once, without a write each (see
    /// `heirs`). Its work has stopped already. With nothing left behind,
    /// no heirs, or should that write fail, the Lease is deleted, which
    /// frees every fence held with it (heirs named by an earlier epoch's
    /// end keep the Lease).
    pub(super) async fn end_own_epoch(&self, epoch: &str) {
        let now = Timestamp::now();
        let peers = self.view.peers();
        let heirs = self.heirs(peers.iter(), &self.me.id, now);
        let last = lock(&self.written).clone();
        let left_behind = self.left_behind.load(std::sync::atomic::Ordering::Relaxed) > 0;
        let record = (self.with_heirs && left_behind && !heirs.is_empty())
            .then(|| Record::new(&self.me.id, epoch, heirs));
        // Heirs named by an earlier epoch's end may still work on fences
        // held in it: the Lease that names them stays.
        let named_before = last
            .as_ref()
            .is_some_and(|last| heirs::followed_on(last, now));
        let names_heirs = record.is_some();
        if let Some(mut last) = last.filter(|_| names_heirs || named_before) {
            let annotation = record.and_then(|record| heirs::annotation_with(&last, record, now));
            if let Some(annotations) = last.metadata.annotations.as_mut() {
                annotations.remove(wire::LEAVING_ANNOTATION);
            }
            let call = lease::end_epoch(&self.api, last, &self.me.id, epoch, annotation);
            match tokio::time::timeout(self.renew, call).await {
                Ok(Ok(EpochEnd::Ended(_))) => {
                    tracing::info!(lease = %self.lease_name, %epoch, heirs = names_heirs, "stopped: the peer Lease's epoch ended");
                    return;
                }
                Ok(Ok(EpochEnd::Live)) => {}
                Ok(Err(err)) => {
                    tracing::debug!(lease = %self.lease_name, error = %crate::kube_error(&err), "could not end the peer lease naming its heirs; deleting it");
                }
                Err(_) => {
                    tracing::debug!(lease = %self.lease_name, "no answer ending the peer lease naming its heirs; deleting it");
                }
            }
            if named_before {
                tracing::warn!(lease = %self.lease_name, "could not end the peer lease; the others end it when it lapses");
                return;
            }
        }
        let params = DeleteParams::default();
        let delete = self.api.delete(&self.lease_name, &params);
        match tokio::time::timeout(self.renew, delete).await {
            Ok(Ok(_)) => tracing::debug!(lease = %self.lease_name, "peer lease deleted"),
            Ok(Err(err)) => {
                tracing::warn!(lease = %self.lease_name, error = %crate::kube_error(&err), "could not delete the peer lease; the others take over when it lapses")
            }
            Err(_) => {
                tracing::warn!(lease = %self.lease_name, "no answer deleting the peer lease; the others take over when it lapses")
            }
        }
    }

    /// Deletes the peer Leases that name no holder and no heirs still
    /// followed, and were last renewed longer ago than heirs are followed:
    /// replicas that left for good (a Deployment's pods are named anew at
    /// every rollout). Written over what was read, so a replica that
    /// comes back meanwhile keeps its Lease.
    pub(super) async fn forget_departed(&self, leases: &[Lease], now: Timestamp) {
        for peer in leases {
            let (Some(name), Some(version)) = (
                peer.metadata.name.as_deref(),
                peer.metadata.resource_version.clone(),
            ) else {
                continue;
            };
            let renewed = peer
                .spec
                .as_ref()
                .and_then(|spec| spec.renew_time.as_ref())
                .map(|time| time.0);
            let idle = renewed.is_none_or(|at| heirs::no_longer_followed(at, now));
            if lease::holder_of(peer).is_some() || !idle || heirs::followed_on(peer, now) {
                continue;
            }
            let params = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    resource_version: Some(version),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match tokio::time::timeout(self.renew, self.api.delete(name, &params)).await {
                Ok(Ok(_)) => {
                    tracing::debug!(lease = %name, "deleted the peer lease of a replica long gone")
                }
                Ok(Err(err)) => {
                    tracing::debug!(lease = %name, error = %crate::kube_error(&err), "could not delete the peer lease of a replica long gone");
                }
                Err(_) => {}
            }
        }
    }
}

/// Whether `leases` hold a Lease of peer `id` that has lapsed (not one
/// that was deleted or released: that peer left).
pub(super) fn lapsed_in(leases: &[Lease], id: &str, now: Timestamp) -> bool {
    leases.iter().any(|lease| {
        lease.spec.as_ref().is_some_and(|spec| {
            spec.holder_identity.as_deref() == Some(id) && lease::expired(spec, now)
        })
    })
}
