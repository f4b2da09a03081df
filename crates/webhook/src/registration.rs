//! Keeps the webhooks registered in every engaged member: one
//! `ValidatingWebhookConfiguration` and one `MutatingWebhookConfiguration`
//! per member (for the server's validating and mutating webhooks), each
//! webhook pointing at that member's path with the CA bundle, written
//! again when the CA file changes, deleted when the member leaves.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{WebhookKind, WebhookServer, path};
use crate::lock;
use multicluster_runtime::Aware;
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::Error;
use multicluster_runtime::Manager;
use multicluster_runtime::engagements::{Engagements, when_ended};

/// How the webhooks are registered in each member.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RegistrationOptions {
    /// The server as the members' API servers reach it, e.g.
    /// `https://webhooks.example.com:9443` (no path): each webhook's URL is
    /// this followed by its path ([`super::path`]).
    pub url: String,
    /// The PEM CA bundle that signed the serving certificate (cert-manager's
    /// `ca.crt`), followed (its directory is watched, so a mounted Secret's
    /// update is seen at once) until the manager stops, and written to
    /// every member when it changed.
    pub ca_file: PathBuf,
    /// How often the CA file is looked at besides (default 10 s): the
    /// fallback where its directory cannot be watched.
    pub ca_check: Duration,
    /// The configurations' name in each member (default
    /// `multicluster-runtime-webhooks`); two instances with disjoint watch
    /// filters sharing members register under different names.
    pub configuration_name: String,
    /// The suffix of each webhook's name in the configuration
    /// (`<webhook>.<domain>`; the API server wants three segments at
    /// least). Default `webhooks.multicluster-runtime.io`.
    pub domain: String,
    /// `Fail` (default) or `Ignore`: what the API server does when the
    /// server does not answer (or answers an error: see [`super`]).
    pub failure_policy: String,
    /// The API server's deadline for an answer, 1 to 30 s (default 10).
    pub timeout_seconds: i32,
    /// The operations sent (default `CREATE` and `UPDATE`).
    pub operations: Vec<String>,
    /// Only objects whose labels match (default: all).
    pub object_selector: Option<LabelSelector>,
    /// Namespaces whose requests are never sent (default `kube-system`):
    /// with `Fail`, an unreachable server would otherwise block every
    /// write there too, the cluster's own components' included, in every
    /// member at once. Add the webhook's own namespace when it runs in a
    /// member. Matched by the `kubernetes.io/metadata.name` label.
    pub exempt_namespaces: Vec<String>,
    /// Delete the configurations from every member when the process stops
    /// (default false: a restarting or upgrading server keeps its
    /// registrations, and its members' writes keep being checked). Await
    /// [`Registration::stopped`] before exiting.
    pub remove_on_shutdown: bool,
    /// Register in the local cluster too, at its path (default false: the
    /// local cluster's configuration usually ships with the deployment).
    pub include_local: bool,
}

impl RegistrationOptions {
    /// Options for a server reached at `url` whose certificate `ca_file`
    /// signed.
    pub fn new(url: impl Into<String>, ca_file: impl Into<PathBuf>) -> Self {
        Self {
            url: url.into(),
            ca_file: ca_file.into(),
            ca_check: Duration::from_secs(10),
            configuration_name: "multicluster-runtime-webhooks".to_string(),
            domain: "webhooks.multicluster-runtime.io".to_string(),
            failure_policy: "Fail".to_string(),
            timeout_seconds: 10,
            operations: vec!["CREATE".to_string(), "UPDATE".to_string()],
            object_selector: None,
            exempt_namespaces: vec!["kube-system".to_string()],
            remove_on_shutdown: false,
            include_local: false,
        }
    }
}

/// The registration component; add it to the manager with
/// [`Manager::add`](multicluster_runtime::Manager::add). Registers in members, and in the
/// local cluster with [`RegistrationOptions::include_local`].
#[derive(Clone)]
pub struct Registration {
    inner: Arc<Inner>,
}

struct Inner {
    server: WebhookServer,
    options: RegistrationOptions,
    /// The manager's "stopping" signal, not the manager itself: the
    /// manager holds this component, so holding it back would be a cycle
    /// that keeps both alive.
    stopping: CancellationToken,
    clusters: Mutex<Engagements<()>>,
    /// The CA bundle, followed by one task for every member.
    ca: Mutex<Option<watch::Receiver<Vec<u8>>>>,
    /// The members' tasks, for [`Registration::stopped`].
    tasks: tokio_util::task::TaskTracker,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// How long one write or deletion in a member may take.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

impl Registration {
    /// Registers `server`'s webhooks in the members `manager` engages.
    /// The CA file is read now: an error names it.
    pub fn new(
        manager: &Manager,
        server: &WebhookServer,
        options: RegistrationOptions,
    ) -> Result<Self, Error> {
        read_ca(&options.ca_file)?;
        Ok(Self {
            inner: Arc::new(Inner {
                server: server.clone(),
                options,
                stopping: manager.stopping_signal(),
                clusters: Mutex::default(),
                ca: Mutex::default(),
                tasks: tokio_util::task::TaskTracker::new(),
            }),
        })
    }

