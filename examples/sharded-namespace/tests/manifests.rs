//! `config/sharded-namespace`: the manifests render, apply to a real API
//! server, and their RBAC — namespaces and ConfigMaps read cluster-wide,
//! ConfigMaps written only where the writer role is bound, nothing in a
//! system namespace, Leases only in the replicas' namespace — is enough for two
//! replicas run with the Deployment's own flags (each its own pod name) to
//! share the fleet; the second instance, with its own namespace and watch
//! filter, works only on its clusters and is never the first one's peer.

use multicluster_runtime::testing::Polled;
use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_example_testing::manifests::{
    Container, apply, bind_in, can_i, container, render, run_as_deployed,
};
use multicluster_example_testing::{GRACE, terminate, wait_for_copy_in};
use multicluster_provider_namespace::WATCH_FILTER_LABEL;
use multicluster_runtime::testing::{eventually, http_get};

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-sharded-namespace");
const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../config/sharded-namespace"
);

/// The Deployment's container as its pod `pod` would run it.
fn as_pod(container: &Container, pod: &str) -> Container {
    Container {
        namespace: container.namespace.clone(),
        service_account: container.service_account.clone(),
        args: container.args.clone(),
        env: container
            .env
            .iter()
            .map(|(key, value)| {
                let value = if key == "PEER_ID" {
                    pod.to_string()
                } else {
                    value.clone()
                };
                (key.clone(), value)
            })
            .collect(),
    }
}

/// The fleet's clusters the replica at `address` works on.
async fn working_on(address: std::net::SocketAddr) -> BTreeSet<String> {
    let (_, body) = http_get(address, "/clusters").await.unwrap_or_default();
    body.lines()
        .filter_map(|line| {
            let mut columns = line.split('\t');
            let (name, state) = (columns.next()?, columns.next()?);
            state.ends_with("worked on here").then_some(name)
        })
        .filter(|name| name.starts_with("team-"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_deploy_with_the_least_privilege_and_instances_stay_apart() {
    let cp = ControlPlane::start().await.expect("control plane");
    let dir = tempfile::tempdir().expect("dir");
    let admin = cp.client().await.expect("client");
    let teams = ["team-1", "team-2", "team-3", "team-4", "team-5", "team-6"];
    for name in teams.iter().chain(&["team-b"]) {
        let labels = (*name == "team-b")
            .then(|| [(WATCH_FILTER_LABEL.to_string(), "instance-b".to_string())].into());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels,
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
    }

    let (base_yaml, base) = render(&format!("{CONFIG}/base")).await;
    let (second_yaml, second) = render(&format!("{CONFIG}/second-instance")).await;
    apply(&cp, &base_yaml).await;
    apply(&cp, &second_yaml).await;
    let (a, b) = (container(&base), container(&second));
    assert_ne!(a.namespace, b.namespace);
    // Each instance writes only where its writer role is bound.
    for team in teams.iter().chain(&["team-b"]) {
        bind_in(&cp, team, "multicluster-sharded-writer", &a).await;
    }
    bind_in(&cp, "team-b", "multicluster-sharded-writer-b", &b).await;

    // Two replicas of the first instance, as two pods.
    let (mut first, first_address) = run_as_deployed(
        BINARY,
        &cp,
        &as_pod(&a, "multicluster-sharded-0"),
        dir.path(),
    )
    .await;
    let (mut second_replica, second_address) = run_as_deployed(
        BINARY,
        &cp,
        &as_pod(&a, "multicluster-sharded-1"),
        dir.path(),
    )
    .await;
    let (mut other, other_address) = run_as_deployed(
        BINARY,
        &cp,
        &as_pod(&b, "multicluster-sharded-b-0"),
        dir.path(),
    )
    .await;
    for team in teams {
        wait_for_copy_in(admin.clone(), team, "settings").await;
    }
    wait_for_copy_in(admin.clone(), "team-b", "for-b").await;

    // The first instance's replicas share its fleet (which also holds
    // team-b: it has no watch filter), each cluster worked on by one; the
    // second instance works on team-b alone.
    let all: BTreeSet<String> = teams
        .iter()
        .chain(&["team-b"])
        .map(|t| t.to_string())
        .collect();
    eventually(
        Polled::OtherProcess,
        "the first instance's replicas to split its fleet",
        || async {
            let (one, two) = (
                working_on(first_address).await,
                working_on(second_address).await,
            );
            !one.is_empty()
                && !two.is_empty()
                && one.is_disjoint(&two)
                && one.union(&two).cloned().collect::<BTreeSet<_>>() == all
        },
    )
    .await;
    eventually(
        Polled::OtherProcess,
        "the second instance to work on team-b alone",
        || async { working_on(other_address).await == BTreeSet::from(["team-b".to_string()]) },
    )
    .await;

    // And no more: no Secrets, no Leases outside its own namespace.
    for instance in [&a, &b] {
        let own = instance.namespace.as_str();
        assert!(can_i(&cp, instance, &["update", "leases", "-n", own]).await);
        for what in [
            &["get", "secrets", "-n", own][..],
            &["list", "secrets", "-A"],
            &["update", "leases", "-n", "kube-system"],
            &["update", "leases", "-n", "default"],
            &["patch", "configmaps", "-n", "default"],
            &["update", "configmaps", "-n", "team-b"],
            &["create", "namespaces"],
            &["list", "pods", "-A"],
        ] {
            assert!(
                !can_i(&cp, instance, what).await,
                "{} may {what:?}",
                instance.service_account
            );
        }
    }

    for child in [&mut first, &mut second_replica, &mut other] {
        let status = terminate(child, GRACE + Duration::from_secs(5)).await;
        assert!(status.success(), "{status}");
    }
}
