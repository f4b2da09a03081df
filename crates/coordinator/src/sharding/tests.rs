//! The sharded coordinator's unit tests, on an offline client or a real
//! control plane.

use std::time::Duration;

use crate::wire;

use super::*;

#[test]
fn the_defaults_are_gos_and_valid() {
    let options = ShardingOptions::default();
    assert!(options.check().is_ok());
    assert_eq!(options.namespace, "kube-system");
    assert_eq!(options.peer_prefix, "mcr-peer");
    assert_eq!(options.fence_prefix, "mcr-shard");
    assert_eq!(options.fence_lease_duration, Duration::from_secs(20));
    assert_eq!(options.probe_interval, Duration::from_secs(5));
}

fn offline_client() -> kube::Client {
    let config = kube::Config::new("https://127.0.0.1:1".parse().expect("uri"));
    kube::Client::try_from(config).expect("client")
}

/// Replica "me", its API server never reachable.
fn replica_me() -> ShardedCoordinator {
    ShardedCoordinator::new(
        offline_client(),
        ShardingOptions::default().peer_id("me".to_string()),
    )
    .expect("coordinator")
}

/// Replica "me" with a live standing, and what a fence held with that
/// standing says it is held with.
fn standing_replica() -> (ShardedCoordinator, CancellationToken, String) {
    let coordinator = replica_me();
    let live = CancellationToken::new();
    coordinator.inner.standing.send_modify(|standing| {
        standing.live = Some(live.clone());
    });
    let held_with = {
        let standing = coordinator.inner.standing.borrow();
        standing.held_with()
    };
    (coordinator, live, held_with)
}

/// A fence of `cluster` handed to "me" with `held_with`, by `by`.
fn handed_fence(held_with: &str, cluster: &str, by: Option<&str>) -> Lease {
    let mut annotations = std::collections::BTreeMap::from([
        (
            wire::HELD_WITH_ANNOTATION.to_string(),
            held_with.to_string(),
        ),
        (wire::CLUSTER_ANNOTATION.to_string(), cluster.to_string()),
    ]);
    if let Some(by) = by {
        annotations.insert(wire::HANDED_BY_ANNOTATION.to_string(), by.to_string());
    }
    Lease {
        metadata: kube::api::ObjectMeta {
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some("me".to_string()),
            ..Default::default()
        }),
    }
}

/// Engages `cluster` (never reachable) with no components.
fn engage_offline(coordinator: &ShardedCoordinator, cluster: &str) {
    coordinator
        .engage(
            CancellationToken::new(),
            ClusterName::from(cluster),
            Cluster::new(cluster, offline_client()),
            &[],
        )
        .expect("engage");
}

#[tokio::test]
async fn a_fence_handed_over_names_its_cluster_so_that_the_receiver_finds_it() {
    let coordinator = replica_me();
    let peer = Peer {
        id: "p".to_string(),
        weight: 1,
    };
    let next = lease::Next {
        holder: "p".to_string(),
        held_with: "mcr-peer-p/e1".to_string(),
        duration: Duration::from_secs(20),
        cluster: String::new(),
    };
    let look = Look {
        next: std::collections::HashMap::from([("p".to_string(), next)]),
        ..Look::default()
    };
    // The local cluster (shown as `<local>`), a plain name, and one
    // whose fence name is hashed.
    for name in ["", "zoo", "Team/Prod_1"] {
        let name = ClusterName::from(name);
        let handed = look.next_for(Some(&peer), &name).expect("handed");
        assert_eq!(
            coordinator.fence_name(&ClusterName::from(handed.cluster.as_str())),
            coordinator.fence_name(&name),
            "{name:?}"
        );
    }
    assert!(look.next_for(None, &ClusterName::from("zoo")).is_none());
}

