//! ClusterProfiles with the Secret credentials strategy, on a real hub
//! control plane with workload control planes behind the Secrets.

mod common;

use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::wait_for_fleet;
use std::collections::BTreeMap;
use std::sync::Arc;

use common::{NS, create_profile, profiles, req, set_health, workload};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::traps::Traps;
use multicluster_provider_cluster_inventory_api::{
    CLUSTER_ID_PROPERTY, CLUSTER_MANAGER_LABEL, ClusterProfileOptions, ClusterProfileProvider,
    SECRET_KEY, SECRET_KEY_LOWER_CASE, WATCH_FILTER_LABEL,
};
use multicluster_runtime::provider::member::Members;
use multicluster_runtime::testing::{
    run_manager, serve_health, wait_on, wait_until_left, wait_until_unreachable,
    wait_until_unusable,
};
use multicluster_runtime::{ClusterName, ManagerOptions};

/// Creates the Secret `name` holding `workload`'s kubeconfig for `consumer`
/// of `profile`.
async fn create_credentials(
    secrets: &Api<Secret>,
    name: &str,
    profile: &str,
    consumer: &str,
    workload: &ControlPlane,
) {
    secrets
        .create(
            &PostParams::default(),
            &credentials(name, profile, consumer, workload),
        )
        .await
        .expect("secret");
}

