//! The peer registry: each replica keeps a Lease saying it is alive, and
//! reads the others' to know who shares the fleet.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};

use super::epochs::Epochs;
use super::hrw::Peer;
use crate::coordinator::EPOCH_ANNOTATION;
use crate::coordinator::fence::Standing;
use crate::coordinator::lease::{self, seconds};
use crate::sync::lock;

/// How long after a peer's Lease lapses by its own times it is read again:
/// Lease times are in milliseconds here, so the lapse has surely passed.
const LAPSE_MARGIN: Duration = Duration::from_millis(100);

/// Label every multicluster-runtime peer Lease carries.
pub(crate) const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";
/// Label marking a Lease as a peer's.
pub(crate) const PEER_LABEL: &str = "mcr.sigs.k8s.io/peer";
/// Label naming the peer prefix (replica groups with other prefixes are
/// not peers).
pub(crate) const PREFIX_LABEL: &str = "mcr.sigs.k8s.io/prefix";
/// Annotation holding a peer's weight.
pub(crate) const WEIGHT_ANNOTATION: &str = "mcr.sigs.k8s.io/weight";

pub(crate) struct Registry {
    pub(crate) api: Api<Lease>,
    pub(crate) prefix: String,
    pub(crate) lease_name: String,
    pub(crate) me: Peer,
    pub(crate) duration: Duration,
    pub(crate) renew: Duration,
    pub(crate) peers: watch::Sender<Vec<Peer>>,
    /// Fired once the peers have been read for the first time.
    pub(crate) known: CancellationToken,
    /// This replica's standing, for fences held with the peer Lease.
    pub(crate) standing: watch::Sender<Standing>,
    /// Woken when the standing changes.
    pub(crate) wake: Arc<Notify>,
    /// What the reads of the peer Leases tell of their epochs.
    pub(crate) epochs: Arc<Mutex<Epochs>>,
    /// Since when this replica's standing has been live (`None` while it
    /// is not).
    pub(crate) stood_since: Mutex<Option<Instant>>,
}

/// A name for a new epoch, different from every earlier one of this peer
/// ID: the time in nanoseconds and the process.
pub(crate) fn new_epoch() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!("{nanos:x}-{:x}", std::process::id())
}

