//! Gates between stages on real control planes: a hub running the Job
//! controller (kube-controller-manager; no kubelet, so the test sets the
//! Job's pod phase as a kubelet would), and one member API server whose
//! namespaces `a`, `b` and `c` are three members, one per stage. A hub
//! custom resource becomes a ConfigMap in each. Stage `validated` waits
//! for a validator's condition on the hub object, for the hub object's
//! generation; stage `smoke` for a Job the propagation creates in the hub.
//! A condition written `False` and a Job that fails each halt the rollout
//! (its failure budget is 0).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{CustomResource, CustomResourceExt};
use multicluster_envtest::ControlPlane;
use multicluster_propagation::{
    Desired, GATE_JOB_ENV, Gate, MaxUnavailable, PROPAGATION_LABEL, Propagation, PropagationStatus,
    Rollout, Stage,
};
use multicluster_runtime::testing::{object_holds_throughout, run_manager, wait_for_object};
use multicluster_runtime::{Cluster, Manager};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A value for every member, rolled out stage after stage.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, schemars::JsonSchema)]
#[kube(
    group = "gates.example",
    version = "v1",
    kind = "Setting",
    namespaced,
    status = "PropagationStatus"
)]
struct SettingSpec {
    value: String,
}

const MEMBERS: [&str; 3] = ["a", "b", "c"];
const VALIDATED: &str = "SmokeTestsPassed";

/// The Job the `smoke` stage runs: one pod, never retried.
fn smoke_job() -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ignored"},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "smoke", "image": "registry.k8s.io/e2e-test-images/agnhost:2.52",
                                "args": ["pause"]}],
            }},
        },
    }))
    .expect("job")
}

async fn set_value(hub: &kube::Client, value: &str) {
    Api::<Setting>::namespaced(hub.clone(), "default")
        .patch(
            "web",
            &PatchParams::apply("gates-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "gates.example/v1", "kind": "Setting",
                "metadata": {"name": "web"}, "spec": {"value": value},
            })),
        )
        .await
        .expect("hub object");
}

/// The validator's verdict on the hub object, as a condition of its own
/// (its field manager's entry of `status.conditions`).
async fn validate(hub: &kube::Client, generation: i64, passed: bool) {
    Api::<Setting>::namespaced(hub.clone(), "default")
        .patch_status(
            "web",
            &PatchParams::apply("validator").force(),
            &Patch::Apply(json!({
                "apiVersion": "gates.example/v1", "kind": "Setting",
                "metadata": {"name": "web"},
                "status": {"conditions": [{
                    "type": VALIDATED,
                    "status": if passed { "True" } else { "False" },
                    "observedGeneration": generation,
                    "reason": if passed { "Passed" } else { "Errors" },
                    "message": if passed { "20 of 20 passed" } else { "3 of 20 failed" },
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }]},
            })),
        )
        .await
        .expect("validator's condition");
}

fn value_of(object: Option<&ConfigMap>) -> Option<&str> {
    object?.data.as_ref()?.get("value").map(String::as_str)
}

/// The ConfigMap of member `name` (a namespace of `member`).
async fn settings_of(member: &ControlPlane, name: &str) -> Api<ConfigMap> {
    Api::namespaced(member.client().await.expect("client"), name)
}

/// The value member `name` holds now.
async fn value_in(member: &ControlPlane, name: &str) -> Option<String> {
    let settings = settings_of(member, name)
        .await
        .get_opt("settings")
        .await
        .expect("get");
    value_of(settings.as_ref()).map(str::to_string)
}

async fn until_value(member: &ControlPlane, name: &str, value: &str) {
    wait_for_object(
        &settings_of(member, name).await,
        "settings",
        &format!("{name} with {value}"),
        |object| value_of(object) == Some(value),
    )
    .await;
}

