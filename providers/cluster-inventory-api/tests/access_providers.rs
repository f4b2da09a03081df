//! ClusterProfiles with access providers (KEP-5339): the exec credential
//! plugins of `multicluster_envtest::plugins` hand out service-account tokens
//! of real workload control planes.

mod common;

use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::Polled;
use multicluster_runtime::testing::wait_for_fleet;
use multicluster_runtime::testing::wait_for_fleet_async;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{
    admin_token, base64_pem, call_field, create_profile, health, profiles, req, set_status,
    state_with_token, workload,
};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::plugins::{self, calls};
use multicluster_envtest::traps::Traps;
use multicluster_provider_cluster_inventory_api::access::{
    ADDITIONAL_ARGS_EXTENSION, ADDITIONAL_ENVS_EXTENSION, ProviderFile,
};
use multicluster_provider_cluster_inventory_api::{ClusterProfileOptions, ClusterProfileProvider};
use multicluster_runtime::testing::{eventually, run_manager, serve_health, wait_until_unusable};
use multicluster_runtime::{ClusterName, ManagerOptions};
use serde_json::json;

/// A value configured for the failing plugin that must never show up.
const SECRET: &str = "api-key-that-must-not-leak";

/// `token` hands out `$STATE_DIR/token` and takes profile-sourced args and
/// env; `refuse` always fails. Both read what profiles write, so both are
/// bound to the servers of `members`, each named with its CA, as the
/// default asks.
fn provider_file(members: &[&ControlPlane]) -> ProviderFile {
    let mut file = json!({"providers": [
        {
            "name": "token",
            "execConfig": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": plugins::TOKEN,
                "args": ["--base"],
                "env": [{"name": "KEEP", "value": "configured"}],
                "provideClusterInfo": true,
            },
            "profileSourcedCLIArgsPolicy": "Append",
            "profileSourcedEnvVarsPolicy": "AppendIfNotExists",
            "profileSourcedEnvVarNames": ["STATE_DIR", "KEEP"],
        },
        {
            "name": "refuse",
            "execConfig": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": plugins::REFUSE,
                "env": [{"name": "API_KEY", "value": SECRET}],
            },
            "profileSourcedEnvVarsPolicy": "Replace",
            "profileSourcedEnvVarNames": ["STATE_DIR", "KEEP"],
        },
    ]});
    for provider in file["providers"].as_array_mut().expect("providers") {
        provider["servers"] = named_servers(members);
    }
    ProviderFile::from_json(&file.to_string(), "test provider file").expect("provider file")
}

/// `file` and a provider "blind" whose plugin reads nothing of a profile
/// (its `STATE_DIR` is `state`, from the file): the default lets it run
/// for any server, and what it mints is the same for every profile.
fn with_blind_provider(mut file: ProviderFile, state: &Path) -> ProviderFile {
    let blind = json!({
        "name": "blind",
        "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": plugins::TOKEN,
            "env": [{"name": "STATE_DIR", "value": state}],
        },
    });
    file.providers
        .push(serde_json::from_value(blind).expect("a provider"));
    file
}

/// The servers of `members`, each named with its CA.
fn named_servers(members: &[&ControlPlane]) -> serde_json::Value {
    members
        .iter()
        .map(|member| {
            json!({
                "server": member.server(),
                "certificateAuthorityData": base64_pem(member.ca_pem()),
            })
        })
        .collect()
}

