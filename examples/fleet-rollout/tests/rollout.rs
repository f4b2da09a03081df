//! The example binary on a hub and two members (kubeconfig Secrets): it
//! installs its CRD; a FleetDeployment reaches both members one at a time
//! (25 % of two is less than one: one slot), each only once the other's
//! Deployment is available (the members run no Deployment controller: the
//! test plays it, as the real one writes its status); `kubectl get
//! fleetdeployments` shows the progress; paused, a new image reaches no
//! member until resumed; with `--otlp-endpoint`, its traces reach a real
//! Jaeger, each member's apply beneath the hub reconcile that gave it its
//! slot. Two replicas run with `--shard` share the
//! members, each rolling out to its own, one member at a time between
//! them.

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use multicluster_coordinator::sharding::{Peer, owner};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::jaeger::Jaeger;
use multicluster_envtest::played::Deployments;
use multicluster_example_testing::{GRACE, kubeconfig_secret, terminate};
use multicluster_runtime::testing::{Polled, eventually, eventually_some};
use serde_json::{Value, json};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-fleet-rollout");

/// How long the played Deployment controller takes to roll a spec out.
const ROLL_TIME: Duration = Duration::from_secs(1);

fn fleet_deployments() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "fleet.example",
        "v1alpha1",
        "FleetDeployment",
    ))
}

fn image(tag: &str) -> String {
    format!("registry.k8s.io/pause:{tag}")
}

/// The FleetDeployment's status (null until written).
async fn status(hub: &kube::Client) -> Value {
    Api::<DynamicObject>::namespaced_with(hub.clone(), "default", &fleet_deployments())
        .get_opt("web")
        .await
        .ok()
        .flatten()
        .map(|object| object.data["status"].clone())
        .unwrap_or_default()
}

/// Whether `member`'s Deployment runs `tag`, available.
async fn available_with(member: &ControlPlane, tag: &str) -> bool {
    let Ok(Some(deployment)) =
        Api::<Deployment>::namespaced(member.client().await.expect("client"), "default")
            .get_opt("web")
            .await
    else {
        return false;
    };
    let runs = deployment
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|pod| pod.containers.first())
        .and_then(|container| container.image.as_deref())
        == Some(image(tag).as_str());
    runs && deployment.status.is_some_and(|status| {
        status.observed_generation == deployment.metadata.generation
            && status.available_replicas == Some(1)
    })
}