/// Waits until the rollout's record satisfies `that` (the record, as JSON).
async fn until_rollout(hub: &kube::Client, what: &str, that: impl Fn(&serde_json::Value) -> bool) {
    wait_for_object(
        &Api::<Setting>::namespaced(hub.clone(), "default"),
        "web",
        what,
        |object| {
            object
                .and_then(|object| object.status.as_ref()?.rollout.as_ref())
                .and_then(|rollout| serde_json::to_value(rollout).ok())
                .is_some_and(|rollout| that(&rollout))
        },
    )
    .await;
}

fn says(rollout: &serde_json::Value, field: &str, text: &str) -> bool {
    rollout[field]
        .as_str()
        .is_some_and(|said| said.contains(text))
}

/// The gate's Job for `revision`, once the propagation has made it.
async fn gate_job(hub: &kube::Client, revision: &str) -> Job {
    let jobs = Api::<Job>::namespaced(hub.clone(), "default");
    wait_for_object(
        &Api::<Setting>::namespaced(hub.clone(), "default"),
        "web",
        &format!("the smoke Job of revision {revision}"),
        |object| {
            object
                .and_then(|object| object.status.as_ref()?.rollout.as_ref())
                .filter(|rollout| rollout.revision == revision)
                .and_then(|rollout| rollout.waiting.as_deref())
                .is_some_and(|waiting| waiting.contains("Job default/"))
        },
    )
    .await;
    let revision_of = |job: &Job| {
        job.metadata
            .annotations
            .as_ref()?
            .get(multicluster_propagation::REVISION_ANNOTATION)
            .cloned()
    };
    jobs.list(&ListParams::default().labels(&format!("{PROPAGATION_LABEL}=settings")))
        .await
        .expect("jobs")
        .items
        .into_iter()
        .find(|job| revision_of(job).as_deref() == Some(revision))
        .unwrap_or_else(|| panic!("no Job for revision {revision}"))
}