/// An access-provider entry for `cluster` whose plugin keeps its state in
/// `state`, with optional extra extensions.
fn access(
    name: &str,
    cluster: &ControlPlane,
    state: &Path,
    mut extensions: Vec<serde_json::Value>,
) -> serde_json::Value {
    extensions.push(json!({
        "name": ADDITIONAL_ENVS_EXTENSION,
        "extension": {"STATE_DIR": state, "KEEP": "from-profile"},
    }));
    json!({"name": name, "cluster": {
        "server": cluster.server(),
        "certificate-authority-data": base64_pem(cluster.ca_pem()),
        "extensions": extensions,
    }})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_are_engaged_through_the_first_access_provider_in_file_order() {
    let (hub_cp, first, second) = tokio::join!(
        ControlPlane::start(),
        workload("in-first"),
        workload("in-second")
    );
    let hub_cp = hub_cp.expect("hub");
    // v1alpha1: the deprecated status.credentialProviders is one of its
    // fields (v1alpha2 has none).
    let hub = common::released_hub(&hub_cp).await;
    let alpha_state = state_with_token(&first, "alpha").await;
    let beta_state = state_with_token(&second, "beta").await;
    let epsilon_state = state_with_token(&first, "epsilon").await;
    let gamma_state = tempfile::tempdir().expect("state dir");
    let exec_config = json!({"audience": "alpha-audience"});

    // alpha lists the failing provider first; the file prefers "token".
    let alpha_access = |region: &str| {
        json!({"accessProviders": [
            access("refuse", &first, gamma_state.path(), vec![]),
            access("token", &first, alpha_state.path(), vec![
                json!({"name": "client.authentication.k8s.io/exec", "extension": exec_config}),
                json!({"name": ADDITIONAL_ARGS_EXTENSION, "extension": {"args": ["--region", region]}}),
            ]),
        ]})
    };
    let ready = |mut status: serde_json::Value| {
        status["conditions"] = health(true)["conditions"].clone();
        status
    };
    for name in ["alpha", "beta", "gamma", "delta"] {
        create_profile(&hub, name).await;
    }
    set_status(&hub, "alpha", ready(alpha_access("eu-1"))).await;
    // Only the deprecated field: still honoured.
    set_status(
        &hub,
        "beta",
        ready(json!({"credentialProviders": [
            access("token", &second, beta_state.path(), vec![]),
        ]})),
    )
    .await;
    // Only the failing plugin: an error for gamma alone.
    set_status(
        &hub,
        "gamma",
        ready(json!({"accessProviders": [
            access("refuse", &first, gamma_state.path(), vec![]),
        ]})),
    )
    .await;
    // A provider this consumer does not know.
    set_status(
        &hub,
        "delta",
        ready(json!({"accessProviders": [
            access("elsewhere", &first, gamma_state.path(), vec![]),
        ]})),
    )
    .await;

    let mut options =
        ClusterProfileOptions::with_access_providers(provider_file(&[&first, &second]));
    options.retry.base = Duration::from_millis(100);
    let provider = Arc::new(ClusterProfileProvider::new(hub.clone(), options));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);

    recorder
        .wait_for_more(&req("inventory/alpha", "in-first"), 0)
        .await;
    recorder
        .wait_for_more(&req("inventory/beta", "in-second"), 0)
        .await;

    // The plugin got the profile's args and env under the file's policies,
    // and the cluster entry with the exec extension as its config.
    let alpha_calls = calls(alpha_state.path());
    let call = alpha_calls.first().expect("the plugin ran for alpha");
    assert_eq!(call_field(call, "args"), "--base --region eu-1");
    assert_eq!(call_field(call, "KEEP"), "configured", "AppendIfNotExists");
    let info: serde_json::Value =
        serde_json::from_str(call_field(call, "info")).expect("ExecCredential JSON");
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["spec"]["interactive"], false);
    assert_eq!(info["spec"]["cluster"]["server"], first.server());
    assert_eq!(info["spec"]["cluster"]["config"], exec_config);

    // gamma's plugin fails: named, retried, nothing leaked; delta has no
    // provider in common with the file. Neither holds up the others.
    eventually(
        Polled::OtherProcess,
        "gamma's plugin to be retried",
        || async { calls(gamma_state.path()).len() >= 3 },
    )
    .await;
    let failures = provider.failures();
    let gamma = &failures[&ClusterName::from("inventory/gamma")];
    assert!(gamma.contains("access provider \"refuse\""), "{gamma}");
    assert!(gamma.contains("exit status: 1"), "{gamma}");
    assert!(gamma.contains("stderr is withheld"), "{gamma}");
    assert!(
        !gamma.contains("identity service: no grant for this cluster"),
        "its stderr may print anything: {gamma}"
    );
    assert!(!gamma.contains(SECRET), "{gamma}");
    let delta = &failures[&ClusterName::from("inventory/delta")];
    assert!(
        delta.contains("none of its access providers (\"elsewhere\") is in the provider file"),
        "{delta}"
    );
    assert_eq!(
        provider.names(),
        [
            ClusterName::from("inventory/alpha"),
            ClusterName::from("inventory/beta")
        ]
    );

    // A status change that leaves the access alone re-engages nothing and
    // runs no plugin. Epsilon, engaged after it, is the sync point.
    let alpha = manager
        .get_cluster(&ClusterName::from("inventory/alpha"))
        .await
        .expect("alpha");
    set_status(&hub, "alpha", json!({"version": {"kubernetes": "1.35.4"}})).await;
    create_profile(&hub, "epsilon").await;
    set_status(
        &hub,
        "epsilon",
        ready(json!({"accessProviders": [access("token", &first, epsilon_state.path(), vec![])]})),
    )
    .await;
    recorder
        .wait_for_more(&req("inventory/epsilon", "in-first"), 0)
        .await;
    assert!(
        manager
            .get_cluster(&ClusterName::from("inventory/alpha"))
            .await
            .expect("alpha")
            .same_instance(&alpha),
        "alpha was re-engaged without a change"
    );
    assert_eq!(calls(alpha_state.path()).len(), alpha_calls.len());

    // Changed access (another profile-sourced argument) replaces the cluster.
    set_status(&hub, "alpha", alpha_access("us-2")).await;
    wait_for_fleet_async(&manager, "alpha to be replaced", || async {
        manager
            .get_cluster(&ClusterName::from("inventory/alpha"))
            .await
            .is_ok_and(|cluster| !cluster.same_instance(&alpha))
    })
    .await;
    let last = calls(alpha_state.path()).pop().expect("a call");
    assert_eq!(call_field(&last, "args"), "--base --region us-2");

    // Deleting a failing profile clears its failure.
    profiles(&hub)
        .delete("gamma", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for_fleet(&manager, "gamma's failure to go", || {
        !provider
            .failures()
            .contains_key(&ClusterName::from("inventory/gamma"))
    })
    .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_token_is_refreshed_by_running_the_plugin_again() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("in-member"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let state = state_with_token(&member, "first-identity").await;
    // The client calls the plugin again within 60 s of expiry: here, on
    // any request a second after the last call.
    std::fs::write(state.path().join("ttl"), "61").expect("ttl");
    create_profile(&hub, "edge").await;
    let mut status = json!({"accessProviders": [access("token", &member, state.path(), vec![])]});
    status["conditions"] = health(true)["conditions"].clone();
    set_status(&hub, "edge", status).await;

    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_access_providers(provider_file(&[&member])),
    ));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("inventory/edge", "in-member"), 0)
        .await;
    let edge = manager
        .get_cluster(&ClusterName::from("inventory/edge"))
        .await
        .expect("edge");

    // The plugin now hands out another identity's token, and the first
    // token stops working.
    let first_token = plugins::token(state.path()).expect("token");
    plugins::set_token(state.path(), &admin_token(&member, "second-identity").await)
        .expect("token");
    Api::<ServiceAccount>::namespaced(member.client().await.expect("client"), "robots")
        .delete("first-identity", &DeleteParams::default())
        .await
        .expect("revoke");
    let revoked = multicluster_envtest::client_for(&member.token_kubeconfig("old", first_token))
        .await
        .expect("client");
    eventually(
        Polled::ApiServer,
        "the first token to be rejected",
        || async {
            Api::<ConfigMap>::namespaced(revoked.clone(), "default")
                .list(&ListParams::default())
                .await
                .is_err()
        },
    )
    .await;

    // The engaged client keeps working: it fetched the new token itself.
    eventually(
        Polled::ApiServer,
        "the engaged client to work with a refreshed token",
        || async {
            Api::<ConfigMap>::namespaced(edge.client(), "default")
                .list(&ListParams::default())
                .await
                .is_ok()
        },
    )
    .await;
    assert!(calls(state.path()).len() >= 2, "the plugin ran again");
    assert!(
        manager
            .get_cluster(&ClusterName::from("inventory/edge"))
            .await
            .expect("edge")
            .same_instance(&edge),
        "refreshing is the client's job, not a re-engagement"
    );
    // And the cache's watches go on with it.
    let before = recorder.count(&req("inventory/edge", "in-member"));
    Api::<ConfigMap>::namespaced(member.client().await.expect("client"), "default")
        .patch(
            "in-member",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await
        .expect("patch");
    recorder
        .wait_for_more(&req("inventory/edge", "in-member"), before)
        .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A plugin that does not answer holds up only its own profile: others are
/// engaged meanwhile. A profile that changes while its client is being built
/// is built again with the new settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_plugin_holds_up_only_its_own_profile() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("in-member"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let slow_state = state_with_token(&member, "slow").await;
    let fast_state = state_with_token(&member, "fast").await;
    plugins::hold(slow_state.path()).expect("hold");
    let slow_access = |region: &str| {
        let mut status = json!({"accessProviders": [access("token", &member, slow_state.path(), vec![
            json!({"name": ADDITIONAL_ARGS_EXTENSION, "extension": {"args": ["--region", region]}}),
        ])]});
        status["conditions"] = health(true)["conditions"].clone();
        status
    };
    create_profile(&hub, "slow").await;
    set_status(&hub, "slow", slow_access("eu-1")).await;

    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_access_providers(provider_file(&[&member])),
    ));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    eventually(
        Polled::OtherProcess,
        "the slow plugin to be called",
        || async { !calls(slow_state.path()).is_empty() },
    )
    .await;

    create_profile(&hub, "fast").await;
    let mut fast =
        json!({"accessProviders": [access("token", &member, fast_state.path(), vec![])]});
    fast["conditions"] = health(true)["conditions"].clone();
    set_status(&hub, "fast", fast).await;
    recorder
        .wait_for_more(&req("inventory/fast", "in-member"), 0)
        .await;
    assert!(
        !provider
            .names()
            .contains(&ClusterName::from("inventory/slow")),
        "slow is still held"
    );

    // Changed while its build is held: built again with the new settings.
    set_status(&hub, "slow", slow_access("us-2")).await;
    plugins::release(slow_state.path()).expect("release");
    recorder
        .wait_for_more(&req("inventory/slow", "in-member"), 0)
        .await;
    eventually(
        Polled::OtherProcess,
        "a build with the new settings",
        || async {
            calls(slow_state.path())
                .iter()
                .any(|call| call_field(call, "args") == "--base --region us-2")
        },
    )
    .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A plugin that never answers (a login nobody completes) holds up only its
