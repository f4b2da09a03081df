//! Kubeconfig files and directories: contexts as clusters, changes picked up
//! from the file system, bad files skipped, unreachable servers harmless.

use multicluster_runtime::provider::clusters::ClusterSetProvider;
use multicluster_runtime::testing::Polled;
use multicluster_runtime::testing::wait_for_fleet;
use multicluster_runtime::testing::wait_for_fleet_async;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kube::config::Kubeconfig;
use multicluster_envtest::{ControlPlane, plugins};
use multicluster_provider_file::{FileContext, FileOptions, FileProvider};
use multicluster_runtime::controller::{Backoff, Request};
use multicluster_runtime::manager::ClusterState;
use multicluster_runtime::provider::member::Members;
use multicluster_runtime::testing::{
    eventually, recording_manager, recording_manager_from, run_manager, wait_until_left,
    wait_until_unreachable,
};
use multicluster_runtime::{Cluster, ClusterName, Manager, ManagerOptions, Provider};

/// `base` with its only context renamed to each of `contexts`.
fn with_contexts(base: &Kubeconfig, contexts: &[&str]) -> String {
    let mut kubeconfig = base.clone();
    let template = kubeconfig.contexts[0].clone();
    kubeconfig.contexts = contexts
        .iter()
        .map(|name| {
            let mut context = template.clone();
            context.name = (*name).to_string();
            context
        })
        .collect();
    kubeconfig.current_context = contexts.first().map(|c| (*c).to_string());
    multicluster_envtest::to_yaml(&kubeconfig).expect("yaml")
}

/// `base` pointing at a port where nothing listens.
fn unreachable(base: &Kubeconfig) -> String {
    let mut kubeconfig = base.clone();
    if let Some(cluster) = kubeconfig.clusters[0].cluster.as_mut() {
        cluster.server = Some("https://127.0.0.1:1".into());
    }
    kubeconfig.contexts[0].name = "down".into();
    kubeconfig.current_context = Some("down".into());
    multicluster_envtest::to_yaml(&kubeconfig).expect("yaml")
}

fn name(path: &Path, context: &str) -> ClusterName {
    ClusterName::from(format!("{}+{context}", path.display()))
}

