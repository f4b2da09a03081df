//! A sharded replica is handed clusters only once its provider has engaged
//! the inventory it first found and the manager has checked each of those
//! clusters: until then its peer Lease says it is not ready, and the
//! replica working on a cluster it owns keeps working on it. A provider
//! that never says so delays the hand-over by `inventory_wait`. A replica
//! that stops hands its clusters straight to their next owners.

use multicluster_runtime::testing::Polled;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use multicluster_coordinator::sharding::{
    FenceHold, Peer, ShardedCoordinator, ShardingOptions, owner,
};
use multicluster_envtest::ControlPlane;
use multicluster_runtime::ClusterName;
use multicluster_runtime::coordinator::Coordinator;
use multicluster_runtime::provider::clusters::{ClusterSetProvider, Clusters};
use multicluster_runtime::testing::{
    eventually, holds_throughout, run_manager, wait_on, wait_until_ready,
};
use multicluster_runtime::{InventoryEngaged, Manager, ProviderContext, RunnableProvider};
use tokio_util::sync::CancellationToken;

/// A cluster built from a control plane's admin kubeconfig.
async fn cluster_for(
    name: &str,
    cp: &multicluster_envtest::ControlPlane,
) -> multicluster_runtime::Cluster {
    multicluster_runtime::Cluster::new(name, cp.client().await.expect("client"))
}

const MEMBERS: [&str; 8] = ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"];

/// A provider whose clusters are all engaged at the start, but which says
/// so only once `said` fires, if ever.
#[derive(Clone, Debug, Default)]
struct Holding {
    clusters: Clusters,
    said: Option<CancellationToken>,
}

impl ClusterSetProvider for Holding {
    fn cluster_set(&self) -> &Clusters {
        &self.clusters
    }
}

#[async_trait::async_trait]
impl RunnableProvider for Holding {
    async fn start(
        &self,
        context: ProviderContext,
    ) -> Result<InventoryEngaged, multicluster_runtime::Error> {
        // Says its inventory is engaged only when the test lets it.
        self.clusters.start_discovering(&context)?;
        let said = self.said.clone().unwrap_or_default();
        let engaged = tokio::select! {
            () = said.cancelled() => context.inventory_engaged(),
            () = context.shutdown.cancelled() => return Ok(context.stopped_before_engaged()),
        };
        context.shutdown.cancelled().await;
        Ok(engaged)
    }
}

/// A replica `id` over every member, its provider saying its inventory is
/// engaged when `said` fires (never without one).
async fn replica(
    cp: &ControlPlane,
    id: &str,
    said: Option<CancellationToken>,
    sharding: ShardingOptions,
) -> (Manager, Arc<ShardedCoordinator>, Clusters) {
    let provider = Holding {
        said,
        ..Holding::default()
    };
    for name in MEMBERS {
        provider
            .clusters
            .add(name, cluster_for(name, cp).await)
            .expect("add");
    }
    let client = cp.client().await.expect("client");
    let sharding = sharding
        .peer_id(id.to_string())
        .probe_interval(Duration::from_millis(200));
    let coordinator = Arc::new(ShardedCoordinator::new(client, sharding).expect("coordinator"));
    let clusters = provider.clusters.clone();
    let manager = Manager::builder(cluster_for("local", cp).await)
        .provider(Arc::new(provider))
        .coordinator(coordinator.clone())
        .build();
    (manager, coordinator, clusters)
}

/// The members `coordinator` works on.
fn working_on(coordinator: &ShardedCoordinator) -> Vec<String> {
    coordinator
        .working_on()
        .unwrap_or_default()
        .into_iter()
        .map(|name| name.to_string())
        .filter(|name| MEMBERS.contains(&name.as_str()))
        .collect()
}

/// Waits until the members `coordinator` works on satisfy `that`, as its
/// working set tells (no polling).
async fn until_members(
    coordinator: &ShardedCoordinator,
    what: &str,
    mut that: impl FnMut(&[String]) -> bool,
) {
    wait_on(what, &mut coordinator.working_set(), |names| {
        that(&members(names))
    })
    .await;
}