#[tokio::test]
async fn a_fence_handed_over_is_taken_up_at_once_but_not_while_stopping() {
    let (coordinator, _live, held_with) = standing_replica();
    let handed_for = |cluster: &str| handed_fence(&held_with, cluster, None);
    // This replica alone: it owns both clusters.
    for cluster in ["one", "two"] {
        engage_offline(&coordinator, cluster);
    }
    let one = ClusterName::from("one");
    coordinator
        .arrived(coordinator.fence_name(&one), handed_for("one"))
        .await;
    assert_eq!(coordinator.working_on(), Some(vec![one]));
    coordinator.inner.lifecycle.advance(Phase::Stopping);
    let two = ClusterName::from("two");
    coordinator
        .arrived(coordinator.fence_name(&two), handed_for("two"))
        .await;
    assert_eq!(
        coordinator.working_on(),
        Some(vec![ClusterName::from("one")]),
        "a fence handed while stopping was taken up"
    );
}

#[tokio::test]
async fn a_retry_left_on_a_cluster_owned_by_another_does_not_hurry_the_next_look() {
    let coordinator = replica_me();
    let name = ClusterName::from("elsewhere");
    let cluster = Cluster::new("elsewhere", offline_client());
    coordinator
        .engage(CancellationToken::new(), name.clone(), cluster, &[])
        .expect("engage");
    // A take that failed while this replica still thought it owned the
    // cluster (before it knew its peers, say).
    let generation = coordinator
        .inner
        .working
        .generation_of(&name)
        .expect("held");
    coordinator.retry_later(&name, generation);
    tokio::time::sleep(coordinator.inner.options.fence_retry_delay).await;
    // The peers are known now, and another owns the cluster.
    let other = Peer {
        id: "other".to_string(),
        weight: 1,
    };
    let peers = [coordinator.inner.me.clone(), other.clone()];
    let peers: Vec<Peer> = if owner_of(name.as_str(), &peers) == Some(&other) {
        peers.to_vec()
    } else {
        // Make `other` win: weight it far above this replica.
        vec![
            coordinator.inner.me.clone(),
            Peer {
                weight: u32::MAX,
                ..other
            },
        ]
    };
    assert_eq!(
        owner(name.as_str(), &peers).map(|p| p.id.as_str()),
        Some("other")
    );
    assert!(matches!(
        coordinator.inner.working.decide(
            &name,
            &Look {
                peers: peers.to_vec(),
                ..Look::default()
            },
            &coordinator.rules()
        ),
        Step::Nothing
    ));
    let next = coordinator.next_look();
    assert!(
        next > Instant::now(),
        "a stale retry of a cluster this replica does not own makes the loop look again at once, over and over"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fence_found_busy_again_and_again_is_tried_less_often() {
    let coordinator = replica_me();
    let name = ClusterName::from("joined");
    coordinator
        .engage(
            CancellationToken::new(),
            name.clone(),
            Cluster::new("joined", offline_client()),
            &[],
        )
        .expect("engage");
    let generation = coordinator
        .inner
        .working
        .generation_of(&name)
        .expect("held");
    let delay = |coordinator: &ShardedCoordinator| {
        coordinator.retry_busy_later(&name, generation);
        let retry_at = coordinator.inner.working.retry_at(&name).expect("a retry");
        (retry_at - Instant::now()).as_millis()
    };
    let delays: Vec<u128> = (0..6).map(|_| delay(&coordinator)).collect();
    // 750 ms doubled each time, up to the look every 5 s.
    assert_eq!(delays, [750, 1500, 3000, 5000, 5000, 5000]);
    // Another replica's cluster now: the count starts over.
    let other = Peer {
        id: "other".to_string(),
        weight: u32::MAX,
    };
    let peers = [coordinator.inner.me.clone(), other];
    assert!(matches!(
        coordinator.inner.working.decide(
            &name,
            &Look {
                peers: peers.to_vec(),
                ..Look::default()
            },
            &coordinator.rules()
        ),
        Step::Nothing
    ));
    assert_eq!(delay(&coordinator), 750);
}

#[tokio::test]
async fn a_fence_taken_again_is_not_released_by_an_earlier_failed_release() {
    let coordinator = ShardedCoordinator::new(
        offline_client(),
        ShardingOptions::default()
            .peer_id("me".to_string())
            .fence_hold(FenceHold::WithPeer)
            .fence_renew_interval(Duration::from_millis(200)),
    )
    .expect("coordinator");
    let standing = CancellationToken::new();
    let (again, other) = (ClusterName::from("again"), ClusterName::from("other"));
    for name in [&again, &other] {
        let cluster = Cluster::new(name.clone(), offline_client());
        coordinator
            .engage(CancellationToken::new(), name.clone(), cluster, &[])
            .expect("engage");
    }
    // Both fences failed to be released earlier; `again` has been
    // taken again since and is worked on here.
    for name in [&again, &other] {
        let fence = fence::Fence::held_with_peer(&coordinator.fence_name(name), &standing);
        coordinator.inner.working.keep_unreleased(fence);
    }
    let fence = fence::Fence::held_with_peer(&coordinator.fence_name(&again), &standing);
    let started = coordinator.inner.working.start(&again, None, fence, None);
    assert!(matches!(started, working_set::Starting::Started(_)));
    coordinator.release_again().await;
    // The API server is unreachable, so a release that is tried fails
    // and comes back; the one taken again must not have been tried.
    let left: Vec<String> = coordinator
        .inner
        .working
        .take_unreleased()
        .iter()
        .map(|fence| fence.name.clone())
        .collect();
    assert_eq!(left, [coordinator.fence_name(&other)]);
}

type Spoil = fn(&mut ShardingOptions);

/// A replica "me" in a live standing, with twelve clusters whose fences
/// "gone" held in its epoch "e1", and the peer Lease of "gone" as its
/// end left it: naming "me" and "q" its heirs.
struct Inheritance {
    _cp: multicluster_envtest::ControlPlane,
    coordinator: ShardedCoordinator,
    api: Api<Lease>,
    clusters: Vec<String>,
    /// `<peer Lease>/<epoch>` of "me".
    mine: String,
    /// The clusters whose heir is "me", sorted.
    mine_to_inherit: Vec<String>,
    gone: Lease,
}

async fn inheritance() -> Inheritance {
    let cp = multicluster_envtest::ControlPlane::start()
        .await
        .expect("control plane");
    let client = cp.client().await.expect("client");
    let options = ShardingOptions::default()
        .peer_id("me".to_string())
        .fence_hold(FenceHold::WithPeer);
    let coordinator = ShardedCoordinator::new(client, options).expect("coordinator");
    coordinator.inner.standing.send_modify(|standing| {
        standing.live = Some(CancellationToken::new());
    });
    let mine = {
        let standing = coordinator.inner.standing.borrow();
        standing.held_with()
    };
    let api = coordinator.inner.leases.clone();
    let clusters: Vec<String> = (0..12).map(|i| format!("shard-{i}")).collect();
    // Every fence held by "gone" in the epoch that ended.
    for cluster in &clusters {
        engage_offline(&coordinator, cluster);
        let fence = coordinator.fence_name(&ClusterName::from(cluster.as_str()));
        let taken = lease::take(
            &lease::Taking {
                api: &api,
                name: &fence,
                me: "gone",
                duration: Duration::from_secs(30),
                held_with: Some("mcr-peer-gone/e1"),
            },
            &lease::NothingKnown,
            None,
        )
        .await
        .expect("take");
        assert!(matches!(taken, lease::Taken::Yes(_)));
    }
    // Its end named "me" (in its current epoch) and "q" its heirs.
    let record = heirs::Record::new(
        "gone",
        "e1",
        vec![
            heirs::HeirPeer {
                id: "me".to_string(),
                weight: 1,
                held_with: mine.clone(),
            },
            heirs::HeirPeer {
                id: "q".to_string(),
                weight: 1,
                held_with: "mcr-peer-q/q1".to_string(),
            },
        ],
    );
    let mut mine_to_inherit: Vec<String> = clusters
        .iter()
        .filter(|cluster| record.heir_for(cluster).is_some_and(|heir| heir.id == "me"))
        .cloned()
        .collect();
    mine_to_inherit.sort();
    assert!(
        !mine_to_inherit.is_empty() && mine_to_inherit.len() < clusters.len(),
        "the heirs do not share the fences: {mine_to_inherit:?}"
    );
    let mut gone = lease::tests::peer_lease("mcr-peer-gone", "gone", "e1", 60);
    gone.spec.as_mut().expect("spec").holder_identity = None;
    let value = heirs::annotation_with(&gone, record, Timestamp::now()).expect("record");
    gone.metadata
        .annotations
        .get_or_insert_default()
        .insert(wire::HEIRS_ANNOTATION.to_string(), value);
    Inheritance {
        _cp: cp,
        coordinator,
        api,
        clusters,
        mine,
        mine_to_inherit,
        gone,
    }
}

/// How many lists of inherited fences `coordinator` needed.
fn lists(coordinator: &ShardedCoordinator) -> usize {
    coordinator.inner.inheritance.lists()
}

fn working_on(coordinator: &ShardedCoordinator) -> Vec<String> {
    let mut working: Vec<String> = coordinator
        .working_on()
        .unwrap_or_default()
        .iter()
        .map(|name| name.to_string())
        .collect();
    working.sort();
    working
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_heir_works_on_what_it_inherits_before_writing_it_and_writes_it_later() {
    let Inheritance {
        _cp,
        coordinator,
        api,
        clusters,
        mine,
        mine_to_inherit,
        gone,
    } = inheritance().await;
    assert!(lock(coordinator.inner.view.epochs()).record(&[gone], Timestamp::now()));

    let holder_of = |cluster: &str| {
        let (api, fence) = (
            api.clone(),
            coordinator.fence_name(&ClusterName::from(cluster)),
        );
        async move { api.get(&fence).await.expect("fence") }
    };
    let working = || working_on(&coordinator);
    let all_still_name_gone = |why: &'static str| {
        let holder_of = &holder_of;
        let clusters = &clusters;
        async move {
            for cluster in clusters {
                let fence = holder_of(cluster).await;
                assert_eq!(lease::holder_of(&fence), Some("gone"), "{cluster}: {why}");
            }
        }
    };
    // Without its watch of the Leases, it lists them.
    coordinator.inherit().await;
    assert_eq!(lists(&coordinator), 1);
    assert_eq!(
        working(),
        mine_to_inherit,
        "not working on what it inherited"
    );
    all_still_name_gone("its fence was written before the work started").await;

    // Its peer Lease went unrenewed a while, in the same epoch: the
    // work stops, and resumes without a write.
    let stop = CancellationToken::new();
    coordinator.inner.standing.send_modify(|standing| {
        if let Some(live) = standing.live.replace(CancellationToken::new()) {
            live.cancel();
        }
    });
    coordinator.balance(&stop).await;
    assert_eq!(coordinator.working_on().unwrap_or_default(), Vec::new());
    // The test drives the looks itself (no `run`): each one is a step
    // of the replica, and the standing comes back with the next read.
    let deadline = Instant::now() + Duration::from_secs(30);
    while working() != mine_to_inherit {
        assert!(Instant::now() < deadline, "not resumed: {:?}", working());
        tokio::time::sleep(Duration::from_millis(50)).await;
        coordinator.balance(&stop).await;
    }
    all_still_name_gone("its fence was written to resume the work").await;

    // The next look writes what it inherited as its own, and finds the
    // rest held by the other heir (whose epoch it has not seen end).
    coordinator.balance(&stop).await;
    for cluster in &clusters {
        let fence = holder_of(cluster).await;
        let inherited_from = fence
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(wire::INHERITED_FROM_ANNOTATION))
            .cloned();
        if mine_to_inherit.contains(cluster) {
            assert_eq!(lease::holder_of(&fence), Some("me"), "{cluster}");
            assert_eq!(lease::held_with_of(&fence), Some(mine.as_str()));
            assert_eq!(inherited_from.as_deref(), Some("gone"), "{cluster}");
        } else {
            assert_eq!(
                lease::holder_of(&fence),
                Some("gone"),
                "{cluster} taken from q"
            );
        }
    }
    assert_eq!(working(), mine_to_inherit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_heir_finds_what_it_inherits_in_its_watch_of_the_leases_without_a_list() {
    let inheritance = inheritance().await;
    let (coordinator, api) = (&inheritance.coordinator, &inheritance.api);
    let mirror = coordinator.inner.inheritance.mirror().clone();
    let following = tokio::spawn({
        let (mirror, api) = (mirror.clone(), api.clone());
        async move { mirror.follow(api).await }
    });
    tokio::time::timeout(Duration::from_secs(30), mirror.until_synced())
        .await
        .expect("the watch lists the Leases within 30 s");
    // The end is written, and the peer read learns of it from what the
    // write answered: the watch shows it a moment later.
    let gone = api
        .create(&kube::api::PostParams::default(), &inheritance.gone)
        .await
        .expect("the end of gone's epoch");
    assert!(lock(coordinator.inner.view.epochs()).record(&[gone], Timestamp::now()));

    coordinator.inherit().await;
    assert_eq!(lists(coordinator), 0);
    assert_eq!(working_on(coordinator), inheritance.mine_to_inherit);
    for cluster in &inheritance.clusters {
        let fence = api
            .get(&coordinator.fence_name(&ClusterName::from(cluster.as_str())))
            .await
            .expect("fence");
        assert_eq!(lease::holder_of(&fence), Some("gone"), "{cluster} written");
    }
    following.abort();
}

#[tokio::test]
async fn a_look_under_way_at_the_stop_leaves_every_cluster_to_the_hand_back() {
    let (coordinator, live, _) = standing_replica();
    let one = ClusterName::from("one");
    let lifetime = CancellationToken::new();
    coordinator
        .engage(
            lifetime.clone(),
            one.clone(),
            Cluster::new("one", offline_client()),
            &[],
        )
        .expect("engage");
    let fence = fence::Fence::held_with_peer(&coordinator.fence_name(&one), &live);
    let started = coordinator.inner.working.start(&one, None, fence, None);
    assert!(matches!(started, working_set::Starting::Started(_)));
    // The manager stops: the clusters' lifetimes end with it.
    let stop = CancellationToken::new();
    stop.cancel();
    lifetime.cancel();
    let handed = coordinator
        .balance_one(&one, &Look::default(), &|| false, &stop)
        .await;
    assert!(!handed);
    let held = coordinator.inner.working.is_held(&one);
    assert!(
        held,
        "the fence was let go of one by one, not left to the hand-back"
    );
}

fn peer(id: &str) -> Peer {
    Peer {
        id: id.to_string(),
        weight: 1,
    }
}

fn handed_to(id: &str) -> lease::Next {
    let held_with = format!("mcr-peer-{id}/e1");
    lease::Next {
        holder: id.to_string(),
        held_with,
        duration: Duration::from_secs(20),
        cluster: String::new(),
    }
}

/// A cluster whose owner among `peers` is `id`.
fn owned_by(id: &str, peers: &[Peer]) -> String {
    (0..)
        .map(|i| format!("c{i}"))
        .find(|name| owner_of(name, peers).is_some_and(|peer| peer.id == id))
        .expect("some cluster")
}

#[tokio::test]
async fn a_fence_handed_by_its_owner_is_taken_up_but_one_handed_to_a_leaving_replica_goes_on() {
    let (coordinator, _live, held_with) = standing_replica();
    // As far as this replica has read, "x" is a peer like any other.
    coordinator.inner.view.read_as(vec![peer("me"), peer("x")]);
    let of_x = owned_by("x", &[peer("me"), peer("x")]);
    let handed_by_x = |cluster: &str| handed_fence(&held_with, cluster, Some("x"));
    engage_offline(&coordinator, &of_x);
    // "x" let it go (it leaves, and this replica has not read that yet):
    // not handed back to it.
    let name = ClusterName::from(of_x.as_str());
    coordinator
        .arrived(coordinator.fence_name(&name), handed_by_x(&of_x))
        .await;
    assert_eq!(coordinator.working_on(), Some(vec![name]));

    // Leaving itself, this replica passes a fence handed to it on.
    let another = (0..)
        .map(|i| format!("d{i}"))
        .find(|name| owner_of(name, &[peer("me"), peer("x")]).is_some_and(|p| p.id == "x"))
        .expect("some cluster");
    engage_offline(&coordinator, &another);
    coordinator.inner.lifecycle.advance(Phase::SaidLeaving);
    let name = ClusterName::from(another.as_str());
    coordinator
        .arrived(coordinator.fence_name(&name), handed_by_x(&another))
        .await;
    assert!(
        !coordinator.working_on().unwrap_or_default().contains(&name),
        "a leaving replica took up a fence handed to it"
    );
}

#[test]
fn a_leaving_replica_hands_each_cluster_to_its_next_owner_or_its_keeper() {
    // "me" leaves; "a" is ready; "j" has joined but is not ready.
    let look = Look {
        peers: vec![peer("a"), peer("j"), peer("me")],
        joining: ["j".to_string()].into(),
        ready: vec![peer("a"), peer("me")],
        next: [("a".to_string(), handed_to("a"))].into(),
        ..Look::default()
    };
    let others = [peer("a"), peer("j")];
    let for_a = ClusterName::from(owned_by("a", &others).as_str());
    let for_j = ClusterName::from(owned_by("j", &others).as_str());
    let next = look.hand_over_to(&for_a, "me").expect("handed to a");
    assert_eq!(
        (next.holder.as_str(), next.cluster.as_str()),
        ("a", for_a.as_str())
    );
    // The joining owner's cluster goes to the ready peer that keeps it.
    let next = look.hand_over_to(&for_j, "me").expect("kept by a");
    assert_eq!(next.holder, "a");
    // Nobody ready to take it: freed with the peer Lease instead.
    let alone = Look {
        next: std::collections::HashMap::new(),
        ..look
    };
    assert!(alone.hand_over_to(&for_a, "me").is_none());
}

#[test]
fn a_cluster_a_leaving_peer_holds_is_waited_for_not_asked_for() {
    let look = Look {
        peers: vec![peer("a"), peer("me")],
        leaving: ["x".to_string()].into(),
        with_leaving: vec![peer("a"), peer("me"), peer("x")],
        ..Look::default()
    };
    let all = [peer("a"), peer("me"), peer("x")];
    assert!(look.awaits_hand_over(&owned_by("x", &all)));
    assert!(!look.awaits_hand_over(&owned_by("me", &all)));
    let nobody_leaves = Look {
        peers: vec![peer("a"), peer("me")],
        ..Look::default()
    };
    assert!(!nobody_leaves.awaits_hand_over(&owned_by("x", &all)));
}

#[test]
fn invalid_options_are_named() {
    let cases: [(Spoil, &str); 5] = [
        (
            |o| o.peer_prefix = "Peers!".into(),
            "peer_prefix \"Peers!\"",
        ),
        (|o| o.fence_prefix = String::new(), "fence_prefix \"\""),
        (|o| o.namespace = String::new(), "namespace is empty"),
        (
            |o| o.fence_renew_interval = o.fence_lease_duration,
            "the fence renew interval (20s) must be above zero and below the fence lease duration (20s)",
        ),
        (
            |o| o.peer_renew_interval = Duration::ZERO,
            "the peer renew interval (0ns)",
        ),
    ];
    for (spoil, message) in cases {
        let mut options = ShardingOptions::default();
        spoil(&mut options);
        let err = options.check().expect_err(message).to_string();
        assert!(err.starts_with("sharding options: "), "{err}");
        assert!(err.contains(message), "{err} does not contain {message}");
    }
}

#[tokio::test]
async fn once_the_fences_are_collected_to_hand_back_no_fence_is_held_again() {
    let (coordinator, live, _) = standing_replica();
    let names: Vec<ClusterName> = ["taken", "handed", "inherited"]
        .into_iter()
        .map(ClusterName::from)
        .collect();
    for name in &names {
        let cluster = Cluster::new(name.clone(), offline_client());
        coordinator
            .engage(CancellationToken::new(), name.clone(), cluster, &[])
            .expect("engage");
    }
    let working = &coordinator.inner.working;
    assert!(working.hand_back_all().is_empty());
    // What a take, a fence handed over and an inheritance found at that
    // moment would hold: none of it would be handed back.
    let generation = working.generation_of(&names[0]).expect("engaged");
    let until = Timestamp::now() + std::time::Duration::from_secs(60);
    let attempts = [
        (&names[0], Some(generation), None),
        (&names[1], None, None),
        (&names[2], None, Some(until)),
    ];
    for (name, generation, inherited_until) in attempts {
        let fence = fence::Fence::held_with_peer(&coordinator.fence_name(name), &live);
        let started = working.start(name, generation, fence, inherited_until);
        assert!(
            matches!(started, working_set::Starting::HandingBack(_)),
            "{name} was held after the hand-back collected the fences"
        );
        assert!(!working.is_held(name));
    }
    assert!(working.working_on().is_empty());
}
