//! Engagement benchmark for access providers: N ready ClusterProfiles on a
//! real hub, each reached through envtest's token plugin (one real member
//! control plane behind all of them), the plugin taking a configurable time
//! to answer as identity services do.
//!
//! Reports, per (N, plugin delay): time from the provider's start until all
//! N clusters are engaged, and how many times the plugin ran.
//!
//! Run with `make bench` or
//! `cargo bench -p multicluster-provider-cluster-inventory-api --bench engage`;
//! `PROFILE_COUNTS=20,100` and `PLUGIN_DELAYS=0,0.2` choose the cases,
//! `MAX_CONCURRENT_BUILDS` the provider's limit (default 8).

use multicluster_runtime::provider::clusters::ClusterSetProvider;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_provider_cluster_inventory_api::access::{
    ADDITIONAL_ENVS_EXTENSION, ProviderFile,
};
use multicluster_provider_cluster_inventory_api::{ClusterProfileOptions, ClusterProfileProvider};
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::{Aware, Cluster, ClusterName, Error, ProviderContext, RunnableProvider};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Takes every cluster and does nothing with it: only the provider is timed.
struct Ignore;

impl Aware for Ignore {
    fn engage(&self, _: CancellationToken, _: ClusterName, _: Cluster) -> Result<(), Error> {
        Ok(())
    }
}

fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(str::to_string)
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub_cp, member) = (hub_cp.expect("hub"), member.expect("member"));
    let crd = multicluster_envtest::upstream::cluster_profile_crd()
        .await
        .expect("upstream CRD");
    hub_cp.install_crds(&crd).await.expect("CRD");
    let hub = hub_cp.client().await.expect("client");
    let token = member
        .service_account_token("robots", "bench", Duration::from_secs(3600))
        .await
        .expect("token");
    let ca = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(member.ca_pem())
    };
    let providers = ProviderFile::from_json(
        &json!({"providers": [{
            "name": "token",
            "execConfig": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": plugins::TOKEN,
            },
            "profileSourcedEnvVarsPolicy": "AppendIfNotExists",
            // It reads what profiles write: named with its CA, as the
            // default asks.
            "servers": [{"server": member.server(), "certificateAuthorityData": ca}],
        }]})
        .to_string(),
        "bench provider file",
    )
    .expect("provider file");
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
    ));

    println!("profiles  plugin delay  all engaged after  plugin calls");
    for (case, (count, delay)) in list("PROFILE_COUNTS", "20,100")
        .iter()
        .flat_map(|n| {
            list("PLUGIN_DELAYS", "0,0.2")
                .into_iter()
                .map(move |d| (n.clone(), d))
        })
        .enumerate()
    {
        let count: usize = count.parse().expect("PROFILE_COUNTS: numbers");
        // A namespace per case, so each provider sees only its profiles.
        let namespace = format!("case-{case}");
        hub_cp
            .create_namespace(&namespace)
            .await
            .expect("namespace");
        let state = tempfile::tempdir().expect("state");
        plugins::set_token(state.path(), &token).expect("token");
        std::fs::write(state.path().join("delay"), &delay).expect("delay");
        let profiles: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &namespace, &resource);
        for index in 0..count {
            let name = format!("p{index}");
            let mut profile = DynamicObject::new(&name, &resource).within(&namespace);
            profile.data = json!({"spec": {"clusterManager": {"name": "bench"}}});
            profiles
                .create(&PostParams::default(), &profile)
                .await
                .expect("profile");
            let status = json!({"status": {
                "conditions": [{"type": "ControlPlaneHealthy", "status": "True", "reason": "Bench",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "accessProviders": [{"name": "token", "cluster": {
                    "server": member.server(),
                    "certificate-authority-data": ca,
                    // Distinct settings per profile, as real fleets have.
                    "extensions": [{"name": ADDITIONAL_ENVS_EXTENSION, "extension": {
                        "STATE_DIR": state.path(), "PROFILE": name,
                    }}],
                }}],
            }});
            profiles
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .expect("status");
        }

        let mut options = ClusterProfileOptions::with_access_providers(providers.clone());
        options.namespace = Some(namespace);
        if let Ok(limit) = std::env::var("MAX_CONCURRENT_BUILDS") {
            options.max_concurrent_builds = limit.parse().expect("MAX_CONCURRENT_BUILDS: a number");
        }
        let provider = Arc::new(ClusterProfileProvider::new(hub.clone(), options));
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let task = tokio::spawn({
            let (provider, shutdown) = (provider.clone(), shutdown.clone());
            async move {
                let context = ProviderContext::new(shutdown, Arc::new(Ignore), Metrics::default());
                provider.start(context).await
            }
        });
        while provider.names().len() < count {
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "not all engaged: {:?}",
                provider.failures()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        shutdown.cancel();
        task.await.expect("task").expect("provider");
        println!(
            "{count:>8}  {:>10} s  {:>15.2} s  {:>12}",
            delay,
            elapsed.as_secs_f64(),
            plugins::calls(state.path()).len()
        );
    }
}