/// The members among `names`.
fn members(names: &[ClusterName]) -> Vec<String> {
    names
        .iter()
        .map(|name| name.to_string())
        .filter(|name| MEMBERS.contains(&name.as_str()))
        .collect()
}

/// The members `id` owns among `r0` and `r1`.
fn share_of(id: &str) -> Vec<String> {
    let peers = ["r0", "r1"].map(|id| Peer {
        id: id.to_string(),
        weight: 1,
    });
    MEMBERS
        .iter()
        .filter(|name| owner(name, &peers).is_some_and(|peer| peer.id == id))
        .map(|name| name.to_string())
        .collect()
}

/// What `id`'s peer Lease says of its readiness, if it exists.
async fn said_ready(cp: &ControlPlane, id: &str) -> Option<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(cp.client().await.expect("client"), "kube-system");
    let lease = leases
        .get_opt(&format!("mcr-peer-{id}"))
        .await
        .expect("peer lease")?;
    Some(
        lease
            .metadata
            .annotations
            .and_then(|annotations| annotations.get("mcr.sigs.k8s.io/ready").cloned()),
    )
}

/// A running replica: its coordinator, what stops it, and its task.
type Running = (
    Arc<ShardedCoordinator>,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), multicluster_runtime::Error>>,
);

/// r0 and r1, ready at once, with these options, running until they have
/// split the members.
async fn split_by_two(
    cp: &ControlPlane,
    first: ShardingOptions,
    second: ShardingOptions,
) -> (Running, Running) {
    let ready = CancellationToken::new();
    ready.cancel();
    let (first, r0, _) = replica(cp, "r0", Some(ready.clone()), first).await;
    let (second, r1, _) = replica(cp, "r1", Some(ready), second).await;
    let (first_stop, first_task) = run_manager(&first);
    let (second_stop, second_task) = run_manager(&second);
    until_members(&r0, "r0 and r1 split the members", |on| {
        on == share_of("r0")
    })
    .await;
    until_members(&r1, "r0 and r1 split the members", |on| {
        on == share_of("r1")
    })
    .await;
    assert!(!share_of("r0").is_empty(), "r0 owns no member");
    ((r0, first_stop, first_task), (r1, second_stop, second_task))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_handed_clusters_only_once_its_inventory_is_engaged() {
    let cp = ControlPlane::start().await.expect("control plane");
    let r1_share = share_of("r1");
    assert!(!r1_share.is_empty(), "r1 owns none of {MEMBERS:?}");
    let ready = CancellationToken::new();
    ready.cancel();
    let (first, r0, _) = replica(&cp, "r0", Some(ready), ShardingOptions::default()).await;
    let (first_stop, first_task) = run_manager(&first);
    until_members(&r0, "r0 works on every member", |on| {
        on.len() == MEMBERS.len()
    })
    .await;

    let said = CancellationToken::new();
    let (second, r1, _) = replica(&cp, "r1", Some(said.clone()), ShardingOptions::default()).await;
    let (second_stop, second_task) = run_manager(&second);
    // r1 is up, a peer of r0, every member engaged and checked on it; its
    // provider has not said its inventory is engaged.
    for name in MEMBERS {
        wait_until_ready(&second, name).await;
    }
    wait_on("r0 counts r1 as a peer", &mut r0.peer_set(), |peers| {
        peers.iter().any(|peer| peer.id == "r1")
    })
    .await;
    assert_eq!(said_ready(&cp, "r1").await, Some(Some("false".to_string())));
    // For two seconds, at every change of either's working set: r0 keeps
    // r1's share, and r1 is handed nothing.
    assert_eq!(working_on(&r0).len(), MEMBERS.len(), "r0 handed over early");
    let (mut r0_set, mut r1_set) = (r0.working_set(), r1.working_set());
    tokio::join!(
        holds_throughout(
            "r0 keeps every member until r1 is ready",
            &mut r0_set,
            Duration::from_secs(2),
            |names| members(names).len() == MEMBERS.len(),
        ),
        holds_throughout(
            "r1 works on nothing before it is ready",
            &mut r1_set,
            Duration::from_secs(2),
            |names| members(names).is_empty(),
        ),
    );

    said.cancel();
    until_members(&r1, "r1 works on its share, r0 on the rest", |on| {
        on == r1_share
    })
    .await;
    until_members(&r0, "r1 works on its share, r0 on the rest", |on| {
        on == share_of("r0")
    })
    .await;
    assert_eq!(said_ready(&cp, "r1").await, Some(Some("true".to_string())));
    for (stop, task) in [(second_stop, second_task), (first_stop, first_task)] {
        stop.cancel();
        task.await.expect("manager task").expect("manager");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_never_says_delays_the_hand_over_by_the_inventory_wait() {
    let cp = ControlPlane::start().await.expect("control plane");
    let ready = CancellationToken::new();
    ready.cancel();
    let (first, r0, _) = replica(&cp, "r0", Some(ready), ShardingOptions::default()).await;
    let (first_stop, first_task) = run_manager(&first);
    until_members(&r0, "r0 works on every member", |on| {
        on.len() == MEMBERS.len()
    })
    .await;
    let (second, r1, _) = replica(
        &cp,
        "r1",
        None,
        ShardingOptions::default().inventory_wait(Duration::from_secs(3)),
    )
    .await;
    let (second_stop, second_task) = run_manager(&second);
    until_members(&r1, "r1 works on its share after the wait", |on| {
        on == share_of("r1")
    })
    .await;
    assert_eq!(said_ready(&cp, "r1").await, Some(Some("true".to_string())));
    for (stop, task) in [(second_stop, second_task), (first_stop, first_task)] {
        stop.cancel();
        task.await.expect("manager task").expect("manager");
    }
}

/// A replica that restarted is not ready at once, and its clusters that
/// nobody works on meanwhile (here one that joins the fleet then) are
/// worked on by the ready peer that stands in for it, until it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_peer_stands_in_for_one_that_restarted_until_it_is_ready() {
    let cp = ControlPlane::start().await.expect("control plane");
    let ready = CancellationToken::new();
    ready.cancel();
    let (first, r0, r0_clusters) =
        replica(&cp, "r0", Some(ready.clone()), ShardingOptions::default()).await;
    let (first_stop, first_task) = run_manager(&first);
    let (second, _, _) = replica(&cp, "r1", Some(ready), ShardingOptions::default()).await;
    let (second_stop, second_task) = run_manager(&second);
    until_members(&r0, "r0 works on its share", |on| on == share_of("r0")).await;
    // r1 stops (its peer Lease goes) and comes back, not ready yet.
    second_stop.cancel();
    second_task.await.expect("manager task").expect("manager");
    until_members(&r0, "r0 works on every member", |on| {
        on.len() == MEMBERS.len()
    })
    .await;
    let said = CancellationToken::new();
    let (again, r1, r1_clusters) =
        replica(&cp, "r1", Some(said.clone()), ShardingOptions::default()).await;
    let (again_stop, again_task) = run_manager(&again);
    wait_on(
        "r0 counts r1 as a peer again",
        &mut r0.peer_set(),
        |peers| peers.iter().any(|peer| peer.id == "r1"),
    )
    .await;
    // A cluster of r1's joins the fleet now: nobody works on it, and r1 is
    // not ready; r0 stands in.
    let late = (0..)
        .map(|i| format!("late-{i}"))
        .find(|name| {
            let peers = ["r0", "r1"].map(|id| Peer {
                id: id.to_string(),
                weight: 1,
            });
            owner(name, &peers).is_some_and(|peer| peer.id == "r1")
        })
        .expect("a name r1 owns");
    // r0 learns of it first: had r1 (which owns it, and takes what nobody
    // works on) learnt of it as early, either could have taken it first.
    r0_clusters
        .add(late.as_str(), cluster_for(&late, &cp).await)
        .expect("add");
    wait_on(
        "r0 works on the new cluster for r1",
        &mut r0.working_set(),
        |on| on.iter().any(|name| name.as_str() == late),
    )
    .await;
    r1_clusters
        .add(late.as_str(), cluster_for(&late, &cp).await)
        .expect("add");
    said.cancel();
    wait_on("r1 works on it once ready", &mut r1.working_set(), |on| {
        on.iter().any(|name| name.as_str() == late)
    })
    .await;
    for (stop, task) in [(again_stop, again_task), (first_stop, first_task)] {
        stop.cancel();
        task.await.expect("manager task").expect("manager");
    }
}

/// With fences held with the peer Lease, the replica working on a cluster
/// that a ready peer owns writes the fence as that peer's (one write, no
/// moment without a holder), and the peer starts on it without a request;
/// a fence handed for a cluster the peer does not know is cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_goes_straight_from_its_holder_to_a_ready_owner() {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    let cp = ControlPlane::start().await.expect("control plane");
    let with_peer = || ShardingOptions::default().fence_hold(FenceHold::WithPeer);
    let ready = CancellationToken::new();
    ready.cancel();
    let (first, r0, _) = replica(&cp, "r0", Some(ready.clone()), with_peer()).await;
    let (first_stop, first_task) = run_manager(&first);
    until_members(&r0, "r0 works on every member", |on| {
        on.len() == MEMBERS.len()
    })
    .await;

    // Every holder each fence of r1's share has from here on, in order.
    let leases: Api<Lease> = Api::namespaced(cp.client().await.expect("client"), "kube-system");
    let fences: Vec<String> = share_of("r1")
        .iter()
        .map(|name| r0.fence_name(&ClusterName::from(name.as_str())))
        .collect();
    let holders = Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let recording = {
        let (holders, fences) = (holders.clone(), fences.clone());
        let mut events = watcher(leases.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        tokio::spawn(async move {
            while let Some(Ok(fence)) = events.next().await {
                let name = fence.metadata.name.clone().unwrap_or_default();
                if fences.contains(&name) {
                    let holder = fence
                        .spec
                        .and_then(|spec| spec.holder_identity)
                        .unwrap_or_default();
                    holders.lock().expect("holders").push((name, holder));
                }
            }
        })
    };
    // Polled: the recording is the test's own watch of the API
    // server; nothing in the replicas tells of it.
    eventually(
        Polled::ApiServer,
        "the recording sees r0 hold each fence of r1's share",
        || async {
            let holders = holders.lock().expect("holders");
            fences.iter().all(|fence| {
                holders
                    .iter()
                    .any(|(name, holder)| name == fence && holder == "r0")
            })
        },
    )
    .await;

    let (second, r1, _) = replica(&cp, "r1", Some(ready), with_peer()).await;
    let (second_stop, second_task) = run_manager(&second);
    until_members(&r1, "r1 works on its share, r0 on the rest", |on| {
        on == share_of("r1")
    })
    .await;
    until_members(&r0, "r1 works on its share, r0 on the rest", |on| {
        on == share_of("r0")
    })
    .await;
    // Polled: the recording is the test's own watch of the API
    // server; nothing in the replicas tells of it.
    eventually(
        Polled::ApiServer,
        "the recording sees r1 hold each fence of its share",
        || async {
            let holders = holders.lock().expect("holders");
            fences.iter().all(|fence| {
                holders
                    .iter()
                    .any(|(name, holder)| name == fence && holder == "r1")
            })
        },
    )
    .await;
    recording.abort();
    for fence in &fences {
        let seen: Vec<String> = holders
            .lock()
            .expect("holders")
            .iter()
            .filter(|(name, _)| name == fence)
            .map(|(_, holder)| holder.clone())
            .collect();
        let first_r1 = seen.iter().position(|h| h == "r1").expect("r1 held it");
        assert!(
            seen[..first_r1].iter().all(|h| h == "r0"),
            "{fence} was not handed straight from r0 to r1: {seen:?}"
        );
    }

    // A fence handed to r1 for a cluster nobody knows: r1 clears it.
    let handed = leases.get(&fences[0]).await.expect("a handed fence");
    let stray = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some("mcr-shard-nowhere".to_string()),
            labels: handed.metadata.labels.clone(),
            annotations: handed.metadata.annotations.clone(),
            ..Default::default()
        },
        spec: handed.spec.clone(),
    };
    assert!(
        stray
            .metadata
            .labels
            .as_ref()
            .is_some_and(|labels| labels.contains_key("mcr.sigs.k8s.io/handed-to")),
        "the handed fence carries no hand-over label: {:?}",
        handed.metadata.labels
    );
    leases
        .create(&Default::default(), &stray)
        .await
        .expect("create the stray fence");
    // Polled: what is asked is the Lease on the API server, which
    // nothing in the process follows.
    eventually(
        Polled::ApiServer,
        "r1 clears the fence of a cluster it does not know",
        || async {
            leases
                .get("mcr-shard-nowhere")
                .await
                .ok()
                .and_then(|fence| fence.spec?.holder_identity)
                .is_none()
        },
    )
    .await;
    for (stop, task) in [(second_stop, second_task), (first_stop, first_task)] {
        stop.cancel();
        task.await.expect("manager task").expect("manager");
    }
}