    /// Completes once the work for every member whose lifetime has ended
    /// is done: after [`Manager::run`](multicluster_runtime::Manager::run) returns, await
    /// it so that `remove_on_shutdown` deletions (each bounded by a 10 s
    /// deadline) finish before the process exits.
    pub async fn stopped(&self) {
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// The CA bundle as it is now, following the file from the first call
    /// on (one task for the whole fleet).
    fn ca(&self) -> watch::Receiver<Vec<u8>> {
        let mut ca = lock(&self.inner.ca);
        if let Some(receiver) = ca.as_ref() {
            return receiver.clone();
        }
        let file = self.inner.options.ca_file.clone();
        let every = self.inner.options.ca_check;
        let (sender, receiver) = watch::channel(read_ca(&file).unwrap_or_default());
        tokio::spawn(follow_ca(file, every, sender, self.inner.stopping.clone()));
        *ca = Some(receiver.clone());
        receiver
    }

    /// Follows one member: registers, registers again when the CA bundle
    /// changes, and removes the registration when the member leaves.
    async fn follow(
        self,
        name: ClusterName,
        cluster: Cluster,
        lifetime: CancellationToken,
        generation: u64,
    ) {
        let mut ca = self.ca();
        let mut backoff = Duration::from_millis(500);
        loop {
            let bundle = ca.borrow_and_update().clone();
            match self.register(&name, &cluster, &bundle).await {
                Ok(()) => {
                    backoff = Duration::from_millis(500);
                    tokio::select! {
                        () = lifetime.cancelled() => break,
                        changed = ca.changed() => if changed.is_err() { break },
                    }
                }
                Err(err) => {
                    tracing::warn!(cluster = %name, error = %err, "webhooks could not be registered in the member; trying again in {backoff:?}");
                    tokio::select! {
                        () = lifetime.cancelled() => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
        // The member left, was replaced by a new instance of itself (which
        // registers on its own: nothing to remove), or the process stops.
        let replaced = lock(&self.inner.clusters)
            .live(&name)
            .is_some_and(|held| held.generation != generation);
        let keep = self.inner.stopping.is_cancelled() && !self.inner.options.remove_on_shutdown;
        if replaced || keep {
            return;
        }
        if let Err(err) = self.unregister(&name, &cluster).await {
            tracing::warn!(cluster = %name, error = %err, "webhook registration could not be removed from the member");
        } else {
            tracing::info!(cluster = %name, "webhook registration removed from the member");
        }
    }

    /// Long on purpose: the registration object, built field by field from the
    /// webhooks, then one write with a deadline.
    async fn register(
        &self,
        name: &ClusterName,
        cluster: &Cluster,
        ca: &[u8],
    ) -> Result<(), Error> {
        let options = &self.inner.options;
        let meta = ObjectMeta {
            name: Some(options.configuration_name.clone()),
            ..ObjectMeta::default()
        };
        let namespace_selector = namespace_selector(
            cluster
                .cache()
                .options()
                .and_then(|cache| cache.namespace.clone()),
            &options.exempt_namespaces,
        );
        let mut validating = Vec::new();
        let mut mutating = Vec::new();
        for webhook in self.inner.server.webhooks() {
            let resource = webhook.resource();
            let rule = RuleWithOperations {
                api_groups: Some(vec![resource.group.clone()]),
                api_versions: Some(vec![resource.version.clone()]),
                resources: Some(vec![resource.plural.clone()]),
                operations: Some(options.operations.clone()),
                scope: Some("*".to_string()),
            };
            let client_config = WebhookClientConfig {
                url: Some(format!(
                    "{}{}",
                    options.url.trim_end_matches('/'),
                    path(webhook.name(), name)
                )),
                ca_bundle: Some(ByteString(ca.to_vec())),
                service: None::<ServiceReference>,
            };
            let webhook_name = format!("{}.{}", webhook.name(), options.domain);
            match webhook.kind() {
                WebhookKind::Validating => validating.push(ValidatingWebhook {
                    name: webhook_name,
                    client_config,
                    rules: Some(vec![rule]),
                    failure_policy: Some(options.failure_policy.clone()),
                    side_effects: "None".to_string(),
                    admission_review_versions: vec!["v1".to_string()],
                    timeout_seconds: Some(options.timeout_seconds),
                    namespace_selector: namespace_selector.clone(),
                    object_selector: options.object_selector.clone(),
                    match_policy: Some("Equivalent".to_string()),
                    ..ValidatingWebhook::default()
                }),
                WebhookKind::Mutating => mutating.push(MutatingWebhook {
                    name: webhook_name,
                    client_config,
                    rules: Some(vec![rule]),
                    failure_policy: Some(options.failure_policy.clone()),
                    side_effects: "None".to_string(),
                    admission_review_versions: vec!["v1".to_string()],
                    timeout_seconds: Some(options.timeout_seconds),
                    namespace_selector: namespace_selector.clone(),
                    object_selector: options.object_selector.clone(),
                    match_policy: Some("Equivalent".to_string()),
                    reinvocation_policy: Some("IfNeeded".to_string()),
                    ..MutatingWebhook::default()
                }),
            }
        }
        let client = cluster.client();
        let write = async {
            if !validating.is_empty() {
                let configuration = ValidatingWebhookConfiguration {
                    metadata: meta.clone(),
                    webhooks: Some(validating),
                };
                apply(&client, &configuration).await?;
            }
            if !mutating.is_empty() {
                let configuration = MutatingWebhookConfiguration {
                    metadata: meta.clone(),
                    webhooks: Some(mutating),
                };
                apply(&client, &configuration).await?;
            }
            Ok::<_, (String, kube::Error)>(())
        };
        match tokio::time::timeout(WRITE_DEADLINE, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err((what, err))) => Err(Error::Webhook {
                what: format!("{what} in {name}"),
                reason: multicluster_runtime::redact::Redacted::kube(&err).to_string(),
                source: Some(Box::new(err)),
            }),
            Err(_) => Err(Error::Webhook {
                what: format!("configurations {} in {name}", options.configuration_name),
                reason: format!("not written within {WRITE_DEADLINE:?}"),
                source: None,
            }),
        }
    }

    async fn unregister(&self, cluster_name: &ClusterName, cluster: &Cluster) -> Result<(), Error> {
        let name = &self.inner.options.configuration_name;
        let client = cluster.client();
        let remove = async {
            fn gone<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
                match result {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                    Err(err) => Err(err),
                }
            }
            gone(
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .delete(name, &DeleteParams::default())
                    .await,
            )?;
            gone(
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .delete(name, &DeleteParams::default())
                    .await,
            )
        };
        let what = || format!("configurations {name} in {cluster_name}");
        match tokio::time::timeout(WRITE_DEADLINE, remove).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(Error::Webhook {
                what: what(),
                reason: format!(
                    "not deleted: {}",
                    multicluster_runtime::redact::Redacted::kube(&err)
                ),
                source: Some(Box::new(err)),
            }),
            Err(_) => Err(Error::Webhook {
                what: what(),
                reason: format!("not deleted within {WRITE_DEADLINE:?}"),
                source: None,
            }),
        }
    }
}

/// Server-side applies a cluster-scoped `configuration`; an error names
/// its kind and name.
async fn apply<K>(client: &kube::Client, configuration: &K) -> Result<(), (String, kube::Error)>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let name = configuration.meta().name.clone().unwrap_or_default();
    Api::<K>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply("multicluster-runtime-webhooks").force(),
            &Patch::Apply(configuration),
        )
        .await
        .map(|_| ())
        .map_err(|err| (format!("{} {name}", K::kind(&())), err))
}

/// Follows the CA file into `sender` until the manager stops or nobody
/// listens: re-read when anything changes in its directory (a mounted
/// Secret is updated by swapping a symbolic link there, which a watch of
/// the file itself would miss), and every `every` besides, in case the
/// directory cannot be watched. Reads do not block the runtime.
async fn follow_ca(
    file: PathBuf,
    every: Duration,
    sender: watch::Sender<Vec<u8>>,
    stopping: CancellationToken,
) {
    let (wake, mut woken) = tokio::sync::mpsc::channel::<()>(1);
    // Kept for as long as the file is followed; dropping it ends the watch.
    let _watcher = watch_directory_of(&file, wake);
    // False once the watch is gone (it could not be set up): the file is
    // then looked at every `every` only.
    let mut watching = true;
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            () = sender.closed() => return,
            woken_up = woken.recv(), if watching => {
                if woken_up.is_none() {
                    watching = false;
                    continue;
                }
            }
            () = tokio::time::sleep(every) => {}
        }
        let read = tokio::fs::read(&file).await;
        match read
            .map_err(|err| ca_unreadable(&file, err))
            .and_then(|bundle| check_ca(&file, bundle))
        {
            Ok(bundle) => {
                sender.send_if_modified(|now| {
                    let changed = *now != bundle;
                    if changed {
                        tracing::info!(file = %file.display(), "webhook CA bundle changed; registering it in every member");
                        *now = bundle;
                    }
                    changed
                });
            }
            Err(err) => {
                tracing::warn!(error = %err, "webhook CA bundle unreadable; the members keep the previous one")
            }
        }
    }
}