/// Writes via a temporary file and a rename, as editors and tools do.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_of_watched_files_come_and_go_with_the_files() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_config_map("hello", &[]).await.expect("create");
    let base = cp.kubeconfig().clone();

    let dir = tempfile::tempdir().expect("dir");
    let watched = dir.path().join("watched");
    std::fs::create_dir(&watched).expect("mkdir");
    let explicit = dir.path().join("explicit.yaml");
    write(&explicit, &with_contexts(&base, &["one", "two"]));

    let provider = Arc::new(FileProvider::new(
        FileOptions::default()
            .files(vec![explicit.clone()])
            .directories(vec![watched.clone()]),
    ));
    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);

    // An explicit file with two contexts gives two clusters; the watched
    // directory is empty so far.
    let req = |cluster: &ClusterName| Request::new(cluster.clone(), Some("default"), "hello");
    recorder
        .wait_for_more(&req(&name(&explicit, "one")), 0)
        .await;
    recorder
        .wait_for_more(&req(&name(&explicit, "two")), 0)
        .await;
    assert_eq!(
        provider.names(),
        [name(&explicit, "one"), name(&explicit, "two")]
    );

    // A matching file appearing in the directory adds its contexts (union of
    // sources); files that do not match the patterns, or are broken, are
    // skipped without harming the rest.
    let appeared = watched.join("team.kubeconfig");
    write(
        &watched.join("notes.txt"),
        "not a kubeconfig and not matched",
    );
    write(&watched.join("broken.kubeconfig"), "clusters: [not: {valid");
    write(&appeared, &with_contexts(&base, &["three"]));
    recorder
        .wait_for_more(&req(&name(&appeared, "three")), 0)
        .await;
    assert_eq!(provider.names().len(), 3, "{:?}", provider.names());

    // A context whose server is down is still discovered; the manager
    // reports it unreachable while the others keep working.
    let down = watched.join("down.kubeconfig");
    write(&down, &unreachable(&base));
    wait_until_unreachable(&manager, name(&down, "down").as_str()).await;

    // Rewriting a file swaps its contexts.
    write(&explicit, &with_contexts(&base, &["two", "four"]));
    recorder
        .wait_for_more(&req(&name(&explicit, "four")), 0)
        .await;
    wait_for_fleet(&manager, "context one to be removed", || {
        !provider.names().contains(&name(&explicit, "one"))
    })
    .await;
    assert!(provider.names().contains(&name(&explicit, "two")));

    // Deleting a file removes its clusters.
    std::fs::remove_file(&appeared).expect("remove");
    wait_for_fleet(&manager, "the deleted file's cluster to leave", || {
        !provider.names().contains(&name(&appeared, "three"))
            && !manager
                .cluster_states()
                .iter()
                .any(|(cluster, _)| *cluster == name(&appeared, "three"))
    })
    .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_paths_are_skipped_until_they_appear() {
    let cp = ControlPlane::start().await.expect("control plane");
    let dir = tempfile::tempdir().expect("dir");
    let later = dir.path().join("later.yaml");
    let provider = Arc::new(FileProvider::new(
        FileOptions::default().files(vec![later.clone()]),
    ));
    let manager = Manager::builder(Cluster::new("local", cp.client().await.expect("client")))
        .provider(provider.clone())
        .build();
    let (shutdown, task) = run_manager(&manager);
    manager.started().await;
    write(&later, &with_contexts(cp.kubeconfig(), &["ctx"]));
    wait_for_fleet(&manager, "the file's context", || {
        provider.names() == [name(&later, "ctx")]
    })
    .await;
    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Broken files and contexts are skipped one by one; a good context in the
/// same file as a broken one still works; servers that cannot be reached or
/// trusted are engaged and reported unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_files_and_contexts_affect_only_themselves() {
    let (cp, stranger) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (cp, stranger) = (cp.expect("control plane"), stranger.expect("stranger"));
    let base = cp.kubeconfig().clone();
    let dir = tempfile::tempdir().expect("dir");
    let file = |name: &str| dir.path().join(format!("{name}.kubeconfig"));

    write(&file("not-yaml"), "{{{ not yaml");
    write(
        &file("not-a-kubeconfig"),
        "apiVersion: v1\nkind: ConfigMap\n",
    );
    // One good context and two naming a missing cluster or user.
    let mut mixed = base.clone();
    let mut no_cluster = mixed.contexts[0].clone();
    no_cluster.name = "no-cluster".into();
    if let Some(context) = no_cluster.context.as_mut() {
        context.cluster = "missing".into();
    }
    let mut no_user = mixed.contexts[0].clone();
    no_user.name = "no-user".into();
    if let Some(context) = no_user.context.as_mut() {
        context.user = Some("missing".into());
    }
    mixed.contexts[0].name = "good".into();
    mixed.contexts.extend([no_cluster, no_user]);
    write(
        &file("mixed"),
        &multicluster_envtest::to_yaml(&mixed).expect("yaml"),
    );
    let mut wrong_ca = cp.kubeconfig_trusting(&stranger);
    wrong_ca.contexts[0].name = "wrong-ca".into();
    write(
        &file("wrong-ca"),
        &multicluster_envtest::to_yaml(&wrong_ca).expect("yaml"),
    );

    let provider = Arc::new(FileProvider::new(
        FileOptions::default().directories(vec![dir.path().to_path_buf()]),
    ));
    let options = ManagerOptions::default().sync_timeout(std::time::Duration::from_secs(3));
    let manager = Manager::builder(Cluster::new("local", cp.client().await.expect("client")))
        .provider(provider.clone())
        .options(options)
        .build();
    let (shutdown, task) = run_manager(&manager);

    let wrong_ca_name = name(&file("wrong-ca"), "wrong-ca");
    wait_until_unreachable(&manager, wrong_ca_name.as_str()).await;
    let good = name(&file("mixed"), "good");
    wait_for_fleet(&manager, "the good context to be ready", || {
        manager
            .cluster_states()
            .iter()
            .any(|(cluster, status)| *cluster == good && status.state == ClusterState::Ready)
    })
    .await;
    assert_eq!(
        provider.names(),
        [good, wrong_ca_name],
        "everything else skipped"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A context whose credential plugin fails (no token yet) is tried again
/// without any file event, and engaged once the plugin works; afterwards an
/// unrelated file change runs no plugin for the unchanged context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_plugins_run_again_only_for_failed_or_changed_contexts() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_config_map("hello", &[]).await.expect("object");
    let dir = tempfile::tempdir().expect("dir");
    // Outside the watched directory: the plugin's own writes are no events.
    let state = tempfile::tempdir().expect("state");
    let with_plugin = dir.path().join("plugin.kubeconfig");
    write(
        &with_plugin,
        &multicluster_envtest::to_yaml(&cp.exec_kubeconfig("plugin", plugins::TOKEN, state.path()))
            .expect("yaml"),
    );

    let provider = Arc::new(FileProvider::new(
        FileOptions::default()
            .directories(vec![dir.path().to_path_buf()])
            .retry(Backoff {
                base: Duration::from_millis(100),
                max: Duration::from_secs(1),
            }),
    ));
    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    eventually(
        Polled::OtherProcess,
        "the failing plugin to be tried again",
        || async { plugins::calls(state.path()).len() >= 3 },
    )
    .await;
    assert!(provider.names().is_empty());

    let token = cp
        .cluster_admin_token("robots", "files")
        .await
        .expect("token");
    plugins::set_token(state.path(), &token).expect("token");
    let engaged = name(&with_plugin, "plugin");
    recorder
        .wait_for_more(&Request::new(engaged.as_str(), Some("default"), "hello"), 0)
        .await;
    let calls = plugins::calls(state.path()).len();

    let other = dir.path().join("other.kubeconfig");
    write(&other, &with_contexts(cp.kubeconfig(), &["other"]));
    recorder
        .wait_for_more(
            &Request::new(name(&other, "other").as_str(), Some("default"), "hello"),
            0,
        )
        .await;
    assert_eq!(
        plugins::calls(state.path()).len(),
        calls,
        "the unchanged context's plugin ran again"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// One kubeconfig holding the clusters, contexts and users of `parts`
/// (each named differently).
fn merged(parts: &[Kubeconfig]) -> String {
    let mut all = parts[0].clone();
    for part in &parts[1..] {
        all.clusters.extend(part.clusters.iter().cloned());
        all.contexts.extend(part.contexts.iter().cloned());
        all.auth_infos.extend(part.auth_infos.iter().cloned());
    }
    multicluster_envtest::to_yaml(&all).expect("yaml")
}

/// A kubeconfig named `name` with a fresh cluster-admin token of `cp`.
async fn token_kubeconfig(cp: &ControlPlane, name: &str) -> Kubeconfig {
    let token = cp.cluster_admin_token("robots", name).await.expect("token");
    cp.token_kubeconfig(name, token)
}

fn provider_of(files: &[&Path], dirs: &[&Path]) -> Arc<FileProvider> {
    Arc::new(FileProvider::new(
        FileOptions::default()
            .files(
                files
                    .iter()
                    .map(|path| path.to_path_buf())
                    .collect::<Vec<_>>(),
            )
            .directories(
                dirs.iter()
                    .map(|path| path.to_path_buf())
                    .collect::<Vec<_>>(),
            ),
    ))
}

/// An idle provider reads nothing: not on its own, and not because
/// something else read its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_provider_reads_no_file() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_config_map("hello", &[]).await.expect("object");
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("one.kubeconfig");
    write(&file, &with_contexts(cp.kubeconfig(), &["one"]));
    let provider = provider_of(&[], &[dir.path()]);
    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    recorder
        .wait_for_more(
            &Request::new(name(&file, "one"), Some("default"), "hello"),
            0,
        )
        .await;
    let reads = provider.file_reads();
    assert_eq!(reads, 1, "one file, read once at start");
    // Others reading the file (kubectl, a backup) are no changes.
    for _ in 0..20 {
        std::fs::read_to_string(&file).expect("read");
    }
    // The idle period itself is what is tested: nothing may happen in it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(provider.file_reads(), reads, "re-read while idle");

    // A real change is read once.
    write(&file, &with_contexts(cp.kubeconfig(), &["one", "two"]));
    wait_for_fleet(&manager, "the new context", || {
        provider.names().contains(&name(&file, "two"))
    })
    .await;
    assert_eq!(provider.file_reads(), reads + 1);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Editing one context of a file with several rebuilds only that context:
/// the others keep their cluster instance and their credential plugin does
/// not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_one_context_re_engages_only_that_context() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_config_map("hello", &[]).await.expect("object");
    let state = tempfile::tempdir().expect("state");
    plugins::set_token(
        state.path(),
        &cp.cluster_admin_token("robots", "plugged")
            .await
            .expect("token"),
    )
    .expect("token");
    let plugged = cp.exec_kubeconfig("plugged", plugins::TOKEN, state.path());
    let (steady, edited) = (
        token_kubeconfig(&cp, "steady").await,
        token_kubeconfig(&cp, "edited").await,
    );
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("fleet.kubeconfig");
    write(&file, &merged(&[plugged.clone(), steady.clone(), edited]));
    let provider = provider_of(&[&file], &[]);
    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    for context in ["plugged", "steady", "edited"] {
        recorder
            .wait_for_more(
                &Request::new(name(&file, context), Some("default"), "hello"),
                0,
            )
            .await;
    }
    let instance = |context: &str| {
        let provider = provider.clone();
        let cluster = name(&file, context);
        async move { provider.get(&cluster).await.expect("engaged") }
    };
    let (plugged_before, steady_before, edited_before) = (
        instance("plugged").await,
        instance("steady").await,
        instance("edited").await,
    );
    assert_eq!(plugins::calls(state.path()).len(), 1);

    // A new token for one user; the file's other entries are untouched.
    let rotated = token_kubeconfig(&cp, "edited-2").await;
    let mut edited = rotated.clone();
    edited.clusters[0].name = "edited".into();
    edited.auth_infos[0].name = "edited".into();
    edited.contexts[0].name = "edited".into();
    if let Some(context) = edited.contexts[0].context.as_mut() {
        context.cluster = "edited".into();
        context.user = Some("edited".into());
    }
    write(&file, &merged(&[plugged, steady, edited]));
    wait_for_fleet_async(&manager, "the edited context to be replaced", || async {
        !instance("edited").await.same_instance(&edited_before)
    })
    .await;
    assert!(instance("plugged").await.same_instance(&plugged_before));
    assert!(instance("steady").await.same_instance(&steady_before));
    assert_eq!(plugins::calls(state.path()).len(), 1, "no plugin run");

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A tool that writes a file in two steps — first a context naming a user
/// the file does not have yet, then the user — never makes the cluster
/// leave: it keeps the cluster it had, says why once, and takes the new
/// settings when they are complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_in_two_steps_keeps_its_clusters() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_config_map("hello", &[]).await.expect("object");
    let (first, second) = (
        token_kubeconfig(&cp, "first").await,
        token_kubeconfig(&cp, "second").await,
    );
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("fleet.kubeconfig");
    write(&file, &merged(&[first.clone(), second.clone()]));
    let metrics = multicluster_runtime::metrics::Metrics::default();
    let provider = provider_of(&[&file], &[]);
    let (manager, recorder) = recording_manager_from(
        Manager::builder(Cluster::new("local", cp.client().await.expect("client")))
            .provider(provider.clone())
            .metrics(metrics.clone()),
    );
    let (shutdown, task) = run_manager(&manager);
    for context in ["first", "second"] {
        recorder
            .wait_for_more(
                &Request::new(name(&file, context), Some("default"), "hello"),
                0,
            )
            .await;
    }
    let second_name = name(&file, "second");
    let second_before = provider.get(&second_name).await.expect("engaged");

    // Step one: the context names a user that is not written yet.
    let new_user = token_kubeconfig(&cp, "second-user").await;
    let mut half = second.clone();
    if let Some(context) = half.contexts[0].context.as_mut() {
        context.user = Some("second-user".into());
    }
    write(&file, &merged(&[first.clone(), half.clone()]));
    wait_for_fleet(&manager, "the half-written context to be reported", || {
        provider
            .failures()
            .get(&second_name)
            .is_some_and(|reason| reason.contains("user \"second-user\""))
    })
    .await;
    assert!(
        provider
            .get(&second_name)
            .await
            .expect("still engaged")
            .same_instance(&second_before)
    );

    // Step two: the user arrives.
    let mut complete = half;
    complete.auth_infos = new_user.auth_infos.clone();
    write(&file, &merged(&[first, complete]));
    wait_for_fleet_async(&manager, "the completed context to be engaged", || async {
        provider
            .get(&second_name)
            .await
            .is_ok_and(|cluster| !cluster.same_instance(&second_before))
    })
    .await;
    assert!(provider.failures().is_empty(), "{:?}", provider.failures());
    let disengaged = metrics
        .encode()
        .lines()
        .find(|line| line.starts_with("mcr_cluster_disengagements_total"))
        .map(str::to_string);
    assert_eq!(
        disengaged.as_deref(),
        Some("mcr_cluster_disengagements_total 0"),
        "no cluster left the fleet"
    );

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// A context whose credential plugin never answers holds up only itself:
/// contexts added after it are engaged, a removed one is removed, and
/// stopping the provider stops the plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_whose_plugin_hangs_holds_up_only_itself() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_config_map("hello", &[]).await.expect("object");
    let state = tempfile::tempdir().expect("state");
    plugins::set_token(state.path(), "never-handed-out").expect("token");
    plugins::hold(state.path()).expect("hold");
    let stuck = cp.exec_kubeconfig("stuck", plugins::TOKEN, state.path());
    let before = token_kubeconfig(&cp, "before").await;
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("fleet.kubeconfig");
    write(&file, &merged(&[stuck.clone(), before]));
    let provider = provider_of(&[], &[dir.path()]);
    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    let req =
        |path: &Path, context: &str| Request::new(name(path, context), Some("default"), "hello");
    recorder.wait_for_more(&req(&file, "before"), 0).await;
    let plugin = plugins::first_call_running(state.path()).await;

    let other = dir.path().join("other.kubeconfig");
    write(&other, &with_contexts(cp.kubeconfig(), &["after"]));
    recorder.wait_for_more(&req(&other, "after"), 0).await;
    write(&file, &merged(&[stuck]));
    wait_until_left(&manager, name(&file, "before").as_str()).await;
    assert_eq!(provider.names(), [name(&other, "after")]);
    assert!(plugins::is_running(plugin), "still waiting for its login");
    assert_eq!(plugins::pids(state.path()), [plugin], "run once");

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
    plugins::wait_until_stopped(plugin, "the plugin").await;
}

/// A listed path that is a pipe would block a read forever: it is refused by
/// name, and the files after it are still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_pipe_is_refused_and_the_other_files_are_read() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_config_map("hello", &[]).await.expect("object");
    let dir = tempfile::tempdir().expect("dir");
    // Sorted before the good file, so a blocking read would come first.
    let pipe = dir.path().join("a-pipe.kubeconfig");
    let made = std::process::Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .expect("mkfifo");
    assert!(made.success(), "mkfifo {}", pipe.display());
    let good = dir.path().join("b-good.kubeconfig");
    write(&good, &with_contexts(cp.kubeconfig(), &["good"]));
    let provider = provider_of(&[&pipe, &good], &[]);
    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);

    let request = Request::new(name(&good, "good"), Some("default"), "hello");
    recorder.wait_for_more(&request, 0).await;
    let pipe_key = ClusterName::from(format!("file {}", pipe.display()));
    wait_for_fleet(&manager, "the pipe to be reported", || {
        provider.failures().get(&pipe_key).is_some_and(|reason| {
            reason.contains(&pipe.display().to_string()) && reason.contains("not a regular file")
        })
    })
    .await;
    assert_eq!(provider.names(), [name(&good, "good")]);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// `path` spelled relative to the working directory (`../../target/...`
/// from the package), as a user passes `--file` or `--directory`.
fn relative_to_working_directory(path: &Path) -> std::path::PathBuf {
    let here = std::env::current_dir().expect("working directory");
    let here = std::fs::canonicalize(here).expect("canonical working directory");
    let path = std::fs::canonicalize(path).expect("canonical path");
    let common = here
        .components()
        .zip(path.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut relative = std::path::PathBuf::new();
    for _ in here.components().skip(common) {
        relative.push("..");
    }
    for part in path.components().skip(common) {
        relative.push(part);
    }
    assert!(relative.is_relative(), "{}", relative.display());
    relative
}

/// Sources given as relative paths see every change: a file added to a
/// relative directory, an explicit relative file rewritten, and one renamed
/// away (notify reports absolute paths for relative watches).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_paths_see_every_change() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.create_config_map("hello", &[]).await.expect("object");
    let base = cp.kubeconfig().clone();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let watched = dir.path().join("watched");
    std::fs::create_dir(&watched).expect("mkdir");
    let watched = relative_to_working_directory(&watched);
    let explicit = relative_to_working_directory(dir.path()).join("explicit.yaml");
    write(&explicit, &with_contexts(&base, &["one"]));
    let provider = provider_of(&[&explicit], &[&watched]);
    let (manager, recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    let req =
        |path: &Path, context: &str| Request::new(name(path, context), Some("default"), "hello");
    recorder.wait_for_more(&req(&explicit, "one"), 0).await;

    let added = watched.join("team.kubeconfig");
    write(&added, &with_contexts(&base, &["two"]));
    recorder.wait_for_more(&req(&added, "two"), 0).await;

    write(&explicit, &with_contexts(&base, &["three"]));
    recorder.wait_for_more(&req(&explicit, "three"), 0).await;
    wait_until_left(&manager, name(&explicit, "one").as_str()).await;

    std::fs::rename(&added, watched.join("team.disabled")).expect("rename");
    wait_until_left(&manager, name(&added, "two").as_str()).await;
    assert_eq!(provider.names(), [name(&explicit, "three")]);

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// Each context's member is built with the options the provider is given,
/// chosen per member from its file and context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_options_are_chosen_per_file_and_context() {
    let cp = ControlPlane::start().await.expect("control plane");
    let base = cp.kubeconfig().clone();
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("fleet.kubeconfig");
    write(&file, &with_contexts(&base, &["team-a", "team-b"]));

    let members = Members::default().per_member(|source: &FileContext, options| {
        // Named after the file and the context, so that a member built
        // from another source than its own would show it.
        let file = source
            .file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let namespace = format!("{}-{}", source.context, file.len());
        let cache = options.cache.clone().namespace(namespace);
        options.cache(cache)
    });
    let provider = Arc::new(FileProvider::new(
        FileOptions::default()
            .files(vec![file.clone()])
            .members(members),
    ));
    let (manager, _recorder) = recording_manager(
        Cluster::new("local", cp.client().await.expect("client")),
        provider.clone(),
        ManagerOptions::default(),
    );
    let (shutdown, task) = run_manager(&manager);
    let namespace_of = |context: &str| {
        let provider = provider.clone();
        let cluster = name(&file, context);
        async move {
            let cluster = provider.get(&cluster).await.ok()?;
            cluster.cache().options()?.namespace.clone()
        }
    };
    let suffix = "fleet.kubeconfig".len();
    wait_for_fleet_async(
        &manager,
        "both members built with their own options",
        || async {
            namespace_of("team-a").await == Some(format!("team-a-{suffix}"))
                && namespace_of("team-b").await == Some(format!("team-b-{suffix}"))
        },
    )
    .await;

    shutdown.cancel();
    task.await.expect("task").expect("clean stop");
}

/// The provider says its inventory is engaged (what a sharded replica
/// waits for before it joins its peers) once every context of the first
/// read was looked at, and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_is_engaged_once_every_context_read_first_was_looked_at() {
    let cp = ControlPlane::start().await.expect("control plane");
    let dir = tempfile::tempdir().expect("dir");
    let contexts: Vec<String> = (0..30).map(|i| format!("c{i}")).collect();
    let fleet = dir.path().join("fleet.kubeconfig");
    let refs: Vec<&str> = contexts.iter().map(String::as_str).collect();
    write(&fleet, &with_contexts(cp.kubeconfig(), &refs));
    let provider = provider_of(&[], &[dir.path()]);
    let (engaged, started) =
        multicluster_runtime::testing::engaged_when_inventory_is(provider).await;
    let mut expected: Vec<ClusterName> = contexts.iter().map(|c| name(&fleet, c)).collect();
    expected.sort();
    assert_eq!(engaged, expected, "said before every context was looked at");
    started.stop().await.expect("clean stop");
}
