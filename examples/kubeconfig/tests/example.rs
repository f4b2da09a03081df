//! The example binary against a real management and member control plane:
//! it copies in the member while another Secret's credential plugin hangs,
//! and SIGTERM stops it within its grace period, plugin included.

use multicluster_runtime::testing::Polled;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use multicluster_envtest::traps::Traps;
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_example_configmap_sync::SYNC_LABEL;
use multicluster_example_testing::{GRACE, terminate, terminate_showing_log, wait_for_copy};
use multicluster_runtime::testing::eventually;
use tokio::process::Command;

mod common;

use common::{clusters_line, example, free_address, management_and_member, put_secrets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_example_while_a_credential_plugin_hangs() {
    let (management, member) = management_and_member().await;
    let state = tempfile::tempdir().expect("state");
    plugins::set_token(state.path(), "never-handed-out").expect("token");
    plugins::hold(state.path()).expect("hold");
    let stuck = member.exec_kubeconfig("stuck", plugins::TOKEN, state.path());
    put_secrets(
        &management,
        &[("stuck", &stuck), ("member", member.kubeconfig())],
    )
    .await;

    let mut example = example(&management)
        .args(["--health-address", "127.0.0.1:0"])
        .args([
            "--allow-exec-plugin",
            plugins::TOKEN,
            "--allow-exec-env",
            "STATE_DIR",
        ])
        .spawn()
        .expect("example");
    wait_for_copy(member.client().await.expect("client"), "settings").await;
    let plugin = plugins::first_call_running(state.path()).await;

    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
    plugins::wait_until_stopped(plugin, "the plugin the example ran").await;
}

/// SIGTERM while reconciles hang on a member whose API server stopped
/// answering: they end at their request deadline, inside the grace period,
/// and the example exits 0 without abandoning anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_reconciles_hung_on_a_stopped_member_exits_within_the_grace_period() {
    let (management, member) = management_and_member().await;
    put_secrets(&management, &[("member", member.kubeconfig())]).await;
    let address = free_address();
    let logs = tempfile::tempdir().expect("logs");
    let log = logs.path().join("example.log");
    let grace = Duration::from_secs(10);
    let mut example = example(&management)
        .args(["--request-timeout", "3s"])
        .args(["--shutdown-grace", "10s", "--health-address"])
        .arg(address.to_string())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("example");
    let member_client = member.client().await.expect("client");
    wait_for_copy(member_client.clone(), "settings").await;

    // A burst of changes, and the member stops answering while the example
    // reconciles them.
    let configmaps = Api::<ConfigMap>::namespaced(member_client, "default");
    for i in 0..20 {
        let mut source = ConfigMap::default();
        source.metadata.name = Some(format!("burst-{i}"));
        source.metadata.labels = Some([(SYNC_LABEL.to_string(), "true".to_string())].into());
        configmaps
            .create(&PostParams::default(), &source)
            .await
            .expect("source");
    }
    member.pause_api_server().expect("SIGSTOP");
    clusters_line(address, "member\tunreachable").await;

    let status = terminate_showing_log(&mut example, grace, &log).await;
    member.resume_api_server().expect("SIGCONT");
    assert!(status.success(), "{status}");
    let output = std::fs::read_to_string(&log).expect("log");
    assert!(
        !output.contains("after the shutdown grace period"),
        "reconciles were abandoned:\n{output}"
    );
}

