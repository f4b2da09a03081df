//! Unit tests of the Lease reads and writes.

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
pub(crate) fn peer_lease(name: &str, holder: &str, epoch: &str, renewed_secs_ago: i64) -> Lease {
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