/// Sets the phase of the Job's pod, as the kubelet would once it ran.
async fn finish_pod(hub: &kube::Client, job: &Job, phase: &str) {
    let name = job.metadata.name.clone().expect("name");
    let pods = Api::<Pod>::namespaced(hub.clone(), "default");
    let selector = format!("batch.kubernetes.io/job-name={name}");
    let listed = multicluster_runtime::testing::eventually_some(
        multicluster_runtime::testing::Polled::ApiServer,
        &format!("the pod of Job {name}"),
        || async {
            pods.list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        },
    )
    .await;
    let exit = if phase == "Succeeded" { 0 } else { 1 };
    pods.patch_status(
        listed.metadata.name.as_deref().expect("pod name"),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": phase,
            "containerStatuses": [{"name": "smoke", "image": "registry.k8s.io/e2e-test-images/agnhost:2.52",
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "reason": if exit == 0 { "Completed" } else { "Error" },
                    "startedAt": "2026-12-01T00:00:00Z", "finishedAt": "2026-12-01T00:00:01Z"}}}],
        }})),
    )
    .await
    .expect("pod phase");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_wait_for_a_validators_condition_and_for_a_job_and_halt_when_either_fails() {
    let (hub_cp, member) = tokio::join!(
        ControlPlane::builder().controller_manager(true).start(),
        ControlPlane::start()
    );
    let (hub_cp, member) = (hub_cp.expect("hub"), member.expect("member"));
    let hub = hub_cp.client().await.expect("client");
    hub_cp
        .install_crds(&serde_json::to_string(&Setting::crd()).expect("crd"))
        .await
        .expect("crd");
    common::make_namespaces(&member, &MEMBERS).await;
    let provider = common::namespace_members(&member, &MEMBERS).await;
    let manager = Manager::builder(Cluster::new("hub", hub.clone()))
        .provider(Arc::new(provider))
        .build();
    let propagation = Propagation::<Setting>::new("settings")
        .propagates::<ConfigMap>()
        .desired(|hub, member| {
            let settings = ConfigMap {
                metadata: ObjectMeta {
                    name: Some("settings".into()),
                    namespace: Some(member.name().to_string()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([("value".into(), hub.spec.value.clone())])),
                ..ConfigMap::default()
            };
            Ok(vec![Desired::new(&settings)?])
        })
        .rollout(Rollout::staged(
            [
                Stage::named("canary", ["a"]),
                Stage::named("validated", ["b"]).gated_by(Gate::condition(VALIDATED)),
                Stage::named("smoke", ["c"]).gated_by(Gate::job(smoke_job())),
            ],
            MaxUnavailable::Count(1),
        ))
        .status_subresource();
    manager
        .add_controller(propagation.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);

    // Revision 1: the canary takes it; the validated stage waits for the
    // validator's condition, and b gets nothing meanwhile.
    Api::<Setting>::namespaced(hub.clone(), "default")
        .create(
            &PostParams::default(),
            &Setting::new(
                "web",
                SettingSpec {
                    value: "one".into(),
                },
            ),
        )
        .await
        .expect("hub object");
    until_value(&member, "a", "one").await;
    until_rollout(&hub, "validated waiting for its condition", |rollout| {
        says(
            rollout,
            "waiting",
            "stage validated waits for its gate: condition SmokeTestsPassed not written yet",
        )
    })
    .await;
    object_holds_throughout(
        &settings_of(&member, "b").await,
        "settings",
        Duration::from_secs(2),
        "b before the validator's word",
        |object| object.is_none(),
    )
    .await;

    // Validated: b takes it; the smoke stage's Job is made, with the hub
    // object, revision and stage in its environment, and c waits for it.
    validate(&hub, 1, true).await;
    until_value(&member, "b", "one").await;
    let job = gate_job(&hub, "1").await;
    let env: BTreeMap<String, String> = job
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod")
        .containers[0]
        .env
        .iter()
        .flatten()
        .map(|var| (var.name.clone(), var.value.clone().unwrap_or_default()))
        .collect();
    let expected: BTreeMap<String, String> = GATE_JOB_ENV
        .iter()
        .zip(["default", "web", "1", "smoke"])
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    assert_eq!(env, expected);
    assert_eq!(
        job.metadata
            .owner_references
            .as_ref()
            .map(|owners| owners[0].kind.as_str()),
        Some("Setting"),
        "the Job goes with its hub object"
    );
    assert_eq!(
        value_in(&member, "c").await.as_deref(),
        None,
        "c changed before the Job completed"
    );
    finish_pod(&hub, &job, "Succeeded").await;
    until_value(&member, "c", "one").await;
    // Done: a member still holding its slot would take the next revision
    // first, whatever its stage.
    until_rollout(&hub, "revision 1 complete", |rollout| {
        rollout["updated"] == 3 && rollout["updating"].as_array().is_none_or(Vec::is_empty)
    })
    .await;

    // Revision 2: the validator's word for generation 1 does not pass it;
    // its `False` for generation 2 halts the rollout, b keeping one.
    set_value(&hub, "two").await;
    until_value(&member, "a", "two").await;
    until_rollout(&hub, "validated waiting for generation 2", |rollout| {
        says(rollout, "waiting", "is for generation 1, not 2")
    })
    .await;
    validate(&hub, 2, false).await;
    until_rollout(&hub, "halted by the validator", |rollout| {
        says(
            rollout,
            "halted",
            "the gate: condition SmokeTestsPassed is False (Errors: 3 of 20 failed)",
        )
    })
    .await;
    assert_eq!(value_in(&member, "b").await.as_deref(), Some("one"));

    // Revision 3: validated, b takes it; the Job fails and halts it, c
    // keeping one.
    set_value(&hub, "three").await;
    until_value(&member, "a", "three").await;
    validate(&hub, 3, true).await;
    until_value(&member, "b", "three").await;
    let job = gate_job(&hub, "3").await;
    finish_pod(&hub, &job, "Failed").await;
    until_rollout(&hub, "halted by the Job", |rollout| {
        says(rollout, "halted", "the gate: Job default/") && says(rollout, "halted", "failed")
    })
    .await;
    assert_eq!(value_in(&member, "c").await.as_deref(), Some("one"));

    stop.cancel();
    task.await.expect("join").expect("manager");
}