/// `hack/create-kubeconfig-secret.sh`, run as documented against a member
/// and a management control plane, makes a Secret whose identity can do
/// what the example does — copy, follow, delete — and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_script_grants_what_the_example_needs_and_no_more() {
    let (management, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (management, member) = (management.expect("management"), member.expect("member"));
    // One kubeconfig with a context for each, as an operator has.
    let named = |cp: &ControlPlane, name: &str| {
        let mut kubeconfig = cp.kubeconfig().clone();
        kubeconfig.clusters[0].name = name.into();
        kubeconfig.auth_infos[0].name = name.into();
        kubeconfig.contexts[0].name = name.into();
        if let Some(context) = kubeconfig.contexts[0].context.as_mut() {
            context.cluster = name.into();
            context.user = Some(name.into());
        }
        kubeconfig
    };
    let mut both = named(&management, "mgmt");
    let other = named(&member, "member");
    both.clusters.extend(other.clusters);
    both.auth_infos.extend(other.auth_infos);
    both.contexts.extend(other.contexts);
    let dir = tempfile::tempdir().expect("dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        multicluster_envtest::to_yaml(&both).expect("yaml"),
    )
    .expect("kubeconfig");

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../hack/create-kubeconfig-secret.sh"
    );
    let output = Command::new(script)
        .args(["--name", "member", "--member-context", "member"])
        .args(["--management-context", "mgmt", "--namespace", "fleet"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("the script runs (kubectl must be installed)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.contains("get, list, watch, create, update, patch, delete on configmaps"),
        "{said}"
    );

    let mut example = example(&management)
        .args(["--health-address", "127.0.0.1:0"])
        .spawn()
        .expect("example");
    let admin = member.client().await.expect("client");
    wait_for_copy(admin.clone(), "settings").await;
    let configmaps = Api::<ConfigMap>::namespaced(admin, "default");
    configmaps
        .delete("settings", &kube::api::DeleteParams::default())
        .await
        .expect("delete");
    eventually(
        Polled::ApiServer,
        "the copy to be deleted by the example",
        || async {
            configmaps
                .get_opt("settings-copy")
                .await
                .is_ok_and(|copy| copy.is_none())
        },
    )
    .await;

    // Its warning Events, and no more: not Secrets, not other kinds.
    let can = |account: &'static str, verb: &'static str, resource: &'static str| {
        let kubeconfig = kubeconfig.clone();
        async move {
            let answer = Command::new("kubectl")
                .args(["--context", "member", "auth", "can-i", verb, resource])
                .args([
                    "--as",
                    &format!("system:serviceaccount:multicluster-runtime:{account}"),
                ])
                .env("KUBECONFIG", &kubeconfig)
                .output()
                .await
                .expect("kubectl");
            String::from_utf8_lossy(&answer.stdout).trim() == "yes"
        }
    };
    let sync = "multicluster-runtime";
    for resource in ["events", "events.events.k8s.io"] {
        assert!(can(sync, "create", resource).await, "create {resource}");
    }
    for (verb, resource) in [
        ("get", "secrets"),
        ("list", "secrets"),
        ("create", "deployments"),
        ("create", "resourcequotas"),
    ] {
        assert!(!can(sync, verb, resource).await, "{verb} {resource}");
    }

    // For examples/fleet-quota: quotas, and not ConfigMaps.
    let output = Command::new(script)
        .args(["--name", "member-quota", "--member-context", "member"])
        .args(["--management-context", "mgmt", "--namespace", "fleet"])
        .args(["--for", "fleet-quota", "--service-account", "quota"])
        .args(["--label", "tier=canary", "--label", "region=eu-west"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("the script runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The labels asked for, beside the provider's own.
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        management.client().await.expect("client"),
        "fleet",
    )
    .get("member-quota")
    .await
    .expect("the Secret");
    let labels = secret.metadata.labels.unwrap_or_default();
    for (key, value) in [
        ("tier", "canary"),
        ("region", "eu-west"),
        (multicluster_provider_kubeconfig::DEFAULT_LABEL, "true"),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "{labels:?}"
        );
    }
    assert!(can("quota", "patch", "resourcequotas").await);
    assert!(can("quota", "create", "events.events.k8s.io").await);
    assert!(!can("quota", "create", "configmaps").await);
    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}

/// Run as a user deploys it, without any `--allow-*` flag: a Secret whose
/// kubeconfig names an exec plugin is refused (the plugin never runs, its
/// server is never reached) and shown on `/clusters` with the field and the
/// policy field that would allow it, while the other member is copied into.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_its_defaults_the_example_refuses_a_secret_whose_kubeconfig_runs_a_plugin() {
    let (management, member) = management_and_member().await;
    let traps = Traps::set().await.expect("traps");
    let exec = traps
        .kubeconfigs(member.ca_pem())
        .into_iter()
        .find(|trap| trap.name == "exec")
        .expect("the exec trap");
    put_secrets(
        &management,
        &[
            ("plugged", &exec.kubeconfig),
            ("member", member.kubeconfig()),
        ],
    )
    .await;
    let address = free_address();
    let mut example = example(&management)
        .arg("--health-address")
        .arg(address.to_string())
        .spawn()
        .expect("example");
    wait_for_copy(member.client().await.expect("client"), "settings").await;
    let line = clusters_line(address, "plugged\tunusable: ").await;
    exec.assert_refused(
        line.split('\t')
            .nth(1)
            .unwrap_or_default()
            .trim_start_matches("unusable: "),
        "Secret fleet/plugged key \"kubeconfig\"",
        &traps,
    );
    traps.assert_untouched().await;

    let status = terminate(&mut example, GRACE).await;
    assert!(status.success(), "{status}");
}