/// own profile: a profile created after it is engaged, one deleted is
/// removed, the plugin runs once, and stopping the provider stops it; a
/// hung plugin whose own profile is deleted stops at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_plugin_holds_up_only_its_own_profile_and_stops_with_the_provider() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("in-member"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let stuck_state = state_with_token(&member, "stuck").await;
    let other_state = state_with_token(&member, "other").await;
    plugins::hold(stuck_state.path()).expect("hold");
    let ready_with = |state: &Path| {
        let mut status = json!({"accessProviders": [access("token", &member, state, vec![])]});
        status["conditions"] = health(true)["conditions"].clone();
        status
    };
    for (name, state) in [("stuck", &stuck_state), ("before", &other_state)] {
        create_profile(&hub, name).await;
        set_status(&hub, name, ready_with(state.path())).await;
    }

    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_access_providers(provider_file(&[&member])),
    ));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("inventory/before", "in-member"), 0)
        .await;
    let plugin = plugins::first_call_running(stuck_state.path()).await;

    create_profile(&hub, "after").await;
    set_status(&hub, "after", ready_with(other_state.path())).await;
    recorder
        .wait_for_more(&req("inventory/after", "in-member"), 0)
        .await;
    profiles(&hub)
        .delete("before", &DeleteParams::default())
        .await
        .expect("delete");
    multicluster_runtime::testing::wait_until_left(&manager, "inventory/before").await;
    assert_eq!(provider.names(), [ClusterName::from("inventory/after")]);
    assert!(plugins::is_running(plugin), "still waiting for its login");
    assert_eq!(plugins::pids(stuck_state.path()), [plugin], "run once");

    // Another hung one whose profile is deleted: its plugin's process
    // group stops at once, not at the plugin's deadline.
    let doomed_state = state_with_token(&member, "doomed").await;
    plugins::hold(doomed_state.path()).expect("hold");
    create_profile(&hub, "doomed").await;
    set_status(&hub, "doomed", ready_with(doomed_state.path())).await;
    let doomed = plugins::first_call_running(doomed_state.path()).await;
    profiles(&hub)
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete");
    plugins::wait_until_group_stopped(
        doomed,
        Duration::from_secs(5),
        "the deleted profile's plugin",
    )
    .await;
    assert!(plugins::is_running(plugin), "the other still waits");

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
    plugins::wait_until_stopped(plugin, "the plugin").await;
}

