//! Traces of a paced rollout, exported over OTLP to a real Jaeger (built
//! from its Go module, as the control plane is) and read back from its
//! query API: the hub reconcile that gives members their slots has each
//! member's reconcile and apply beneath it, each naming its cluster.
//!
//! One test in this file: it installs the process's global subscriber.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::jaeger::{Jaeger, Span};
use multicluster_propagation::{Desired, MaxUnavailable, Propagation, Rollout};
use multicluster_runtime::telemetry::OtlpTraces;
use multicluster_runtime::testing::{Polled, eventually_some, run_manager};
use multicluster_runtime::{Cluster, Manager};
use serde_json::json;
use tracing_subscriber::prelude::*;

use common::{STATUS, namespace_members};

/// The service name the test's spans are exported under.
const SERVICE: &str = "propagation-traces-test";
const MEMBERS: [&str; 2] = ["m0", "m1"];
const LABEL: &str = "example.com/traced";

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The copy a hub ConfigMap wants in `member`.
fn copy(hub: &ConfigMap, member: &Cluster) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: hub.metadata.name.clone(),
            namespace: Some(member.name().as_str().to_string()),
            ..ObjectMeta::default()
        },
        data: hub.data.clone(),
        ..ConfigMap::default()
    }
}

/// For each member, the chain above a `member apply` span naming it that
/// reaches the hub reconcile, if Jaeger holds one.
fn chains_to_the_hub(spans: &[Span]) -> Result<Vec<String>, String> {
    let mut chains = Vec::new();
    for member in MEMBERS {
        let applies: Vec<&Span> = spans
            .iter()
            .filter(|span| span.operation == "member apply" && span.tag("cluster") == member)
            .collect();
        let chain = applies.iter().find_map(|apply| {
            let above = apply.ancestors(spans);
            let hub = above.iter().position(|span| {
                span.operation == "reconcile" && span.tag("cluster") == "<local>"
            })?;
            let above = &above[..=hub];
            // Between the apply and the hub: the member's own reconcile,
            // queued from the hub's rollout step.
            above
                .iter()
                .any(|span| span.operation == "reconcile" && span.tag("cluster") == member)
                .then_some(above)?;
            above
                .iter()
                .any(|span| span.operation == "rollout step")
                .then_some(above)?;
            Some(
                std::iter::once(format!("member apply({member})"))
                    .chain(
                        above
                            .iter()
                            .map(|span| format!("{}({})", span.operation, span.tag("cluster"))),
                    )
                    .collect::<Vec<_>>()
                    .join(" < "),
            )
        });
        match chain {
            Some(chain) => chains.push(chain),
            None => {
                return Err(format!(
                    "{member}: none of its {} `member apply` spans is beneath the hub reconcile",
                    applies.len()
                ));
            }
        }
    }
    Ok(chains)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_reconcile_has_the_member_applies_it_caused_beneath_it() {
    let jaeger = Jaeger::start(&repository().join("hack/jaeger/build.sh"))
        .await
        .expect("Jaeger");
    let traces = OtlpTraces::start(&jaeger.otlp_endpoint(), SERVICE).expect("OTLP traces");
    // Only this workspace's spans: the trace asserted is the library's.
    let ours = tracing_subscriber::filter::Targets::new()
        .with_target("multicluster_runtime", tracing::Level::INFO)
        .with_target("multicluster_propagation", tracing::Level::INFO);
    tracing_subscriber::registry()
        .with(traces.layer().with_filter(ours))
        .init();

    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    common::make_namespaces(&member, &MEMBERS).await;
    let provider = namespace_members(&member, &MEMBERS).await;
    let manager = Manager::builder(Cluster::new("hub", hub.client().await.expect("client")))
        .provider(Arc::new(provider))
        .build();
    let propagation = Propagation::<ConfigMap>::new("traced")
        .select(|hub| {
            hub.metadata
                .labels
                .as_ref()
                .is_some_and(|labels| labels.contains_key(LABEL))
        })
        .propagates::<ConfigMap>()
        .desired(|hub, member| Ok(vec![Desired::new(&copy(hub, member))?]))
        // One member at a time: each member's apply waits for the slot a
        // hub step gives it.
        .rollout(Rollout::rolling(MaxUnavailable::Count(1)))
        .status_annotation(STATUS);
    manager
        .add_controller(propagation.build().expect("propagation"))
        .expect("add");
    let (stop, task) = run_manager(&manager);

    let object = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "traced", "namespace": "default", "labels": {LABEL: "yes"}},
        "data": {"greeting": "hello"},
    });
    Api::<ConfigMap>::namespaced(hub.client().await.expect("client"), "default")
        .patch(
            "traced",
            &PatchParams::apply("test"),
            &Patch::Apply(&object),
        )
        .await
        .expect("hub object");
    common::until_in_sync(&hub, "traced", &MEMBERS).await;
    stop.cancel();
    task.await.expect("join").expect("manager");
    // Sends what the batch exporter still holds.
    traces.shutdown().await.expect("flush the spans");

    let chains = eventually_some(
        Polled::OtherProcess,
        "each member's apply beneath the hub reconcile, in Jaeger",
        || async {
            let spans = jaeger.spans(SERVICE).await.expect("Jaeger's query API");
            chains_to_the_hub(&spans)
                .map_err(|missing| eprintln!("{} spans; {missing}", spans.len()))
                .ok()
        },
    )
    .await;
    for chain in chains {
        println!("{chain}");
    }
}