/// How long the log is watched while a member stays down.
const DOWN_FOR: Duration = Duration::from_secs(60);

/// Run as deployed (default log level), a member whose API server is gone
/// is reported once; while it stays down its retries add no more than a
/// handful of lines (seen: about 80 a minute before). A member whose server
/// never answered is reported once too, not at every retry of its
/// bring-up (seen: a warning each, 1 s doubling to 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stays_down_adds_only_a_few_log_lines() {
    let (management, member) = management_and_member().await;
    let mut unanswered = member.kubeconfig().clone();
    unanswered.clusters[0]
        .cluster
        .as_mut()
        .expect("cluster")
        .server = Some(format!("https://{}", free_address()));
    put_secrets(
        &management,
        &[("member", member.kubeconfig()), ("unanswered", &unanswered)],
    )
    .await;
    let address = free_address();
    let log = tempfile::NamedTempFile::new().expect("log");
    let mut example = example(&management)
        .arg("--health-address")
        .arg(address.to_string())
        .stderr(log.reopen().expect("log"))
        .spawn()
        .expect("example");
    wait_for_copy(member.client().await.expect("client"), "settings").await;

    member.stop_api_server();
    clusters_line(address, "member\tunreachable").await;
    clusters_line(address, "unanswered\tunreachable").await;
    let lines = || std::fs::read_to_string(log.path()).unwrap_or_default();
    let before = lines().lines().count();
    tokio::time::sleep(DOWN_FOR).await;
    let text = lines();
    let added: Vec<&str> = text.lines().skip(before).collect();
    eprintln!(
        "{} lines in {DOWN_FOR:?} down:\n{}",
        added.len(),
        added.join("\n")
    );
    assert!(
        added.len() <= 6,
        "{} lines in {DOWN_FOR:?} while the member was down:\n{}",
        added.len(),
        added.join("\n")
    );
    let unanswered: Vec<&&str> = added
        .iter()
        .filter(|line| line.contains("unanswered"))
        .collect();
    assert!(unanswered.len() <= 1, "{unanswered:#?}");

    let status = terminate_showing_log(&mut example, GRACE, log.path()).await;
    assert!(status.success(), "{status}");
}

/// A member whose identity may not watch what the example watches: at the
/// example's default log filter (no `RUST_LOG`), the refusal is told when
/// it starts (the watch's failure, the cluster's state), and not again
/// while it goes on (the watch is asked again meanwhile, half a dozen times
/// in half a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_watch_is_told_once_at_the_default_log_filter() {
    let (management, member) = management_and_member().await;
    let nobody = member
        .service_account_kubeconfig("default", "nobody", Duration::from_secs(3600))
        .await
        .expect("a kubeconfig of an identity granted nothing");
    put_secrets(&management, &[("refused", &nobody)]).await;
    let address = free_address();
    let logs = tempfile::tempdir().expect("logs");
    let log = logs.path().join("example.log");
    let mut example = example(&management)
        .arg("--health-address")
        .arg(address.to_string())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("example");
    clusters_line(address, "refused\tdegraded").await;
    // Half a minute of refusals (the scenario's clock).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let output = std::fs::read_to_string(&log).expect("log");
    let told: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("403 Forbidden"))
        .collect();
    // The watch's failure, and the cluster's state: one line each, naming
    // the cluster; nothing from kube-runtime's watcher.
    let watch = told
        .iter()
        .filter(|line| line.contains("watch failed"))
        .count();
    let state = told
        .iter()
        .filter(|line| line.contains("cluster is not healthy"))
        .count();
    assert!(
        watch == 1 && state == 1 && told.len() == 2,
        "{}",
        told.join("\n")
    );
    assert!(
        told.iter().all(|line| line.contains("cluster=refused")),
        "{}",
        told.join("\n")
    );
    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}