/// A profile's status is written by its cluster manager, and by anyone who
/// may update ClusterProfiles' status: with the default options a profile
/// whose access-provider entry names a CA file (the field ClusterProfile
/// v1alpha2 removed), a proxy or no TLS verification, or whose
/// additional-envs extension sets a variable that changes what code the
/// plugin runs, is refused before the plugin runs or the file is opened,
/// and shown unusable naming the field; a healthy profile is engaged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_fields_that_would_read_files_or_dial_are_refused_with_the_default_options() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("in-member"));
    let hub_cp = hub_cp.expect("hub");
    // v1alpha1: a cluster entry may name a CA file there (v1alpha2 has no
    // such field: the API server drops it).
    let hub = common::released_hub(&hub_cp).await;
    let traps = Traps::set().await.expect("traps");
    let ca_file = traps.dir().join("ca.crt").display().to_string();
    // The cluster entry's fields, through a plugin that reads nothing of
    // the profile (a binding would replace its CA and verify its server).
    let with_cluster = |extra: serde_json::Value| {
        let mut entry = access("blind", &member, traps.dir(), vec![]);
        for (key, value) in extra.as_object().expect("object") {
            entry["cluster"][key] = value.clone();
        }
        let mut status = json!({"accessProviders": [entry]});
        status["conditions"] = health(true)["conditions"].clone();
        status
    };
    let refused = [
        (
            "ca-file",
            with_cluster(json!({"certificate-authority": ca_file})),
            r#"clusters["inventory/ca-file"].cluster.certificate-authority names a local file"#,
        ),
        (
            "proxy",
            with_cluster(json!({"proxy-url": traps.server().replace("https://", "http://")})),
            r#"clusters["inventory/proxy"].cluster.proxy-url picks a proxy"#,
        ),
        (
            "insecure",
            with_cluster(json!({"insecure-skip-tls-verify": true})),
            r#"clusters["inventory/insecure"].cluster.insecure-skip-tls-verify turns off verifying"#,
        ),
    ];
    for (name, status, _) in &refused {
        create_profile(&hub, name).await;
        set_status(&hub, name, status.clone()).await;
    }
    let mut loader = json!({"accessProviders": [access("token", &member, traps.dir(), vec![
        json!({"name": ADDITIONAL_ENVS_EXTENSION, "extension": {"LD_PRELOAD": ca_file}}),
    ])]});
    loader["conditions"] = health(true)["conditions"].clone();
    create_profile(&hub, "loader").await;
    set_status(&hub, "loader", loader).await;
    let healthy_state = state_with_token(&member, "healthy").await;
    let mut healthy =
        json!({"accessProviders": [access("token", &member, healthy_state.path(), vec![])]});
    healthy["conditions"] = health(true)["conditions"].clone();
    create_profile(&hub, "healthy").await;
    set_status(&hub, "healthy", healthy).await;

    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_access_providers(with_blind_provider(
            provider_file(&[&member]),
            traps.dir(),
        )),
    ));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    let address = serve_health(&manager, shutdown.clone()).await;
    recorder
        .wait_for_more(&req("inventory/healthy", "in-member"), 0)
        .await;
    let names: Vec<_> = refused
        .iter()
        .map(|(name, _, _)| *name)
        .chain(["loader"])
        .map(|name| ClusterName::from(format!("inventory/{name}")))
        .collect();
    let reasons = wait_until_unusable(&manager, address, &names).await;
    for (name, _, expected) in &refused {
        let reason = &reasons[&ClusterName::from(format!("inventory/{name}"))];
        assert!(
            reason.starts_with(&format!(
                "kubeconfig from ClusterProfile inventory/{name} access provider \"blind\" refused"
            )),
            "{reason}"
        );
        assert!(reason.contains(expected), "{reason}");
        assert!(!reason.contains(&ca_file), "{reason}");
    }
    let loader = &reasons[&ClusterName::from("inventory/loader")];
    assert!(
        loader.contains(&format!(
            "extension {ADDITIONAL_ENVS_EXTENSION} sets \"LD_PRELOAD\", a variable not named in the provider's profileSourcedEnvVarNames"
        )),
        "{loader}"
    );
    assert!(!loader.contains(&ca_file), "{loader}");
    // Each a refusal by policy, the loader's variable too.
    let metrics = manager.metrics().encode();
    assert!(
        metrics.lines().any(|line| line
            == "mcr_cluster_engagement_failures_total{provider=\"cluster-inventory-api\",reason=\"refused-kubeconfig\"} 4"),
        "{metrics}"
    );
    traps.assert_untouched().await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