fn credentials(name: &str, profile: &str, consumer: &str, workload: &ControlPlane) -> Secret {
    common::credentials_secret(name, profile, consumer, workload.kubeconfig())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_profiles_are_engaged_with_their_consumers_secret() {
    let (hub_cp, first, second) = tokio::join!(
        ControlPlane::start(),
        workload("in-first"),
        workload("in-second")
    );
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let secrets = Api::<Secret>::namespaced(hub.clone(), NS);

    create_profile(&hub, "alpha").await;
    set_health(&hub, "alpha", true, Some("id-alpha")).await;
    create_credentials(&secrets, "alpha-creds", "alpha", "me", &first).await;
    // Another consumer's Secret for the same profile is not ours.
    create_credentials(&secrets, "alpha-other", "alpha", "someone-else", &second).await;
    create_profile(&hub, "beta").await;
    set_health(&hub, "beta", false, None).await;
    create_credentials(&secrets, "beta-creds", "beta", "me", &second).await;
    create_profile(&hub, "gamma").await;
    set_health(&hub, "gamma", true, None).await;
    // Two Secrets for one profile: an error for that profile only.
    create_profile(&hub, "delta").await;
    set_health(&hub, "delta", true, None).await;
    create_credentials(&secrets, "delta-1", "delta", "me", &first).await;
    create_credentials(&secrets, "delta-2", "delta", "me", &second).await;

    // Member options chosen per profile: alpha's cache is held to the
    // namespace its ConfigMaps are in, the others watch every namespace.
    let members = Members::default().per_member(|profile: &DynamicObject, options| {
        if profile.metadata.name.as_deref() == Some("alpha") {
            let cache = options.cache.clone().namespace("default".to_string());
            options.cache(cache)
        } else {
            options
        }
    });
    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_secrets("me").members(members),
    ));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);

    recorder
        .wait_for_more(&req("inventory/alpha", "in-first"), 0)
        .await;
    let alpha = manager
        .get_cluster(&ClusterName::from("inventory/alpha"))
        .await
        .expect("alpha");
    assert_eq!(alpha.stable_id(), Some("id-alpha"));
    let held_to = |cluster: &multicluster_runtime::Cluster| {
        cluster.cache().options().and_then(|o| o.namespace.clone())
    };
    assert_eq!(held_to(&alpha), Some("default".to_string()));
    // Its labels and properties are the profile's; the cluster manager's
    // label comes from the spec, the cluster manager having set none.
    let inventory = alpha.inventory();
    assert_eq!(
        inventory
            .labels
            .get(CLUSTER_MANAGER_LABEL)
            .map(String::as_str),
        Some("test")
    );
    assert_eq!(
        inventory
            .properties
            .get(CLUSTER_ID_PROPERTY)
            .map(String::as_str),
        Some("id-alpha")
    );

    // Becoming healthy engages. Events are handled in order, so by now the
    // whole initial list has been looked at.
    set_health(&hub, "beta", true, None).await;
    recorder
        .wait_for_more(&req("inventory/beta", "in-second"), 0)
        .await;
    let beta = manager
        .get_cluster(&ClusterName::from("inventory/beta"))
        .await
        .expect("beta");
    assert_eq!(held_to(&beta), None);
    assert_eq!(
        provider.names(),
        [
            ClusterName::from("inventory/alpha"),
            ClusterName::from("inventory/beta")
        ],
        "gamma has no Secret, delta has two"
    );

    // A Secret created later engages; removing delta's extra Secret does too.
    create_credentials(&secrets, "gamma-creds", "gamma", "me", &second).await;
    recorder
        .wait_for_more(&req("inventory/gamma", "in-second"), 0)
        .await;
    secrets
        .delete("delta-1", &DeleteParams::default())
        .await
        .expect("delete");
    recorder
        .wait_for_more(&req("inventory/delta", "in-second"), 0)
        .await;

    // Unchanged credentials (a metadata-only change) never re-engage.
    secrets
        .patch(
            "alpha-creds",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"x": "y"}}})),
        )
        .await
        .expect("annotate");
    // Relabelling a profile updates its cluster's labels, nothing else.
    profiles(&hub)
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"env": "production"}}})),
        )
        .await
        .expect("relabel");
    wait_on(
        "alpha's new label",
        &mut alpha.inventory_changes(),
        |inventory| inventory.labels.get("env").map(String::as_str) == Some("production"),
    )
    .await;
    // A ready profile turning unhealthy stays engaged.
    set_health(&hub, "alpha", false, Some("id-alpha")).await;
    // Rotation of beta's Secret is the synchronisation point.
    secrets
        .replace(
            "beta-creds",
            &PostParams::default(),
            &credentials("beta-creds", "beta", "me", &first),
        )
        .await
        .expect("rotate");
    recorder
        .wait_for_more(&req("inventory/beta", "in-first"), 0)
        .await;
    assert!(
        manager
            .get_cluster(&ClusterName::from("inventory/alpha"))
            .await
            .expect("alpha")
            .same_instance(&alpha),
        "alpha neither re-engaged nor dropped"
    );

    // Deleted → removed.
    profiles(&hub)
        .delete("beta", &DeleteParams::default())
        .await
        .expect("delete");
    wait_until_left(&manager, "inventory/beta").await;
    assert!(
        !provider
            .names()
            .contains(&ClusterName::from("inventory/beta"))
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A Secret with the key missing, text that is not a kubeconfig, or a
/// credential plugin that fails keeps only its own profile out, with a
/// reason naming the Secret and key and quoting nothing; an untrusted server
/// is engaged and reported unreachable; a healthy profile created last is
/// engaged regardless, and so is one whose Secret has the key upstream's
/// implementation writes (`config`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_affect_only_their_own_profile() {
    const TOKEN: &str = "token-that-must-not-leak";
    let (hub_cp, healthy, stranger) =
        tokio::join!(ControlPlane::start(), workload("hello"), workload("other"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let secrets = Api::<Secret>::namespaced(hub.clone(), NS);
    let with_config = |profile: &str, text: Option<String>| {
        let mut secret = credentials(&format!("{profile}-creds"), profile, "me", &healthy);
        secret.data = text
            .map(|text| BTreeMap::from([(SECRET_KEY.to_string(), ByteString(text.into_bytes()))]));
        secret
    };
    let exec_plugin = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n      args: [--token={TOKEN}]\n      interactiveMode: Never\n",
        healthy.server(),
        multicluster_envtest::plugins::REFUSE,
    );
    let untrusted = healthy.kubeconfig_trusting(&stranger);
    let cases: [(&str, Option<String>, &str); 5] = [
        (
            "no-key",
            None,
            "Secret inventory/no-key-creds key \"Config\" is missing, empty or not text",
        ),
        (
            "not-yaml",
            Some(format!("token: [{TOKEN}")),
            "Secret inventory/not-yaml-creds key \"Config\": it is not valid kubeconfig YAML",
        ),
        (
            "not-kubeconfig",
            Some("just: a map\n".into()),
            "not a kubeconfig",
        ),
        (
            "exec-plugin",
            Some(exec_plugin),
            "users[\"u\"].user.exec runs a command, which kubeconfigs from this source may not",
        ),
        (
            "untrusted",
            Some(multicluster_envtest::to_yaml(&untrusted).expect("yaml")),
            "",
        ),
    ];
    for (profile, text, _) in &cases {
        create_profile(&hub, profile).await;
        set_health(&hub, profile, true, None).await;
        secrets
            .create(&PostParams::default(), &with_config(profile, text.clone()))
            .await
            .expect("secret");
    }

    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_secrets("me"),
    ));
    let (manager, recorder) = common::manager(
        &hub,
        &provider,
        ManagerOptions::default().sync_timeout(std::time::Duration::from_secs(3)),
    );
    let (shutdown, task) = run_manager(&manager);
    wait_until_unreachable(&manager, "inventory/untrusted").await;
    create_profile(&hub, "healthy").await;
    set_health(&hub, "healthy", true, None).await;
    create_credentials(&secrets, "healthy-creds", "healthy", "me", &healthy).await;
    recorder
        .wait_for_more(&req("inventory/healthy", "hello"), 0)
        .await;
    // The key upstream's implementation writes, `config`, is read too.
    create_profile(&hub, "lower-case").await;
    set_health(&hub, "lower-case", true, None).await;
    let mut lower = credentials("lower-case-creds", "lower-case", "me", &healthy);
    lower.data = lower.data.map(|data| {
        data.into_values()
            .map(|value| (SECRET_KEY_LOWER_CASE.to_string(), value))
            .collect()
    });
    secrets
        .create(&PostParams::default(), &lower)
        .await
        .expect("secret");
    recorder
        .wait_for_more(&req("inventory/lower-case", "hello"), 0)
        .await;

    // Clients are built concurrently: a failure lands when its build ends.
    let failing: Vec<_> = cases.iter().filter(|case| !case.2.is_empty()).collect();
    wait_for_fleet(
        &manager,
        "every bad profile's failure to be recorded",
        || {
            let failures = provider.failures();
            failing.iter().all(|(profile, _, _)| {
                failures.contains_key(&ClusterName::from(format!("{NS}/{profile}")))
            })
        },
    )
    .await;
    let failures = provider.failures();
    for (profile, _, expected) in failing {
        let reason = &failures[&ClusterName::from(format!("{NS}/{profile}"))];
        assert!(reason.contains(expected), "{profile}: {reason}");
        assert!(!reason.contains(TOKEN), "{profile} leaked: {reason}");
    }
    assert_eq!(
        provider.names(),
        [
            ClusterName::from("inventory/healthy"),
            ClusterName::from("inventory/lower-case"),
            ClusterName::from("inventory/untrusted")
        ]
    );
    assert_eq!(recorder.for_cluster("inventory/untrusted"), 0);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// An instance limited to one namespace and one watch-filter value works
