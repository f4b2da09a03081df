//! Whoever may write ClusterProfile status writes the server an access
//! provider's credential is sent to, and the data its plugin mints it by.
//! A "thief" profile hands the plugin a victim's data (its `STATE_DIR`,
//! where the test plugin finds the victim's token, and its exec
//! extension), written the same or differently, or the data of a member
//! no profile describes, and names a listener of its own.
//!
//! - With the default options (the provider bound to no servers, or to a
//!   network or a CA only) every profile of a provider whose plugin reads
//!   profiles is refused, naming the provider and the option: no plugin
//!   runs, the listener is never reached.
//! - Bound to servers named one by one with their CA, the thieves are
//!   refused by the binding; a thief naming another bound server (the
//!   hub's) with the victim's data is refused by the steering rule,
//!   before and after a restart, with the victim not ready meanwhile; the
//!   victim stays engaged and listed.
//! - With `allowUnboundProfileInput` the start-up warning says what it
//!   allows, and copies of the victim's data (written alike in meaning)
//!   are refused whichever is looked at first and after a restart while
//!   the victim is not ready.
//!
//! Alone in its test binary: it listens to the provider's warnings with a
//! global subscriber, which must be set before any event.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use common::{base64_pem, call_field, create_profile, health, set_health, set_status};
use multicluster_envtest::ControlPlane;
use multicluster_envtest::plugins::{self, calls};
use multicluster_envtest::traps::Traps;
use multicluster_provider_cluster_inventory_api::access::{
    ADDITIONAL_ARGS_EXTENSION, ADDITIONAL_ENVS_EXTENSION, ProviderFile,
};
use multicluster_provider_cluster_inventory_api::{ClusterProfileOptions, ClusterProfileProvider};
use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::{
    run_manager, serve_health, wait_until_ready, wait_until_unusable,
};
use multicluster_runtime::{ClusterName, ManagerOptions};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

/// The warnings logged in this test binary.
fn warnings() -> &'static Mutex<Vec<String>> {
    static WARNINGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    let warnings = WARNINGS.get_or_init(Mutex::default);
    static LISTENING: OnceLock<()> = OnceLock::new();
    LISTENING.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(Warnings);
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    });
    warnings
}

struct Warnings;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        warnings().lock().expect("lock").push(message.0);
    }
}

fn warned(containing: &str) -> usize {
    warnings()
        .lock()
        .expect("lock")
        .iter()
        .filter(|line| line.contains(containing))
        .count()
}

/// The "token" provider: it hands out `$STATE_DIR/token`, and reads what
/// profiles write (the cluster entry, additional arguments, `STATE_DIR`
/// and `KEEP`, which the file sets itself), as a real plugin mints by a
/// cluster name. `extra` adds to it (a binding, the opt-in).
fn token_provider(extra: serde_json::Value) -> ProviderFile {
    let mut token = json!({
        "name": "token",
        "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": plugins::TOKEN,
            "env": [{"name": "KEEP", "value": "configured"}],
            "provideClusterInfo": true,
        },
        "profileSourcedCLIArgsPolicy": "Append",
        "profileSourcedEnvVarsPolicy": "AppendIfNotExists",
        "profileSourcedEnvVarNames": ["STATE_DIR", "KEEP"],
    });
    for (key, value) in extra.as_object().expect("object") {
        token[key] = value.clone();
    }
    ProviderFile::from_json(
        &json!({"providers": [token]}).to_string(),
        "test provider file",
    )
    .expect("provider file")
}

/// How many of the plugin's calls for `state` were for `server` (the
/// plugin is given the cluster entry, server included).
fn calls_for(state: &Path, server: &str) -> usize {
    calls(state)
        .iter()
        .filter(|call| call_field(call, "info").contains(&format!("\"server\":\"{server}\"")))
        .count()
}

/// The hub, the victim's cluster, the listener, and the plugin's state
/// for the victim and for a member no profile describes.
struct Scene {
    hub_cp: ControlPlane,
    hub_server: String,
    hub: kube::Client,
    victim: ControlPlane,
    traps: Traps,
    victim_state: tempfile::TempDir,
    orphan_state: tempfile::TempDir,
}