/// A watch of `file`'s directory that wakes `wake` on every event, or
/// `None` (logged) when it cannot be set up.
fn watch_directory_of(
    file: &std::path::Path,
    wake: tokio::sync::mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let directory = file
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let watched = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
        // Full means a wake-up is pending already.
        let _ = wake.try_send(());
    })
    .and_then(|mut watcher| {
        watcher.watch(directory, notify::RecursiveMode::NonRecursive)?;
        Ok(watcher)
    });
    match watched {
        Ok(watcher) => Some(watcher),
        Err(err) => {
            tracing::warn!(directory = %directory.display(), error = %err, "cannot watch the webhook CA file's directory; looking at the file every ca_check only");
            None
        }
    }
}

fn ca_unreadable(file: &std::path::Path, err: std::io::Error) -> Error {
    Error::Webhook {
        what: format!("CA bundle {}", file.display()),
        reason: format!("cannot be read: {err}"),
        source: Some(Box::new(err)),
    }
}

fn read_ca(file: &std::path::Path) -> Result<Vec<u8>, Error> {
    let bundle = std::fs::read(file).map_err(|err| ca_unreadable(file, err))?;
    check_ca(file, bundle)
}

/// `bundle` if it holds a PEM certificate.
fn check_ca(file: &std::path::Path, bundle: Vec<u8>) -> Result<Vec<u8>, Error> {
    let what = || format!("CA bundle {}", file.display());
    if !String::from_utf8_lossy(&bundle).contains("-----BEGIN CERTIFICATE-----") {
        return Err(Error::Webhook {
            what: what(),
            reason: "holds no PEM certificate".to_string(),
            source: None,
        });
    }
    Ok(bundle)
}