/// A replica that stops hands each of its clusters straight to its next
/// owner, one by one, before its peer Lease goes (with fences held with
/// the peer Lease and the default options): the others do not wait for the
/// Lease to go and take each fence, and each cluster is worked on by one
/// replica or the next, without a gap for those takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_hands_each_cluster_to_its_next_owner_before_its_lease_goes() {
    use futures::StreamExt;
    use kube::runtime::watcher;

    let cp = ControlPlane::start().await.expect("control plane");
    let with_peer = || ShardingOptions::default().fence_hold(FenceHold::WithPeer);
    let ((r0, first_stop, first_task), (r1, second_stop, second_task)) =
        split_by_two(&cp, with_peer(), with_peer()).await;

    // Every change to r0's fences and its peer Lease from here on, in the
    // order the API server made them.
    let leases: Api<Lease> = Api::namespaced(cp.client().await.expect("client"), "kube-system");
    let fences: Vec<String> = share_of("r0")
        .iter()
        .map(|name| r0.fence_name(&ClusterName::from(name.as_str())))
        .collect();
    let events = Arc::new(std::sync::Mutex::new(Vec::<(String, Option<Lease>)>::new()));
    let recording = {
        let events = events.clone();
        let mut watched = watcher(leases.clone(), watcher::Config::default()).boxed();
        tokio::spawn(async move {
            while let Some(Ok(event)) = watched.next().await {
                let change = match event {
                    watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => {
                        (lease.metadata.name.clone().unwrap_or_default(), Some(lease))
                    }
                    watcher::Event::Delete(lease) => {
                        (lease.metadata.name.clone().unwrap_or_default(), None)
                    }
                    _ => continue,
                };
                events.lock().expect("events").push(change);
            }
        })
    };
    // Polled: the recording is the test's own watch of the API
    // server; nothing in the replicas tells of it.
    eventually(
        Polled::ApiServer,
        "the recording sees r0's peer Lease",
        || async {
            events
                .lock()
                .expect("events")
                .iter()
                .any(|(name, lease)| name == "mcr-peer-r0" && lease.is_some())
        },
    )
    .await;

    first_stop.cancel();
    first_task.await.expect("manager task").expect("manager");
    until_members(&r1, "r1 works on every member", |on| {
        on.len() == MEMBERS.len()
    })
    .await;
    // Polled: the recording is the test's own watch of the API
    // server; nothing in the replicas tells of it.
    eventually(
        Polled::ApiServer,
        "the recording sees r0's peer Lease deleted",
        || async {
            events
                .lock()
                .expect("events")
                .iter()
                .any(|(name, lease)| name == "mcr-peer-r0" && lease.is_none())
        },
    )
    .await;
    recording.abort();
    let events = events.lock().expect("events").clone();
    let deleted = events
        .iter()
        .position(|(name, lease)| name == "mcr-peer-r0" && lease.is_none())
        .expect("deleted");
    let said_leaving = events[..deleted].iter().any(|(name, lease)| {
        name == "mcr-peer-r0"
            && lease.as_ref().is_some_and(|lease| {
                lease
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|annotations| {
                        annotations
                            .get("mcr.sigs.k8s.io/leaving")
                            .map(String::as_str)
                            == Some("true")
                    })
            })
    });
    assert!(said_leaving, "r0's peer Lease never said it was leaving");
    for fence in &fences {
        let handed = events[..deleted].iter().find_map(|(name, lease)| {
            let lease = lease.as_ref().filter(|_| name == fence)?;
            let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
            (holder == "r1").then_some(lease)
        });
        let Some(handed) = handed else {
            panic!("{fence} was not held by r1 before r0's peer Lease went");
        };
        let handed_by = handed
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get("mcr.sigs.k8s.io/handed-by"));
        assert_eq!(
            handed_by.map(String::as_str),
            Some("r0"),
            "{fence} was taken by r1, not handed over by r0"
        );
    }
    second_stop.cancel();
    second_task.await.expect("manager task").expect("manager");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stops_before_handing_over_leaves_its_clusters_to_its_heirs() {
    let cp = ControlPlane::start().await.expect("control plane");
    // r0 hands nothing over as it stops: everything it works on is left
    // behind, as when its hand-over time runs out.
    let no_hand_over = ShardingOptions::default()
        .fence_hold(FenceHold::WithPeer)
        .leave_handover(Duration::ZERO);
    let with_peer = ShardingOptions::default().fence_hold(FenceHold::WithPeer);
    let ((r0, first_stop, first_task), (r1, second_stop, second_task)) =
        split_by_two(&cp, no_hand_over, with_peer).await;
    // Once its share settled, r1 follows the fences with a watch.
    tokio::time::timeout(Duration::from_secs(60), r1.until_following_fences())
        .await
        .expect("r1 follows the fences within a minute");

    first_stop.cancel();
    first_task.await.expect("manager task").expect("manager");
    until_members(&r1, "r1 works on every member", |on| {
        on.len() == MEMBERS.len()
    })
    .await;
    // It found what it inherited in what it follows: no list.
    assert_eq!(r1.inheritance_lists(), 0);
    // r0's Lease is kept, ended, naming r1 the heir of what it held.
    let leases: Api<Lease> = Api::namespaced(cp.client().await.expect("client"), "kube-system");
    let peer = leases.get("mcr-peer-r0").await.expect("r0's peer Lease");
    assert_eq!(
        peer.spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.as_deref()),
        None,
        "r0's epoch did not end"
    );
    let heirs = peer
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get("mcr.sigs.k8s.io/heirs"))
        .cloned()
        .unwrap_or_default();
    assert!(
        heirs.contains("\"r1\""),
        "r0's Lease names no heir r1: {heirs}"
    );
    // r1 writes each fence it inherited as its own, naming r0; a take of
    // a freed fence would not.
    for name in share_of("r0") {
        let fence = r0.fence_name(&ClusterName::from(name.as_str()));
        // Polled: what is asked is the Lease on the API server, which
        // nothing in the process follows.
        eventually(
            Polled::ApiServer,
            "r1 writes the inherited fence as its own",
            || async {
                let lease = leases.get(&fence).await.expect("fence");
                let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
                let from = lease
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("mcr.sigs.k8s.io/inherited-from").cloned());
                holder.as_deref() == Some("r1") && from.as_deref() == Some("r0")
            },
        )
        .await;
    }
    second_stop.cancel();
    second_task.await.expect("manager task").expect("manager");
}