impl Scene {
    async fn set() -> Self {
        warnings();
        let (hub_cp, victim) = tokio::join!(ControlPlane::start(), ControlPlane::start());
        let (hub_cp, victim) = (hub_cp.expect("hub"), victim.expect("victim"));
        let hub = common::hub(&hub_cp).await;
        let victim_state = common::state_with_token(&victim, "victim").await;
        let orphan_state = common::state_with_token(&victim, "orphan").await;
        Self {
            hub_server: hub_cp.server().to_string(),
            hub_cp,
            hub,
            victim,
            traps: Traps::set().await.expect("traps"),
            victim_state,
            orphan_state,
        }
    }

    /// A ready status whose "token" entry names `server` and hands the
    /// plugin `state` and the exec extension `config`, with `extensions`
    /// besides.
    fn status(
        &self,
        server: &str,
        state: &Path,
        config: serde_json::Value,
        mut extensions: Vec<serde_json::Value>,
        env: serde_json::Value,
    ) -> serde_json::Value {
        let mut envs = json!({"STATE_DIR": state});
        for (key, value) in env.as_object().expect("object") {
            envs[key] = value.clone();
        }
        extensions.push(json!({"name": "client.authentication.k8s.io/exec", "extension": config}));
        extensions.push(json!({"name": ADDITIONAL_ENVS_EXTENSION, "extension": envs}));
        let mut status = json!({"accessProviders": [{"name": "token", "cluster": {
            "server": server,
            "certificate-authority-data": base64_pem(self.victim.ca_pem()),
            "extensions": extensions,
        }}]});
        status["conditions"] = health(true)["conditions"].clone();
        status
    }

    /// The victim's own status: its server, its data.
    fn victim_status(&self) -> serde_json::Value {
        self.status(
            self.victim.server(),
            self.victim_state.path(),
            json!({"cluster": "victim"}),
            vec![],
            json!({}),
        )
    }

    /// The thieves, by profile name: the victim's data written the same,
    /// with one more field, with empty additional arguments, with a
    /// variable the configured environment keeps; and the data of a
    /// member no profile describes. Each names the listener.
    fn thieves(&self) -> Vec<(&'static str, serde_json::Value)> {
        let listener = self.traps.server();
        let victim = self.victim_state.path();
        let copy =
            |config, extensions, env| self.status(&listener, victim, config, extensions, env);
        vec![
            (
                "copy",
                copy(json!({"cluster": "victim"}), vec![], json!({})),
            ),
            (
                "extra-field",
                copy(json!({"cluster": "victim", "x": "1"}), vec![], json!({})),
            ),
            (
                "empty-args",
                copy(
                    json!({"cluster": "victim"}),
                    vec![json!({"name": ADDITIONAL_ARGS_EXTENSION, "extension": {"args": []}})],
                    json!({}),
                ),
            ),
            (
                "kept-variable",
                copy(json!({"cluster": "victim"}), vec![], json!({"KEEP": "x"})),
            ),
            (
                "orphan",
                self.status(
                    &listener,
                    self.orphan_state.path(),
                    json!({"cluster": "orphan"}),
                    vec![],
                    json!({}),
                ),
            ),
        ]
    }

    async fn put(&self, name: &str, status: serde_json::Value) {
        create_profile(&self.hub, name).await;
        set_status(&self.hub, name, status).await;
    }

    /// The victim, made a second before whatever is made next: a
    /// `creationTimestamp` has seconds only, and within one second the
    /// name decides which profile is older.
    async fn put_victim(&self) {
        self.put("victim", self.victim_status()).await;
        let victim = common::profiles(&self.hub)
            .get("victim")
            .await
            .expect("victim");
        let created = victim
            .metadata
            .creation_timestamp
            .expect("created")
            .0
            .as_second();
        // What is waited for is the clock itself: until the next second
        // of the API server's (this machine's) clock begins.
        let next_second = k8s_openapi::jiff::Timestamp::from_second(created + 1)
            .expect("a time after the victim's creation");
        let left = next_second.duration_since(k8s_openapi::jiff::Timestamp::now());
        if let Ok(left) = std::time::Duration::try_from(left) {
            tokio::time::sleep(left).await;
        }
    }