/// Waits until both members run `tag`, available, and the status says the
/// rollout is done.
async fn rolled_out(hub: &kube::Client, a: &ControlPlane, b: &ControlPlane, tag: &str) {
    eventually(
        Polled::ApiServer,
        &format!("both members available with {tag}, the rollout done"),
        || async {
            let status = status(hub).await;
            available_with(a, tag).await
                && available_with(b, tag).await
                && status["rollout"]["updated"] == 2
                && status["rollout"]["updating"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
        },
    )
    .await;
}

/// A hub and two member control planes, the members as kubeconfig
/// Secrets on the hub (named as given), their Deployment controller played.
struct Fleet {
    hub_cp: ControlPlane,
    a: ControlPlane,
    b: ControlPlane,
    hub: kube::Client,
    played: Deployments,
}

impl Fleet {
    async fn start(names: [&str; 2]) -> Self {
        let (hub_cp, a, b) = tokio::join!(
            ControlPlane::start(),
            ControlPlane::start(),
            ControlPlane::start()
        );
        let (hub_cp, a, b) = (hub_cp.expect("hub"), a.expect("a"), b.expect("b"));
        hub_cp.create_namespace("fleet").await.expect("namespace");
        let hub = hub_cp.client().await.expect("client");
        for (name, member) in names.into_iter().zip([&a, &b]) {
            Api::<Secret>::namespaced(hub.clone(), "fleet")
                .create(
                    &PostParams::default(),
                    &kubeconfig_secret(name, member.kubeconfig()),
                )
                .await
                .expect("member Secret");
        }
        let played = Deployments::default();
        played.watch("a", a.client().await.expect("client"), ROLL_TIME);
        played.watch("b", b.client().await.expect("client"), ROLL_TIME);
        Self {
            hub_cp,
            a,
            b,
            hub,
            played,
        }
    }

    /// Runs the example on the hub, with `more` flags.
    fn example(&self, more: &[&str]) -> tokio::process::Child {
        Command::new(BINARY)
            .args(["--namespace", "fleet", "--health-address", "127.0.0.1:0"])
            .args(more)
            .env("KUBECONFIG", self.hub_cp.kubeconfig_path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("example")
    }

    /// Makes the FleetDeployment `web` with the image `tag` once the
    /// example has installed its CRD; its API.
    async fn make_web(&self, tag: &str) -> Api<DynamicObject> {
        let deployments = Api::<DynamicObject>::namespaced_with(
            self.hub.clone(),
            "default",
            &fleet_deployments(),
        );
        let mut web = DynamicObject::new("web", &fleet_deployments()).within("default");
        web.data = json!({"spec": {"image": image(tag)}});
        eventually(
            Polled::ApiServer,
            "the example to install its CRD, and the FleetDeployment made",
            || async {
                deployments
                    .create(&PostParams::default(), &web)
                    .await
                    .is_ok()
            },
        )
        .await;
        deployments
    }
}

/// The tests of this file one at a time: each runs three control planes,
/// six at once on two cores made their deadlines tight.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Gives the FleetDeployment `web` the image `tag`.
async fn set_image(deployments: &Api<DynamicObject>, tag: &str) {
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": image(tag)}})),
        )
        .await
        .expect("new image");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_deployment_rolls_out_one_member_at_a_time_and_pauses() {
    let _one = ONE_AT_A_TIME.lock().await;
    let jaeger = Jaeger::start(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/jaeger/build.sh"),
    )
    .await
    .expect("Jaeger");
    let fleet = Fleet::start(["a", "b"]).await;
    let Fleet {
        hub_cp,
        a,
        b,
        hub,
        played,
    } = &fleet;
    let mut example = fleet.example(&["--otlp-endpoint", &jaeger.otlp_endpoint()]);
    let deployments = fleet.make_web("v1").await;
    rolled_out(hub, a, b, "v1").await;
    assert_eq!(played.most_changing(), 1, "one member at a time");

    // `kubectl get` shows the progress, from the CRD's printer columns.
    let kubectl = multicluster_envtest::binaries::Binaries::locate()
        .expect("binaries")
        .kubectl;
    let shown = Command::new(kubectl)
        .args(["get", "fleetdeployments", "--namespace", "default"])
        .env("KUBECONFIG", hub_cp.kubeconfig_path())
        .output()
        .await
        .expect("kubectl");
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    let header: Vec<&str> = shown
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let row: Vec<&str> = shown
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "REVISION",
            "UPDATED",
            "TO",
            "GO",
            "HALTED",
            "PROPAGATED",
            "AGE"
        ],
        "{shown}"
    );
    assert_eq!(&row[..5], ["web", "1", "2", "0", "True"], "{shown}");

    // Paused, then a new image: no member gets it until resumed.
    let annotate = |paused: Option<&str>| {
        let patch = json!({"metadata": {"annotations": {multicluster_propagation::PAUSE_ANNOTATION: paused}}});
        let deployments = deployments.clone();
        async move {
            deployments
                .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("annotate");
        }
    };
    annotate(Some("true")).await;
    set_image(&deployments, "v2").await;
    let waiting = eventually_some(
        Polled::ApiServer,
        "the rollout of revision 2 paused",
        || async {
            let status = status(hub).await;
            let rollout = &status["rollout"];
            (rollout["revision"] == "2" && rollout["remaining"] == 2)
                .then(|| rollout["waiting"].as_str().map(str::to_string))
                .flatten()
        },
    )
    .await;
    assert!(waiting.starts_with("paused"), "{waiting}");
    assert!(
        played.given(&image("v2")).is_empty(),
        "a member changed while paused"
    );
    annotate(None).await;
    rolled_out(hub, a, b, "v2").await;
    assert_eq!(played.most_changing(), 1, "one member at a time");

    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");

    // Its traces (--otlp-endpoint, sent as it stopped): each member's
    // apply is beneath the hub reconcile that gave it its slot.
    eventually(
        Polled::OtherProcess,
        "each member's apply beneath a hub reconcile, in Jaeger",
        || async {
            let spans = jaeger
                .spans("multicluster-example-fleet-rollout")
                .await
                .expect("Jaeger's query API");
            ["a", "b"].into_iter().all(|member| {
                spans.iter().any(|span| {
                    span.operation == "member apply"
                        && span.tag("cluster") == member
                        && span.ancestors(&spans).iter().any(|above| {
                            above.operation == "reconcile" && above.tag("cluster") == "<local>"
                        })
                })
            })
        },
    )
    .await;
}

/// The first of `a`, `b`, `c`, ... that rendezvous hashing over the two
/// replicas gives to `replica`: a member name each replica works on.
fn member_of(replica: &str) -> String {
    let peers = ["replica-a", "replica-b"].map(|id| Peer {
        id: id.to_string(),
        weight: 1,
    });
    ('a'..='z')
        .map(String::from)
        .find(|name| owner(name, &peers).is_some_and(|peer| peer.id == replica))
        .expect("a name for each replica")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sharded_replicas_roll_out_one_member_at_a_time_between_them() {
    let _one = ONE_AT_A_TIME.lock().await;
    // One member for each replica.
    let (on_a, on_b) = (member_of("replica-a"), member_of("replica-b"));
    let fleet = Fleet::start([&on_a, &on_b]).await;
    let Fleet {
        a, b, hub, played, ..
    } = &fleet;
    let mut replicas = [
        fleet.example(&["--shard", "--peer-id", "replica-a"]),
        fleet.example(&["--shard", "--peer-id", "replica-b"]),
    ];
    let deployments = fleet.make_web("v1").await;
    rolled_out(hub, a, b, "v1").await;
    // Each replica told of its own member, and the status has both.
    eventually(
        Polled::ApiServer,
        "each replica's member in sync on the hub object",
        || async {
            let status = status(hub).await;
            status["countsByReplica"]
                == json!({"replica-a": {"InSync": 1}, "replica-b": {"InSync": 1}})
                && status["counts"] == json!({"InSync": 2})
        },
    )
    .await;
    let members: Vec<String> = status(hub).await["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|member| member["state"] == "InSync")
        .filter_map(|member| member["cluster"].as_str().map(str::to_string))
        .collect();
    let mut expected = vec![on_a.clone(), on_b.clone()];
    expected.sort();
    assert_eq!(members, expected);
    assert_eq!(played.most_changing(), 1, "one member at a time");

    set_image(&deployments, "v2").await;
    rolled_out(hub, a, b, "v2").await;
    assert_eq!(
        played.most_changing(),
        1,
        "one member at a time across both replicas"
    );

    for replica in &mut replicas {
        let status = terminate(replica, GRACE + Duration::from_secs(5)).await;
        assert!(status.success(), "{status}");
    }
}