/// What the example's members are offered in their TLS handshakes: a relay
/// in front of `upstream` that forwards everything and notes, per
/// connection, whether the ClientHello offered HTTP/2 (ALPN `h2`).
async fn alpn_relay(
    upstream: std::net::SocketAddr,
) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<bool>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let offers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = offers.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let mut hello = vec![0u8; 16 * 1024];
                let Ok(read) = client.read(&mut hello).await else {
                    return;
                };
                // An ALPN protocol name is its length, then its bytes.
                let offered_h2 = hello[..read].windows(3).any(|bytes| bytes == b"\x02h2");
                seen.lock().expect("offers").push(offered_h2);
                if server.write_all(&hello[..read]).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (port, offers)
}

/// `--http1`: every connection to a member offers HTTP/1.1 only, and the
/// example works as with HTTP/2 (a copy made); without it, HTTP/2 is
/// offered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_http1_the_members_are_spoken_to_over_http1_1() {
    let (management, member) = management_and_member().await;
    let upstream: std::net::SocketAddr = member
        .server()
        .trim_start_matches("https://")
        .parse()
        .expect("an address");
    let (port, offers) = alpn_relay(upstream).await;
    let mut relayed = member.kubeconfig().clone();
    if let Some(cluster) = relayed.clusters[0].cluster.as_mut() {
        cluster.server = Some(format!("https://127.0.0.1:{port}"));
    }
    put_secrets(&management, &[("member", &relayed)]).await;
    let mut running = example(&management)
        .args(["--health-address", "127.0.0.1:0", "--http1"])
        .spawn()
        .expect("example");
    wait_for_copy(member.client().await.expect("client"), "over-http1").await;
    let status = terminate(&mut running, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
    let seen = offers.lock().expect("offers").clone();
    assert!(
        !seen.is_empty() && seen.iter().all(|h2| !h2),
        "HTTP/2 offered with --http1: {seen:?}"
    );

    // The same without the flag: HTTP/2 is offered (the relay can tell).
    offers.lock().expect("offers").clear();
    let mut running = example(&management)
        .args(["--health-address", "127.0.0.1:0"])
        .spawn()
        .expect("example");
    wait_for_copy(member.client().await.expect("client"), "over-http2").await;
    let status = terminate(&mut running, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
    let seen = offers.lock().expect("offers").clone();
    assert!(seen.iter().any(|h2| *h2), "HTTP/2 not offered: {seen:?}");
}

/// A CRD of the tests' own, for `--also-watch`.
const WIDGETS: &str = multicluster_envtest::WIDGETS_CRD;

/// `--also-watch`: a member that does not serve the resource is shown
/// `degraded`, naming it, while its ConfigMaps are still copied; once it
/// serves the resource it is `ready`, without being engaged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lacking_a_watched_crd_is_degraded_until_it_serves_it() {
    let (management, member) = management_and_member().await;
    put_secrets(&management, &[("member", member.kubeconfig())]).await;
    let address = free_address();
    let mut running = example(&management)
        .arg("--health-address")
        .arg(address.to_string())
        .args(["--also-watch", "example.com/v1/Widget"])
        .spawn()
        .expect("example");
    let line = clusters_line(address, "member\tdegraded").await;
    assert!(line.contains("widgets"), "{line}");
    wait_for_copy(member.client().await.expect("client"), "without-widgets").await;

    member.install_crds(WIDGETS).await.expect("CRD");
    // The next list of widgets comes within the longest delay after a
    // refusal (30 s and its random part).
    multicluster_runtime::testing::eventually_within(
        Duration::from_secs(90),
        Polled::OtherProcess,
        "the member to be ready once it serves widgets",
        || async {
            multicluster_runtime::testing::http_get(address, "/clusters")
                .await
                .is_ok_and(|(_, body)| body.lines().any(|line| line.starts_with("member\tready")))
        },
    )
    .await;
    let (_, metrics) = multicluster_runtime::testing::http_get(address, "/metrics")
        .await
        .expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|line| line == "mcr_cluster_disengagements_total 0"),
        "the member was engaged again"
    );
    let status = terminate(&mut running, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");
}