/// with RBAC for that namespace only and takes only its own profiles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_filtered_instance_needs_rbac_for_its_namespace_only() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("hello"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let read = |group: &str, resource: &str| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: vec!["get".into(), "list".into(), "watch".into()],
        ..PolicyRule::default()
    };
    hub_cp
        .grant_in_namespace(
            NS,
            "tenant",
            vec![
                read("multicluster.x-k8s.io", "clusterprofiles"),
                read("", "secrets"),
            ],
        )
        .await
        .expect("grant");
    let tenant = multicluster_envtest::client_for(
        &hub_cp.user_kubeconfig("tenant", None).expect("kubeconfig"),
    )
    .await
    .expect("client");

    let secrets = Api::<Secret>::namespaced(hub.clone(), NS);
    for (profile, filter) in [
        ("mine", Some("x")),
        ("theirs", Some("y")),
        ("unlabelled", None),
    ] {
        create_profile(&hub, profile).await;
        if let Some(value) = filter {
            profiles(&hub)
                .patch(
                    profile,
                    &PatchParams::default(),
                    &Patch::Merge(
                        serde_json::json!({"metadata": {"labels": {WATCH_FILTER_LABEL: value}}}),
                    ),
                )
                .await
                .expect("label");
        }
        set_health(&hub, profile, true, None).await;
        create_credentials(
            &secrets,
            &format!("{profile}-creds"),
            profile,
            "me",
            &member,
        )
        .await;
    }

    let mut options = ClusterProfileOptions::with_secrets("me");
    options.namespace = Some(NS.into());
    options.watch_filter = Some("x".into());
    let provider = Arc::new(ClusterProfileProvider::new(tenant.clone(), options));
    let (manager, recorder) = common::manager(&tenant, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("inventory/mine", "hello"), 0)
        .await;
    // A later profile of the same filter is the sync point for the others.
    create_profile(&hub, "mine-too").await;
    profiles(&hub)
        .patch(
            "mine-too",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {WATCH_FILTER_LABEL: "x"}}})),
        )
        .await
        .expect("label");
    set_health(&hub, "mine-too", true, None).await;
    create_credentials(&secrets, "mine-too-creds", "mine-too", "me", &member).await;
    recorder
        .wait_for_more(&req("inventory/mine-too", "hello"), 0)
        .await;
    assert_eq!(
        provider.names(),
        [
            ClusterName::from("inventory/mine"),
            ClusterName::from("inventory/mine-too")
        ]
    );
    assert!(provider.failures().is_empty(), "{:?}", provider.failures());

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A custom readiness replaces `ControlPlaneHealthy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_readiness_replaces_control_plane_healthy() {
    let (hub_cp, member) = tokio::join!(ControlPlane::start(), workload("hello"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let secrets = Api::<Secret>::namespaced(hub.clone(), NS);
    // Healthy but not joined, and joined but not healthy: the default
    // readiness would engage only the first, the custom one only the second.
    for (profile, healthy, joined) in [("healthy", true, false), ("joined", false, true)] {
        create_profile(&hub, profile).await;
        let mut status = common::health(healthy);
        status["conditions"]
            .as_array_mut()
            .expect("conditions")
            .push(serde_json::json!({
                "type": "Joined",
                "status": if joined { "True" } else { "False" },
                "reason": "Test",
                "message": "set by the test",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }));
        common::set_status(&hub, profile, status).await;
        create_credentials(
            &secrets,
            &format!("{profile}-creds"),
            profile,
            "me",
            &member,
        )
        .await;
    }

    let mut options = ClusterProfileOptions::with_secrets("me");
    options.readiness = Some(Arc::new(|profile: &kube::api::DynamicObject| {
        profile.data["status"]["conditions"]
            .as_array()
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c["type"] == "Joined" && c["status"] == "True")
            })
    }));
    let provider = Arc::new(ClusterProfileProvider::new(hub.clone(), options));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(&req("inventory/joined", "hello"), 0)
        .await;
    assert_eq!(provider.names(), [ClusterName::from("inventory/joined")]);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A consumer's credentials Secrets are objects of the hub, written by
/// whoever may write Secrets in the profiles' namespace. With the Secret
/// strategy's default options, ready profiles whose Secrets' kubeconfigs
/// would run a plugin (one that leaves a mark), read a token file, a client
/// certificate and key or a CA file, use an auth provider, skip TLS
/// verification or pick a proxy are refused before any of it happens: no
/// mark, no file opened, their server (a listener) never reached; each is
/// shown unusable naming the Secret, the field and the policy field that
/// would allow it. So are credentials no header can carry and servers no
/// request can be made on (no scheme, user info, port 0), and nothing
/// panics. A healthy profile is engaged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_that_would_run_read_or_dial_are_refused_with_the_default_options() {
    let (hub_cp, healthy) = tokio::join!(ControlPlane::start(), workload("hello"));
    let hub_cp = hub_cp.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let secrets = Api::<Secret>::namespaced(hub.clone(), NS);
    let traps = Traps::set().await.expect("traps");
    let panics = multicluster_envtest::panics::Panics::count();
    let kubeconfigs = [
        traps.kubeconfigs(healthy.ca_pem()),
        traps.broken_credentials(healthy.ca_pem()),
        traps.broken_servers(healthy.ca_pem()),
    ]
    .concat();
    for trap in &kubeconfigs {
        create_profile(&hub, trap.name).await;
        set_health(&hub, trap.name, true, None).await;
        let mut secret = credentials(&format!("{}-creds", trap.name), trap.name, "me", &healthy);
        secret.data = Some(BTreeMap::from([(
            SECRET_KEY.to_string(),
            ByteString(
                multicluster_envtest::to_yaml(&trap.kubeconfig)
                    .expect("yaml")
                    .into_bytes(),
            ),
        )]));
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret");
    }
    create_profile(&hub, "healthy").await;
    set_health(&hub, "healthy", true, None).await;
    create_credentials(&secrets, "healthy-creds", "healthy", "me", &healthy).await;

    let provider = Arc::new(ClusterProfileProvider::new(
        hub.clone(),
        ClusterProfileOptions::with_secrets("me"),
    ));
    let (manager, recorder) = common::manager(&hub, &provider, ManagerOptions::default());
    let (shutdown, task) = run_manager(&manager);
    let address = serve_health(&manager, shutdown.clone()).await;
    recorder
        .wait_for_more(&req("inventory/healthy", "hello"), 0)
        .await;
    let names: Vec<_> = kubeconfigs
        .iter()
        .map(|trap| ClusterName::from(format!("{NS}/{}", trap.name)))
        .collect();
    let reasons = wait_until_unusable(&manager, address, &names).await;
    for (trap, name) in kubeconfigs.iter().zip(&names) {
        let origin = format!("Secret {NS}/{}-creds key \"Config\"", trap.name);
        trap.assert_refused(&reasons[name], &origin, &traps);
    }
    assert_eq!(provider.names(), [ClusterName::from("inventory/healthy")]);
    traps.assert_untouched().await;
    assert_eq!(panics.since(), 0, "panicked: {:?}", panics.messages());

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}