    /// Asserts that the plugin never ran for the listener or `others`
    /// and the listener was never reached.
    async fn assert_no_credential_left(&self, others: &[&str]) {
        for state in [self.victim_state.path(), self.orphan_state.path()] {
            for server in others.iter().copied().chain([self.traps.server().as_str()]) {
                assert_eq!(calls_for(state, server), 0, "minted for {server}");
            }
        }
        self.traps.assert_untouched().await;
    }
}

fn names(names: &[&str]) -> Vec<ClusterName> {
    names
        .iter()
        .map(|name| ClusterName::from(format!("inventory/{name}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_plugin_reading_profiles_runs_for_no_server_nobody_named() {
    let scene = Scene::set().await;
    scene.put_victim().await;
    for (name, status) in scene.thieves() {
        scene.put(name, status).await;
    }
    let everyone: Vec<&str> = std::iter::once("victim")
        .chain(scene.thieves().iter().map(|(name, _)| *name))
        .collect();
    let victim_server = scene.victim.server().to_string();
    let bindings = [
        ("bound to no servers", json!({}), "is bound to no servers"),
        (
            "bound to a network",
            json!({"servers": ["127.0.0.0/8"]}),
            "not named one by one",
        ),
        (
            "bound to a CA only",
            json!({"serverCAData": base64_pem(scene.victim.ca_pem())}),
            "not named one by one",
        ),
        (
            "bound to a host without its CA",
            json!({"servers": [victim_server.trim_start_matches("https://")]}),
            "not named one by one",
        ),
    ];
    for (case, binding, says) in bindings {
        let provider = Arc::new(ClusterProfileProvider::new(
            scene.hub.clone(),
            ClusterProfileOptions::with_access_providers(token_provider(binding)),
        ));
        let (manager, _recorder) =
            common::manager(&scene.hub, &provider, ManagerOptions::default());
        let (shutdown, task) = run_manager(&manager);
        let address = serve_health(&manager, shutdown.clone()).await;
        let reasons = wait_until_unusable(&manager, address, &names(&everyone)).await;
        for (name, reason) in &reasons {
            for expected in [
                "access provider \"token\" hands its plugin what profiles write (execConfig.provideClusterInfo, profileSourcedCLIArgsPolicy, profileSourcedEnvVarsPolicy)",
                says,
                "allowUnboundProfileInput",
            ] {
                assert!(reason.contains(expected), "{case}: {name}: {reason}");
            }
        }
        let metrics = manager.metrics().encode();
        assert!(
            metrics.lines().any(|line| line
                == format!("mcr_cluster_engagement_failures_total{{provider=\"cluster-inventory-api\",reason=\"refused-kubeconfig\"}} {}", everyone.len())),
            "{case}: {metrics}"
        );
        assert!(provider.names().is_empty(), "{case}");
        shutdown.cancel();
        task.await.expect("task").expect("clean stop");
    }
    assert!(
        calls(scene.victim_state.path()).is_empty(),
        "the plugin ran"
    );
    assert!(
        calls(scene.orphan_state.path()).is_empty(),
        "the plugin ran"
    );
    scene.assert_no_credential_left(&[]).await;
    assert!(warned("profiles choosing it are refused") >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_to_servers_named_one_by_one_no_profile_gets_another_members_credential() {
    let scene = Scene::set().await;
    // The hub stands for a second member the operator bound: a thief
    // naming it with the victim's data is inside the binding.
    let members = json!({"servers": [
        {"server": scene.victim.server(), "certificateAuthorityData": base64_pem(scene.victim.ca_pem())},
        {"server": scene.hub_server, "certificateAuthorityData": base64_pem(scene.hub_cp.ca_pem())},
    ]});
    let file = token_provider(members);
    // A thief at the bound server, made after the victim.
    let bystander = scene.status(
        &scene.hub_server,
        scene.victim_state.path(),
        json!({"cluster": "victim"}),
        vec![],
        json!({}),
    );
    scene.put_victim().await;
    for (name, status) in scene.thieves() {
        scene.put(name, status).await;
    }
    scene.put("bystander", bystander).await;
    let thieves: Vec<&str> = scene.thieves().iter().map(|(name, _)| *name).collect();

    let start = || {
        let provider = Arc::new(ClusterProfileProvider::new(
            scene.hub.clone(),
            ClusterProfileOptions::with_access_providers(file.clone()),
        ));
        let (manager, _recorder) =
            common::manager(&scene.hub, &provider, ManagerOptions::default());
        (provider, manager)
    };
    let (provider, manager) = start();
    let (shutdown, task) = run_manager(&manager);
    let address = serve_health(&manager, shutdown.clone()).await;
    wait_until_ready(&manager, "inventory/victim").await;
    let mut refused = thieves.clone();
    refused.push("bystander");
    let reasons = wait_until_unusable(&manager, address, &names(&refused)).await;
    for name in &thieves {
        let reason = &reasons[&ClusterName::from(format!("inventory/{name}"))];
        assert!(
            reason.contains(
                "is not among the servers access provider \"token\" may send credentials to"
            ),
            "{name}: {reason}"
        );
    }
    // Which of the two it yields to the victim as (older, or engaged)
    // depends on which was looked at first.
    let bystander = &reasons[&ClusterName::from("inventory/bystander")];
    assert!(
        bystander.contains("same input as ClusterProfile inventory/victim"),
        "{bystander}"
    );
    assert_eq!(provider.names(), names(&["victim"]));
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");

    // A restart with the victim not ready: its copy at the bound server
    // still yields to it (older), and the victim comes back once ready.
    set_health(&scene.hub, "victim", false, None).await;
    let (provider, manager) = start();
    let (shutdown, task) = run_manager(&manager);
    let address = serve_health(&manager, shutdown.clone()).await;
    let reasons = wait_until_unusable(&manager, address, &names(&["bystander"])).await;
    assert!(
        reasons[&ClusterName::from("inventory/bystander")]
            .contains("same input as ClusterProfile inventory/victim, which is older"),
        "{reasons:?}"
    );
    set_health(&scene.hub, "victim", true, None).await;
    wait_until_ready(&manager, "inventory/victim").await;
    assert_eq!(provider.names(), names(&["victim"]));
    assert!(
        provider
            .failures()
            .contains_key(&ClusterName::from("inventory/bystander"))
    );
    assert!(calls_for(scene.victim_state.path(), scene.victim.server()) >= 2);
    scene.assert_no_credential_left(&[&scene.hub_server]).await;
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_any_server_copies_of_the_victims_input_are_still_refused() {
    let scene = Scene::set().await;
    let file = token_provider(json!({"allowUnboundProfileInput": true}));
    // Copies alike in meaning (one more field or a member no profile
    // describes are not: only a binding keeps those from the listener).
    let copies = ["copy", "empty-args", "kept-variable"];
    scene.put_victim().await;
    for (name, status) in scene.thieves() {
        if copies.contains(&name) {
            scene.put(name, status).await;
        }
    }
    let warning = "allowUnboundProfileInput: its plugin runs with what ClusterProfiles write";
    for restart in [false, true] {
        if restart {
            set_health(&scene.hub, "victim", false, None).await;
        }
        let before = warned(warning);
        let provider = Arc::new(ClusterProfileProvider::new(
            scene.hub.clone(),
            ClusterProfileOptions::with_access_providers(file.clone()),
        ));
        let (manager, _recorder) =
            common::manager(&scene.hub, &provider, ManagerOptions::default());
        let (shutdown, task) = run_manager(&manager);
        let address = serve_health(&manager, shutdown.clone()).await;
        let reasons = wait_until_unusable(&manager, address, &names(&copies)).await;
        for (name, reason) in &reasons {
            assert!(
                reason.contains("same input as ClusterProfile inventory/victim"),
                "{name}: {reason}"
            );
        }
        assert_eq!(warned(warning) - before, 1, "told once at start");
        if restart {
            set_health(&scene.hub, "victim", true, None).await;
        }
        wait_until_ready(&manager, "inventory/victim").await;
        assert_eq!(provider.names(), names(&["victim"]));
        shutdown.cancel();
        task.await.expect("task").expect("clean stop");
    }
    scene.assert_no_credential_left(&[]).await;
}
