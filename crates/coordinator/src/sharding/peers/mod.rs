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

use super::heirs::{self, HeirPeer, Record};
use super::hrw::Peer;
use super::lifecycle::{LeaseSays, Lifecycle, Phase};
use crate::fence::Standing;
use crate::lease::{self, EpochEnd, seconds};
use crate::lease_name;
use crate::lock;
use crate::wire;

mod lapsed;
mod view;

use lapsed::lapsed_in;
pub(crate) use view::PeersView;

/// How long after a peer's Lease lapses by its own times it is read again:
/// Lease times are in milliseconds here, so the lapse has surely passed.
const LAPSE_MARGIN: Duration = Duration::from_millis(100);

pub(crate) struct Registry {
    /// What its reads tell, for the looks.
    pub(crate) view: PeersView,
    pub(crate) api: Api<Lease>,
    pub(crate) prefix: String,
    pub(crate) lease_name: String,
    pub(crate) me: Peer,
    pub(crate) duration: Duration,
    pub(crate) renew: Duration,
    /// Fired once the peers have been read for the first time.
    pub(crate) known: CancellationToken,
    /// This replica's standing, for fences held with the peer Lease.
    pub(crate) standing: watch::Sender<Standing>,
    /// Woken when the standing changes.
    pub(crate) wake: Arc<Notify>,
    /// Where this replica is in its life: what its Lease says (ready,
    /// leaving) follows it.
    pub(crate) lifecycle: Lifecycle,
    /// Whether fences are held with the peer Lease: an epoch that ends
    /// then names heirs.
    pub(crate) with_heirs: bool,
    /// How many clusters the coordinator still worked on when it stopped.
    pub(crate) left_behind: Arc<std::sync::atomic::AtomicUsize>,
    /// Woken when a read learns of heirs named.
    pub(crate) heirs_news: Arc<Notify>,
    /// Since when this replica's standing has been live (`None` while it
    /// is not).
    pub(crate) stood_since: Mutex<Option<Instant>>,
    /// The peer Lease as this replica last wrote it: each renewal writes
    /// over it, so a renewal finds out when another replica ended the
    /// epoch (or an operator deleted the Lease) in between.
    pub(crate) written: Mutex<Option<Lease>>,
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
    ///
    /// Long on purpose: the renewal loop and the two tasks beside it (the watch
    /// and the watchdog) share its locals.
    pub(crate) async fn run(self, stop: CancellationToken, abandoned: CancellationToken) {
        let (good_until, mut watched) = watch::channel(None::<Instant>);
        let news = Notify::new();
        let rounds = async {
            // What the last renewal said: a replica stopping before it ever
            // said it was ready does not say so on its way out.
            let mut said = LeaseSays::default();
            loop {
                let sent = Instant::now();
                let says = self.lifecycle.lease_says(self.lifecycle.now(), said);
                said = says;
                // A renewal that wrote an epoch which ended meanwhile
                // counts for nothing: the next one announces the new epoch.
                let written = self.publish(says).await;
                // (The borrow ends here, before `stand` writes.)
                let current = written.is_some_and(|epoch| self.standing.borrow().epoch == epoch);
                if current {
                    let until = sent + self.duration.saturating_sub(self.renew);
                    good_until.send_replace(Some(until));
                    self.stand();
                    if says.leaving && self.lifecycle.advance(Phase::SaidLeaving) {
                        self.wake.notify_one();
                    }
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
                        // Said at once, not at the next renewal.
                        () = self.lifecycle.until_that(|now| self.lifecycle.lease_says(now, said) != says) => break,
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
                        tracing::warn!(lease = %self.lease_name, "the peer Lease was not renewed in time; stopping the work on fences held with it until it is");
                        self.suspend();
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
        let epoch = self.standing.borrow().epoch.clone();
        self.fall();
        self.end_own_epoch(&epoch).await;
    }

    /// Ends the epoch: fences held with it stop, and the next good renewal
    /// announces a new epoch, which frees them for the others at once.
    fn fall(&self) {
        self.end_standing(true);
    }

    /// Stops the work on fences held with the peer Lease, which may lapse
    /// for the others any moment now, but keeps the epoch: a renewal that
    /// finds nobody ended it (the Lease as this replica last wrote it)
    /// gives the fences back without a request each.
    fn suspend(&self) {
        self.end_standing(false);
    }

    fn end_standing(&self, new_epoch_too: bool) {
        *lock(&self.stood_since) = None;
        self.standing.send_modify(|standing| {
            if let Some(token) = standing.live.take() {
                token.cancel();
            }
            if new_epoch_too {
                standing.epoch = new_epoch();
            }
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
    /// it worked. A renewal that finds its epoch ended by someone else
    /// ends the standing and writes a new epoch. The Lease says what
    /// `says` does of this replica.
    async fn publish(&self, says: LeaseSays) -> Option<String> {
        let labels = BTreeMap::from([
            (
                wire::PART_OF_LABEL.to_string(),
                "multicluster-runtime".to_string(),
            ),
            (wire::PEER_LABEL.to_string(), "true".to_string()),
            (wire::PREFIX_LABEL.to_string(), self.prefix.clone()),
        ]);
        // Twice at most: the epoch found ended, then the new one.
        for _ in 0..2 {
            let epoch = self.standing.borrow().epoch.clone();
            let mut annotations = BTreeMap::from([
                (
                    wire::WEIGHT_ANNOTATION.to_string(),
                    self.me.weight.to_string(),
                ),
                (wire::EPOCH_ANNOTATION.to_string(), epoch.clone()),
                (wire::READY_ANNOTATION.to_string(), says.ready.to_string()),
            ]);
            if says.leaving {
                annotations.insert(wire::LEAVING_ANNOTATION.to_string(), "true".to_string());
            }
            let last = lock(&self.written).clone();
            let peer = PeerLease {
                api: &self.api,
                name: &self.lease_name,
                me: &self.me.id,
                duration: self.duration,
                labels: &labels,
                annotations: &annotations,
            };
            let call = publish(&peer, last);
            match tokio::time::timeout(self.renew, call).await {
                Ok(Ok(Published::Written(lease))) => {
                    *lock(&self.written) = Some(*lease);
                    return Some(epoch);
                }
                Ok(Ok(Published::EpochEnded)) => {
                    tracing::warn!(lease = %self.lease_name, "the peer Lease lapsed and another replica ended its epoch (or it was deleted); starting a new one, so the clusters are taken again");
                    self.fall();
                }
                Ok(Err(err)) => {
                    tracing::warn!(lease = %self.lease_name, error = %crate::kube_error(&err), "could not renew the peer lease");
                    return None;
                }
                Err(_) => {
                    tracing::warn!(lease = %self.lease_name, "no answer renewing the peer lease");
                    return None;
                }
            }
        }
        None
    }

    /// Follows the peer Leases and notifies `news` when one appears, goes,
    /// or changes holder or epoch (renewals are no news). Only a hastener:
    /// the rounds read the peers whatever the watch does, so a watch that
    /// fails or hangs costs time, never correctness. Never completes.
    async fn watch(&self, news: &Notify) {
        let config = watcher::Config::default().labels(&self.selector());
        let mut changes = watcher(self.api.clone(), config)
            .backoff(multicluster_runtime::cache::WatchBackoff::default().strategy())
            .boxed();
        while let Some(event) = changes.next().await {
            let is_news = match &event {
                Ok(watcher::Event::Apply(lease)) => lock(self.view.epochs()).is_news(lease),
                Ok(watcher::Event::Delete(lease)) => lease
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| lock(self.view.epochs()).has_seen(name)),
                // A (re)list: the rounds read the same soon enough.
                Ok(_) => false,
                Err(err) => {
                    tracing::debug!(error = %crate::watcher_error(err), "watching the peer Leases failed; retrying");
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
        format!(
            "{}=true,{}={}",
            wire::PEER_LABEL,
            wire::PREFIX_LABEL,
            self.prefix
        )
    }

    /// Reads the peers; when the first of the others' Leases lapses (a
    /// moment after, so that it has), if they were read.
    ///
    /// Long on purpose: one read of the peer Leases and all the view learns
    /// from it, published together so a look never sees half of it.
    async fn refresh(&self) -> Option<Instant> {
        let selector = self.selector();
        let params = ListParams::default().labels(&selector);
        let call = self.api.list(&params);
        let list = match tokio::time::timeout(self.renew, call).await {
            Ok(Ok(list)) => list,
            Ok(Err(err)) => {
                tracing::warn!(error = %crate::kube_error(&err), "could not list peers; keeping the last known set");
                return None;
            }
            Err(_) => {
                tracing::warn!("no answer listing peers; keeping the last known set");
                return None;
            }
        };
        let now = Timestamp::now();
        let mut heirs_named = lock(self.view.epochs()).record(&list.items, now);
        let first_lapse = list
            .items
            .iter()
            .filter(|lease| lease::live_holder(lease, now).is_some_and(|id| id != self.me.id))
            .filter_map(|lease| lease::lapses_in(lease.spec.as_ref()?, now))
            .min()
            .map(|left| Instant::now() + left + LAPSE_MARGIN);
        let live = |leaving: bool| {
            list.items
                .iter()
                .filter(move |lease| wire::is_leaving(lease) == leaving)
                .filter_map(move |lease| {
                    let id = lease::live_holder(lease, now)?;
                    Some(Peer {
                        id: id.to_string(),
                        weight: wire::weight(lease),
                    })
                })
        };
        // A leaving peer owns nothing more: it is handing its clusters over.
        let mut peers: BTreeMap<String, Peer> =
            live(false).map(|peer| (peer.id.clone(), peer)).collect();
        let leaving: Vec<Peer> = live(true).filter(|peer| peer.id != self.me.id).collect();
        // Always a peer of itself, even before its own Lease shows up.
        peers.insert(self.me.id.clone(), self.me.clone());
        let keep_until = self.keep_lapsed_until(Instant::now());
        let mut next_look = first_lapse;
        if let Some(until) = keep_until {
            for known in &self.view.peers() {
                if !peers.contains_key(&known.id) && lapsed_in(&list.items, &known.id, now) {
                    peers.insert(known.id.clone(), known.clone());
                    next_look = Some(next_look.map_or(until, |at| at.min(until)));
                }
            }
        }
        heirs_named |= self.end_lapsed(&list.items, &peers, now).await;
        self.forget_departed(&list.items, now).await;
        let joining: std::collections::BTreeSet<String> = list
            .items
            .iter()
            .filter(|lease| !wire::is_ready(lease) && !wire::is_leaving(lease))
            .filter_map(|lease| lease::live_holder(lease, now))
            .filter(|id| *id != self.me.id)
            .map(str::to_string)
            .collect();
        if self.view.read_joining(joining) {
            self.wake.notify_one();
        }
        if self.view.read_leaving(leaving) {
            self.wake.notify_one();
        }
        self.known.cancel();
        self.view.read_live(peers.into_values().collect());
        // Heirs named: the coordinator takes up what it inherits, once the
        // peers it looks with no longer count the replica that is gone (a
        // look woken with it still counted handed the inherited clusters
        // back to it, and took them again with a write each).
        if heirs_named {
            self.heirs_news.notify_one();
        }
        next_look
    }
}

/// What a renewal of the peer Lease did.
enum Published {
    /// Wrote it: the Lease as written.
    Written(Box<Lease>),
    /// Wrote nothing: the epoch it was to renew had been ended by another
    /// replica, or the Lease deleted.
    EpochEnded,
}

/// The peer Lease as this replica writes it.
#[derive(Clone, Copy)]
struct PeerLease<'a> {
    api: &'a Api<Lease>,
    /// The Lease's name.
    name: &'a str,
    /// This replica's peer ID, its holder.
    me: &'a str,
    duration: Duration,
    labels: &'a BTreeMap<String, String>,
    /// They name the epoch.
    annotations: &'a BTreeMap<String, String>,
}

/// Creates or renews the peer Lease `peer.name` for `peer.me`, with its
/// labels and annotations (which name the epoch) set.
///
/// `last` is what this replica last wrote; the renewal writes over it
/// without reading first. When the write conflicts (something else wrote
/// since) or the Lease is gone, and `last` was in the same epoch, the epoch
/// goes on only if the Lease read now still names `me` in it: a lost
/// answer to this replica's own write, or another's label, changes
/// nothing; a cleared holder (another replica ended the lapsed epoch) or a
/// deletion ends it.
async fn publish(peer: &PeerLease<'_>, last: Option<Lease>) -> Result<Published, kube::Error> {
    let PeerLease {
        api,
        name,
        me,
        duration,
        labels,
        annotations,
    } = *peer;
    let epoch = annotations.get(wire::EPOCH_ANNOTATION).map(String::as_str);
    let same_epoch = last
        .as_ref()
        .is_some_and(|last| epoch.is_some_and(|epoch| lease::in_epoch(last, me, epoch)));
    let mut written_over = last;
    loop {
        let read = written_over.is_none();
        let mut lease = match written_over.take() {
            Some(lease) => lease,
            None => match api.get_opt(name).await? {
                Some(lease) => {
                    if same_epoch && !epoch.is_some_and(|epoch| lease::in_epoch(&lease, me, epoch))
                    {
                        return Ok(Published::EpochEnded);
                    }
                    lease
                }
                None if same_epoch => return Ok(Published::EpochEnded),
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
                            renew_time: Some(MicroTime(Timestamp::now())),
                            ..LeaseSpec::default()
                        }),
                    };
                    let written = api.create(&PostParams::default(), &lease).await?;
                    return Ok(Published::Written(Box::new(written)));
                }
            },
        };
        lease
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .extend(labels.clone());
        let kept = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
        // Said by an earlier run of this peer that left without deleting
        // its Lease: this one is not leaving unless it says so.
        kept.remove(wire::LEAVING_ANNOTATION);
        kept.extend(annotations.clone());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(me.to_string());
        spec.lease_duration_seconds = Some(seconds(duration));
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match api.replace(name, &PostParams::default(), &lease).await {
            Ok(written) => return Ok(Published::Written(Box::new(written))),
            // Written by something else since: read it (once).
            Err(kube::Error::Api(status))
                if (status.code == 409 || status.code == 404) && !read => {}
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer Lease of `holder` in `epoch` under `prefix`, renewed
    /// `renewed_secs_ago` with a 30 s duration.
    fn peer_lease(prefix: &str, holder: &str, epoch: &str, renewed_secs_ago: i64) -> Lease {
        let name = format!("{prefix}-{holder}");
        let mut peer = lease::tests::peer_lease(&name, holder, epoch, renewed_secs_ago);
        peer.metadata.labels = Some(BTreeMap::from([
            (wire::PEER_LABEL.to_string(), "true".to_string()),
            (wire::PREFIX_LABEL.to_string(), prefix.to_string()),
        ]));
        peer
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_lapsed_and_is_no_longer_counted_has_its_epoch_ended_but_not_right_after_an_outage()
     {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let params = PostParams::default();
        for peer in [
            peer_lease("mcr-peer", "gone", "e1", 60),
            peer_lease("mcr-peer", "live", "f1", 0),
        ] {
            api.create(&params, &peer).await.expect("peer lease");
        }
        let me = Peer {
            id: "me".to_string(),
            weight: 1,
        };
        let registry = Registry {
            api: api.clone(),
            prefix: "mcr-peer".to_string(),
            lease_name: "mcr-peer-me".to_string(),
            me: me.clone(),
            duration: Duration::from_secs(30),
            renew: Duration::from_secs(10),
            view: PeersView::new(me.clone()),
            known: CancellationToken::new(),
            standing: watch::Sender::new(Standing::not_yet("mcr-peer-me".to_string(), new_epoch())),
            wake: Arc::new(Notify::new()),
            lifecycle: Lifecycle::new(true),
            with_heirs: true,
            left_behind: Arc::default(),
            heirs_news: Arc::default(),
            stood_since: Mutex::default(),
            written: Mutex::default(),
        };
        // Just started (it has not stood yet): lapsed peers are kept a
        // while, and their epochs left alone.
        registry.refresh().await;
        let holder = |name: &'static str| {
            let api = api.clone();
            async move {
                api.get(name)
                    .await
                    .expect("peer lease")
                    .spec
                    .and_then(|spec| spec.holder_identity)
            }
        };
        assert_eq!(holder("mcr-peer-gone").await.as_deref(), Some("gone"));
        // Standing for longer than a Lease duration: ended at once.
        *lock(&registry.stood_since) = Some(Instant::now() - Duration::from_secs(31));
        registry.refresh().await;
        assert_eq!(
            holder("mcr-peer-gone").await,
            None,
            "the lapsed epoch was not ended"
        );
        assert_eq!(holder("mcr-peer-live").await.as_deref(), Some("live"));
        let ids: Vec<String> = registry.view.peers().iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids, ["live", "me"]);
        // The write that ended it named its heirs: the live, ready peers
        // (not this replica, which has not said it is ready). Its fences
        // are known to be theirs without reading its Lease again.
        let records = heirs::records(&api.get("mcr-peer-gone").await.expect("peer lease"));
        let named: Vec<(&str, &str, &str)> = records
            .iter()
            .flat_map(|record| {
                record.heirs.iter().map(|heir| {
                    (
                        record.epoch.as_str(),
                        heir.id.as_str(),
                        heir.held_with.as_str(),
                    )
                })
            })
            .collect();
        assert_eq!(named, [("e1", "live", "mcr-peer-live/f1")]);
        let known = lock(registry.view.epochs()).holds(
            "mcr-peer-gone",
            "e1",
            "gone",
            "c",
            Timestamp::now(),
        );
        assert_eq!(
            known,
            Some(lease::Hold::Inherited(lease::Heir {
                id: "live".to_string(),
                held_with: "mcr-peer-live/f1".to_string(),
            }))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_goes_on_in_its_epoch_only_while_nobody_else_ended_it() {
        let cp = multicluster_envtest::ControlPlane::start()
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let labels = BTreeMap::from([(wire::PEER_LABEL.to_string(), "true".to_string())]);
        let renew = |epoch: &'static str, last: Option<Lease>| {
            let (api, labels) = (api.clone(), labels.clone());
            async move {
                let annotations =
                    BTreeMap::from([(wire::EPOCH_ANNOTATION.to_string(), epoch.to_string())]);
                let duration = Duration::from_secs(30);
                let peer = PeerLease {
                    api: &api,
                    name: "peer-me",
                    me: "me",
                    duration,
                    labels: &labels,
                    annotations: &annotations,
                };
                publish(&peer, last).await.expect("publish")
            }
        };
        let written = |published: Published| match published {
            Published::Written(lease) => *lease,
            Published::EpochEnded => panic!("the epoch was found ended"),
        };
        let params = PostParams::default();

        let first = written(renew("e1", None).await);
        // Over the last write, without reading it.
        let before = lease::tests::lease_reads(&client).await;
        let second = written(renew("e1", Some(first)).await);
        assert_eq!(lease::tests::lease_reads(&client).await, before);

        // Another's label, or a lost answer to this replica's own write:
        // the Lease still names it in e1, and the epoch goes on.
        let mut touched = api.get("peer-me").await.expect("get");
        touched
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert("touched".to_string(), "yes".to_string());
        api.replace("peer-me", &params, &touched)
            .await
            .expect("touch");
        let third = written(renew("e1", Some(second)).await);
        assert_eq!(lease::epoch_of(&third), Some("e1"));

        // Another replica ended the lapsed epoch (cleared the holder).
        let mut ended = third.clone();
        ended.spec.as_mut().expect("spec").holder_identity = None;
        api.replace("peer-me", &params, &ended).await.expect("end");
        assert!(matches!(
            renew("e1", Some(third.clone())).await,
            Published::EpochEnded
        ));
        // A new epoch is written over whatever is there.
        let fourth = written(renew("e2", Some(third)).await);
        assert!(lease::in_epoch(&fourth, "me", "e2"));

        // Deleted (by an operator): e2 ended too; e3 creates it again.
        api.delete("peer-me", &DeleteParams::default())
            .await
            .expect("delete");
        assert!(matches!(
            renew("e2", Some(fourth.clone())).await,
            Published::EpochEnded
        ));
        let fifth = written(renew("e3", Some(fourth)).await);
        assert!(lease::in_epoch(&fifth, "me", "e3"));
    }
}