impl Registry {
    /// Publishes this replica and reads its peers every renew interval
    /// until `stop`, then deletes its Lease so the others take over its
    /// clusters at once instead of after the Lease lapses.
    ///
    /// The standing lasts from a good renewal until one renew interval
    /// before the Lease would lapse for the others (the interval is the
    /// margin for clocks and a write in flight); then its epoch ends, and
    /// the next good renewal announces a new one.
    ///
    /// `abandoned` (the coordinator was stopped before it could hand its
    /// clusters back, its deadline passed) ends the standing and the
    /// renewals but leaves the Lease to lapse: work may still be running,
    /// and deleting the Lease would free its fences at once.
    pub(crate) async fn run(self, stop: CancellationToken, abandoned: CancellationToken) {
        let (good_until, mut watched) = watch::channel(None::<Instant>);
        let news = Notify::new();
        let rounds = async {
            loop {
                let sent = Instant::now();
                // A renewal that wrote an epoch which ended meanwhile
                // counts for nothing: the next one announces the new epoch.
                let written = self.publish().await;
                // (The borrow ends here, before `stand` writes.)
                let current = written.is_some_and(|epoch| self.standing.borrow().epoch == epoch);
                if current {
                    let until = sent + self.duration.saturating_sub(self.renew);
                    good_until.send_replace(Some(until));
                    self.stand();
                }
                let next_round = Instant::now() + self.renew;
                // Between renewals the peers are read again the moment one
                // of them would lapse (a replica that died, by SIGKILL or
                // with its node, is gone from the set then, not up to a
                // renew interval later) and the moment the watch tells of
                // a peer Lease that came, went or changed hands (a replica
                // that left or restarted).
                let mut lapse = self.refresh().await;
                loop {
                    let wake_at = lapse.filter(|at| *at < next_round).unwrap_or(next_round);
                    tokio::select! {
                        () = tokio::time::sleep_until(wake_at) => {}
                        () = news.notified() => {}
                    }
                    if Instant::now() >= next_round {
                        break;
                    }
                    lapse = self.refresh().await;
                }
            }
        };
        let watching = self.watch(&news);
        let watchdog = async {
            loop {
                let until = *watched.borrow_and_update();
                let lapse = async {
                    match until {
                        Some(until) => tokio::time::sleep_until(until).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    changed = watched.changed() => if changed.is_err() { return },
                    () = lapse => {
                        tracing::warn!(lease = %self.lease_name, "the peer Lease was not renewed in time; stopping the work on fences held with it");
                        self.fall();
                        if watched.changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        tokio::select! {
            () = stop.cancelled() => {}
            () = rounds => {}
            () = watchdog => {}
            () = watching => {}
            () = abandoned.cancelled() => {
                tracing::warn!(lease = %self.lease_name, "stopped before the clusters were handed back; the others take them when the peer Lease lapses");
                self.fall();
                return;
            }
        }
        // Stopping: the coordinator has let go of every fence already.
        self.fall();
        let params = DeleteParams::default();
        let delete = self.api.delete(&self.lease_name, &params);
        match tokio::time::timeout(self.renew, delete).await {
            Ok(Ok(_)) => tracing::debug!(lease = %self.lease_name, "peer lease deleted"),
            Ok(Err(err)) => {
                tracing::warn!(lease = %self.lease_name, error = %crate::redact::kube_error(&err), "could not delete the peer lease; the others take over when it lapses")
            }
            Err(_) => {
                tracing::warn!(lease = %self.lease_name, "no answer deleting the peer lease; the others take over when it lapses")
            }
        }
    }

    /// Ends the epoch: fences held with it stop, and the next good renewal
    /// announces a new epoch, which frees them for the others at once.
    fn fall(&self) {
        *lock(&self.stood_since) = None;
        self.standing.send_modify(|standing| {
            if let Some(token) = standing.live.take() {
                token.cancel();
            }
            standing.epoch = new_epoch();
        });
        self.wake.notify_one();
    }

    /// After a good renewal: a new standing if the last one had ended.
    fn stand(&self) {
        let renewed = self.standing.send_if_modified(|standing| {
            if standing.live().is_some() {
                return false;
            }
            standing.live = Some(CancellationToken::new());
            true
        });
        if renewed {
            *lock(&self.stood_since) = Some(Instant::now());
            self.wake.notify_one();
        }
    }

    /// Until when peers whose Leases lapsed are kept in the set: while this
    /// replica cannot renew its own Lease, and for one Lease duration after
    /// it can again. When the API server was away for everyone (paused,
    /// restarted, unreachable from every replica), every peer Lease lapsed
    /// together; dropping the peers whose renewal has not come through yet
    /// would hand their clusters around and back. Safety does not depend
    /// on the set (fences do); a replica that really died meanwhile is
    /// noticed at most one Lease duration later. `None`: none are kept.
    fn keep_lapsed_until(&self, now: Instant) -> Option<Instant> {
        match *lock(&self.stood_since) {
            None => Some(now + self.renew),
            Some(since) => Some(since + self.duration).filter(|until| *until > now),
        }
    }

    /// Renews (or creates) this replica's peer Lease; the epoch it wrote, if
    /// it worked.
    async fn publish(&self) -> Option<String> {
        let labels = BTreeMap::from([
            (
                PART_OF_LABEL.to_string(),
                "multicluster-runtime".to_string(),
            ),
            (PEER_LABEL.to_string(), "true".to_string()),
            (PREFIX_LABEL.to_string(), self.prefix.clone()),
        ]);
        let epoch = self.standing.borrow().epoch.clone();
        let annotations = BTreeMap::from([
            (WEIGHT_ANNOTATION.to_string(), self.me.weight.to_string()),
            (EPOCH_ANNOTATION.to_string(), epoch.clone()),
        ]);
        let call = publish(
            &self.api,
            &self.lease_name,
            &self.me.id,
            self.duration,
            &labels,
            &annotations,
        );
        match tokio::time::timeout(self.renew, call).await {
            Ok(Ok(())) => Some(epoch),
            Ok(Err(err)) => {
                tracing::warn!(lease = %self.lease_name, error = %crate::redact::kube_error(&err), "could not renew the peer lease");
                None
            }
            Err(_) => {
                tracing::warn!(lease = %self.lease_name, "no answer renewing the peer lease");
                None
            }
        }
    }

    /// Follows the peer Leases and notifies `news` when one appears, goes,
    /// or changes holder or epoch (renewals are no news). Only a hastener:
    /// the rounds read the peers whatever the watch does, so a watch that
    /// fails or hangs costs time, never correctness. Never completes.
    async fn watch(&self, news: &Notify) {
        let config = watcher::Config::default().labels(&self.selector());
        let mut changes = watcher(self.api.clone(), config)
            .backoff(crate::cache::WatchBackoff::default().strategy())
            .boxed();
        while let Some(event) = changes.next().await {
            let is_news = match &event {
                Ok(watcher::Event::Apply(lease)) => lock(&self.epochs).is_news(lease),
                Ok(watcher::Event::Delete(lease)) => lease
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| lock(&self.epochs).has_seen(name)),
                // A (re)list: the rounds read the same soon enough.
                Ok(_) => false,
                Err(err) => {
                    tracing::debug!(error = %crate::redact::watcher_error(err), "watching the peer Leases failed; retrying");
                    false
                }
            };
            if is_news {
                news.notify_one();
            }
        }
        std::future::pending::<()>().await;
    }

    fn selector(&self) -> String {
        format!("{PEER_LABEL}=true,{PREFIX_LABEL}={}", self.prefix)
    }

    /// Reads the peers; when the first of the others' Leases lapses (a
    /// moment after, so that it has), if they were read.
    async fn refresh(&self) -> Option<Instant> {
        let selector = self.selector();
        let params = ListParams::default().labels(&selector);
        let call = self.api.list(&params);
        let list = match tokio::time::timeout(self.renew, call).await {
            Ok(Ok(list)) => list,
            Ok(Err(err)) => {
                tracing::warn!(error = %crate::redact::kube_error(&err), "could not list peers; keeping the last known set");
                return None;
            }
            Err(_) => {
                tracing::warn!("no answer listing peers; keeping the last known set");
                return None;
            }
        };
        let now = Timestamp::now();
        lock(&self.epochs).record(&list.items, now);
        let first_lapse = list
            .items
            .iter()
            .filter(|lease| lease::live_holder(lease, now).is_some_and(|id| id != self.me.id))
            .filter_map(|lease| lease::lapses_in(lease.spec.as_ref()?, now))
            .min()
            .map(|left| Instant::now() + left + LAPSE_MARGIN);
        let mut peers: BTreeMap<String, Peer> = list
            .items
            .iter()
            .filter_map(|lease| {
                let id = lease::live_holder(lease, now)?;
                Some(Peer {
                    id: id.to_string(),
                    weight: weight(lease),
                })
            })
            .map(|peer| (peer.id.clone(), peer))
            .collect();
        // Always a peer of itself, even before its own Lease shows up.
        peers.insert(self.me.id.clone(), self.me.clone());
        let keep_until = self.keep_lapsed_until(Instant::now());
        let mut next_look = first_lapse;
        if let Some(until) = keep_until {
            for known in self.peers.borrow().iter() {
                if !peers.contains_key(&known.id) && lapsed_in(&list.items, &known.id, now) {
                    peers.insert(known.id.clone(), known.clone());
                    next_look = Some(next_look.map_or(until, |at| at.min(until)));
                }
            }
        }
        let peers: Vec<Peer> = peers.into_values().collect();
        self.known.cancel();
        self.peers.send_if_modified(|known| {
            if *known == peers {
                return false;
            }
            tracing::info!(peers = ?peers.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), "peers changed");
            *known = peers;
            true
        });
        next_look
    }
}

/// Whether `leases` hold a Lease of peer `id` that has lapsed (not one
/// that was deleted or released: that peer left).
fn lapsed_in(leases: &[Lease], id: &str, now: Timestamp) -> bool {
    leases.iter().any(|lease| {
        lease.spec.as_ref().is_some_and(|spec| {
            spec.holder_identity.as_deref() == Some(id) && lease::expired(spec, now)
        })
    })
}

/// A peer's weight from its annotation; missing, unreadable or 0 is 1.
fn weight(lease: &Lease) -> u32 {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WEIGHT_ANNOTATION))
        .and_then(|w| w.parse::<u32>().ok())
        .filter(|w| *w > 0)
        .unwrap_or(1)
}

/// Creates or renews the peer Lease `name` for `me`, with `labels` and
/// `annotations` set.
async fn publish(
    api: &Api<Lease>,
    name: &str,
    me: &str,
    duration: Duration,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let now = MicroTime(Timestamp::now());
    match api.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(labels.clone()),
                    annotations: Some(annotations.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.to_string()),
                    lease_duration_seconds: Some(seconds(duration)),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
        Some(mut lease) => {
            lease
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .extend(labels.clone());
            lease
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .extend(annotations.clone());
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(me.to_string());
            spec.lease_duration_seconds = Some(seconds(duration));
            spec.renew_time = Some(now);
            api.replace(name, &PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}