impl Aware for Registration {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
    ) -> Result<(), Error> {
        if name.is_local() && !self.inner.options.include_local {
            return Ok(());
        }
        let engaged = lock(&self.inner.clusters).insert_new(&name, &cluster, &lifetime, ());
        let Some((stop, generation)) = engaged else {
            return Ok(());
        };
        self.inner.tasks.spawn(self.clone().follow(
            name.clone(),
            cluster,
            stop.clone(),
            generation,
        ));
        let this = self.clone();
        when_ended(&stop, move || {
            lock(&this.inner.clusters).end(&name, generation);
        });
        Ok(())
    }
}

/// The namespaces a member's webhooks are sent requests from: the one
/// its cache is restricted to, if any, and none of `exempt`.
fn namespace_selector(only: Option<String>, exempt: &[String]) -> Option<LabelSelector> {
    let requirement = |operator: &str, values: Vec<String>| LabelSelectorRequirement {
        key: "kubernetes.io/metadata.name".to_string(),
        operator: operator.to_string(),
        values: Some(values),
    };
    let mut requirements = Vec::new();
    if let Some(namespace) = only {
        requirements.push(requirement("In", vec![namespace]));
    }
    if !exempt.is_empty() {
        requirements.push(requirement("NotIn", exempt.to_vec()));
    }
    (!requirements.is_empty()).then(|| LabelSelector {
        match_expressions: Some(requirements),
        ..LabelSelector::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WebhookServerOptions;

    #[test]
    fn an_unreadable_ca_file_is_named_and_its_cause_kept() {
        let err = read_ca(std::path::Path::new("/nonexistent/ca.crt")).expect_err("no file");
        assert!(err.to_string().contains("/nonexistent/ca.crt"), "{err}");
        let io = std::error::Error::source(&err)
            .and_then(|cause| cause.downcast_ref::<std::io::Error>())
            .expect("the read error is the source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }

    /// The manager holds its components; a registration holding the
    /// manager back kept both alive once the caller let go of them.
    #[tokio::test]
    async fn a_registration_does_not_keep_its_manager_alive() {
        let dir = tempfile::tempdir().expect("dir");
        let files = multicluster_envtest::ServingFiles::generate(dir.path()).expect("files");
        let server = WebhookServer::new(
            WebhookServerOptions::default().certificate(&files.cert, &files.key),
        )
        .expect("server");
        let manager = Manager::builder(Cluster::new(
            "local",
            kube::Client::try_from(kube::Config::new(http::Uri::from_static(
                "https://127.0.0.1:1",
            )))
            .expect("client"),
        ))
        .build();
        let registration = Registration::new(
            &manager,
            &server,
            RegistrationOptions::new("https://127.0.0.1:9443", &files.ca),
        )
        .expect("registration");
        manager.add(Arc::new(registration)).expect("added");
        assert_eq!(
            manager.handles(),
            1,
            "only the caller holds the manager; dropping it frees it"
        );
    }
}
