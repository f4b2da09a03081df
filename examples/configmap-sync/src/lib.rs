//! The controller the examples share: in every cluster, a ConfigMap labelled
//! `multicluster.example/sync=true` is copied into `<name>-copy`, which it
//! owns; the copy follows every change and is deleted with its source.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use multicluster_coordinator::leader_election::{LeaderElection, LeaderElectionOptions};
use multicluster_provider_kubeconfig::{KubeconfigOptions, KubeconfigProvider};
use multicluster_runtime::client::{
    AllowedPlugin, Allowlist, ExecPolicy, KubeconfigPolicy, Servers,
};
use multicluster_runtime::controller::{Action, Controller, Filter, Request, Watch, filters};
use multicluster_runtime::telemetry::OtlpTraces;
use multicluster_runtime::{Cluster, Error};
use std::sync::Arc;
use std::time::Duration;

/// The label that marks a ConfigMap to copy.
pub const SYNC_LABEL: &str = "multicluster.example/sync";

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Reading the cache failed.
    #[error("reading {0} from the cache: {1}")]
    Cache(Request, #[source] Error),
    /// Writing the copy failed.
    #[error("writing the copy of {0}: {1}")]
    Write(Request, #[source] kube::Error),
}

/// Runs `controller` on `manager` until SIGTERM or Ctrl-C.
pub async fn serve(
    manager: multicluster_runtime::Manager,
    controller: Controller,
) -> Result<(), Error> {
    manager.add_controller(controller)?;
    tracing::info!("running; Ctrl-C stops");
    manager.run_until_signal().await?;
    tracing::info!("stopped");
    Ok(())
}

/// Which namespaces become clusters, for the examples over a host's
/// namespaces (`#[command(flatten)]`): by default every one but those
/// Kubernetes keeps for itself, so the example needs no right to write
/// there.
#[derive(clap::Args, Debug)]
pub struct NamespaceArgs {
    /// Namespaces that never become clusters (repeatable; by default the system namespaces).
    #[arg(long = "exclude-namespace", value_name = "NAME", default_values_t = multicluster_provider_namespace::SYSTEM_NAMESPACES.map(String::from))]
    pub exclude: Vec<String>,
    /// Only namespaces with this label become clusters (KEY=VALUE, repeatable: all must hold).
    #[arg(long = "namespace-label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
}

impl NamespaceArgs {
    /// The namespace selector the flags ask for.
    pub fn selector(&self) -> Result<kube::core::Selector, MainError> {
        let mut selector = multicluster_provider_namespace::without_namespaces(&self.exclude);
        for label in &self.labels {
            let Some((key, value)) = label.split_once('=').filter(|(key, _)| !key.is_empty())
            else {
                return Err(format!("--namespace-label {label:?} is not KEY=VALUE").into());
            };
            selector.extend([kube::core::Expression::Equal(
                key.to_string(),
                value.to_string(),
            )]);
        }
        Ok(selector)
    }
}

/// The manager flags every example has (`#[command(flatten)]`).
#[derive(clap::Args, Debug)]
pub struct ManagerArgs {
    /// Serve /healthz, /readyz, /metrics and /clusters here.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub health_address: std::net::SocketAddr,
    /// How long running reconciles may take to finish after SIGTERM.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub shutdown_grace: std::time::Duration,
    /// Run as one of several replicas: the one holding the leader Lease
    /// works, the others stand by with warm caches.
    #[arg(long)]
    pub leader_elect: bool,
    /// The leader Lease's name (default: the program's name).
    #[arg(long)]
    pub leader_election_id: Option<String>,
    /// The leader Lease's namespace, in the local cluster.
    #[arg(long, default_value = "kube-system")]
    pub leader_election_namespace: String,
    /// This replica's identity in the Lease (default: host name and process).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
    /// How long the leader Lease holds after its last renewal.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub leader_election_lease_duration: Duration,
    /// How long the leader may fail to renew before it stops working.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub leader_election_renew_deadline: Duration,
    /// How often the leader renews and a standby tries to take over.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub leader_election_retry_period: Duration,
}

impl ManagerArgs {
    /// The manager's options with these flags.
    pub fn options(&self) -> multicluster_runtime::ManagerOptions {
        multicluster_runtime::ManagerOptions::default()
            .health_address(Some(self.health_address))
            .shutdown_grace(self.shutdown_grace)
    }

    /// A manager builder for `local` with these flags: the options, and
    /// leader election when `--leader-elect` is given; with it, this
    /// replica's identity.
    pub fn builder(
        &self,
        local: Cluster,
    ) -> Result<(multicluster_runtime::ManagerBuilder, Option<String>), Error> {
        let election = self.leader_election(&local)?;
        let builder = multicluster_runtime::Manager::builder(local).options(self.options());
        Ok(match election {
            Some(election) => {
                let identity = election.identity().to_string();
                (builder.coordinator(Arc::new(election)), Some(identity))
            }
            None => (builder, None),
        })
    }

    /// The leader election these flags ask for, keeping its Lease in the
    /// `local` cluster; `None` without `--leader-elect`.
    pub fn leader_election(&self, local: &Cluster) -> Result<Option<LeaderElection>, Error> {
        if !self.leader_elect {
            return Ok(None);
        }
        let options = match &self.leader_election_id {
            Some(name) => LeaderElectionOptions::new(name.clone()),
            None => LeaderElectionOptions::for_program(),
        };
        let options = options
            .namespace(self.leader_election_namespace.clone())
            .identity(self.leader_election_identity.clone())
            .lease_duration(self.leader_election_lease_duration)
            .renew_deadline(self.leader_election_renew_deadline)
            .retry_period(self.leader_election_retry_period);
        LeaderElection::new(local.client(), options).map(Some)
    }
}

/// The flags of the examples whose members are the kubeconfig Secrets on
/// their hub (`#[command(flatten)]`).
#[derive(clap::Args, Debug)]
pub struct SecretFleetArgs {
    /// Namespace of the members' kubeconfig Secrets on the hub; every namespace when unset.
    #[arg(long, env = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The manager's flags.
    #[command(flatten)]
    pub manager: ManagerArgs,
    /// How members are reached.
    #[command(flatten)]
    pub client: ClientArgs,
    /// What the members' kubeconfigs may do.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

impl SecretFleetArgs {
    /// A manager on `hub` whose members are the kubeconfig Secrets there,
    /// by these flags (with leader election under `--leader-elect`).
    pub fn manager(&self, hub: Cluster) -> Result<multicluster_runtime::Manager, MainError> {
        Ok(self.builder(hub)?.build())
    }

    /// The builder of [`SecretFleetArgs::manager`], for an example that
    /// adds to it (a coordinator of its own).
    pub fn builder(&self, hub: Cluster) -> Result<multicluster_runtime::ManagerBuilder, MainError> {
        let provider = Arc::new(KubeconfigProvider::new(
            hub.client(),
            KubeconfigOptions::default()
                .namespace(self.namespace.clone())
                .members(self.client.options())
                .kubeconfig_policy(self.policy.policy()?),
        ));
        let (builder, _identity) = self.manager.builder(hub)?;
        Ok(builder.provider(provider))
    }
}

/// How the examples that build clients from kubeconfigs reach their
/// clusters (`#[command(flatten)]`).
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// How long a request to a cluster (other than a watch) may wait for
    /// its answer; "0s" waits forever.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub request_timeout: std::time::Duration,
    /// How long an exec credential plugin may run.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub plugin_timeout: std::time::Duration,
    /// Speak HTTP/1.1 to the members rather than offer HTTP/2 (for a proxy
    /// or gateway in between that cannot carry it): a connection per open
    /// watch, and no pings, so the manager probes each member every 30 s
    /// to find a silent partition as soon.
    #[arg(long)]
    pub http1: bool,
}

impl ClientArgs {
    /// The client options with these flags.
    pub fn options(&self) -> multicluster_runtime::client::ClientOptions {
        multicluster_runtime::client::ClientOptions::default()
            .request_timeout(Some(self.request_timeout).filter(|timeout| !timeout.is_zero()))
            .plugin_timeout(self.plugin_timeout)
            .http2(!self.http1)
    }
}

/// What kubeconfigs read from the management cluster (Secrets,
/// ClusterProfiles) may use, for the examples that read them
/// (`#[command(flatten)]`). Without these flags: nothing beyond a server,
/// inline CA data and inline credentials; a kubeconfig that names more is
/// refused and listed on `/clusters` with the field and the flag that
/// would allow it (the flag of `KubeconfigPolicy::<field>` below).
#[derive(clap::Args, Debug, Default)]
pub struct PolicyArgs {
    /// Let kubeconfigs run this exec credential plugin (KubeconfigPolicy::exec):
    /// an absolute path, repeated for several; a kubeconfig naming the bare
    /// command runs it from the PATH entry that is listed. Kubeconfigs pick
    /// its arguments: list plugins that only hand out credentials
    /// (aws-iam-authenticator, gke-gcloud-auth-plugin, kubelogin), never a
    /// shell or a general CLI.
    #[arg(long, value_name = "PATH")]
    pub allow_exec_plugin: Vec<std::path::PathBuf>,
    /// A variable kubeconfigs may set for the allowed exec plugins
    /// (AllowedPlugin::env), repeated for several; any other they set is
    /// refused (HTTPS_PROXY, SSL_CERT_FILE, AWS_CONFIG_FILE, ... would steer
    /// the plugin).
    #[arg(long, value_name = "NAME", requires = "allow_exec_plugin")]
    pub allow_exec_env: Vec<String>,
    /// A server the allowed exec plugins' credentials may be sent to
    /// (AllowedPlugin::servers): a host (api.example.com, api.example.com:6443), *.domain,
    /// or an IP network (10.0.0.0/8), repeated for several. Without it a
    /// kubeconfig chooses the server, so whoever writes one can have the
    /// plugin's credential sent to a server of theirs.
    #[arg(long, value_name = "PATTERN", requires = "allow_exec_plugin")]
    pub exec_plugin_server: Vec<String>,
    /// Let kubeconfigs run any command as this controller
    /// (KubeconfigPolicy::exec): only where everyone who may write them may.
    #[arg(long, conflicts_with = "allow_exec_plugin")]
    pub allow_any_exec_plugin: bool,
    /// Let kubeconfigs name files of this controller (tokenFile,
    /// certificate-authority, client-certificate, client-key), which it then
    /// reads and, for a token, sends to the server they name
    /// (KubeconfigPolicy::local_files).
    #[arg(long)]
    pub allow_kubeconfig_files: bool,
    /// Let kubeconfigs use an auth provider (KubeconfigPolicy::auth_providers).
    #[arg(long)]
    pub allow_auth_provider: bool,
    /// Let kubeconfigs turn off verifying their server's certificate
    /// (KubeconfigPolicy::insecure_skip_tls_verify).
    #[arg(long)]
    pub allow_insecure_skip_tls_verify: bool,
    /// Let kubeconfigs pick the proxy their server is reached through
    /// (KubeconfigPolicy::proxy_url); HTTPS_PROXY and NO_PROXY apply either
    /// way.
    #[arg(long)]
    pub allow_proxy_url: bool,
    /// Let kubeconfigs name a plain http:// server, their credentials then
    /// sent in the clear (KubeconfigPolicy::plain_http).
    #[arg(long)]
    pub allow_plain_http: bool,
}

impl PolicyArgs {
    /// The policy these flags ask for.
    pub fn policy(&self) -> Result<KubeconfigPolicy, Error> {
        let exec = if self.allow_any_exec_plugin {
            ExecPolicy::AllowAll
        } else if self.allow_exec_plugin.is_empty() {
            ExecPolicy::DenyAll
        } else {
            let servers = (!self.exec_plugin_server.is_empty())
                .then(|| Servers::from_patterns(&self.exec_plugin_server))
                .transpose()?;
            let plugins = self
                .allow_exec_plugin
                .iter()
                .map(|command| {
                    let plugin = AllowedPlugin::new(command.clone())?
                        .env(self.allow_exec_env.iter().cloned())?;
                    Ok(match &servers {
                        Some(servers) => plugin.servers(servers.clone()),
                        None => plugin,
                    })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            ExecPolicy::Allowlist(Allowlist::of(plugins)?)
        };
        Ok(KubeconfigPolicy::untrusted()
            .exec(exec)
            .local_files(self.allow_kubeconfig_files)
            .auth_providers(self.allow_auth_provider)
            .insecure_skip_tls_verify(self.allow_insecure_skip_tls_verify)
            .proxy_url(self.allow_proxy_url)
            .plain_http(self.allow_plain_http))
    }
}

/// Where an example's traces go.
#[derive(clap::Args, Debug, Default)]
pub struct TraceArgs {
    /// Export traces over OTLP/HTTP to this endpoint (its base URL, such
    /// as `http://otel-collector.monitoring:4318`): a span per reconcile
    /// (controller, cluster, request), and in propagations per hub step
    /// and member apply, a member's beneath the hub reconcile that gave it
    /// its slot.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

/// Logs to stderr (`RUST_LOG` overrides the default,
/// [`multicluster_runtime::LOG_FILTER`]) and, with `--otlp-endpoint`,
/// exports traces as `service` (the spans the default lets through,
/// whatever `RUST_LOG` says: asking for fewer logs keeps the traces). Keep what it
/// returns until `main` ends: dropping it sends the last spans.
pub fn init_logging(traces: &TraceArgs, service: &str) -> Result<Option<OtlpTraces>, MainError> {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours for a terminal only, not in a log file or collector.
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| multicluster_runtime::LOG_FILTER.into()),
        );
    let exported = traces
        .otlp_endpoint
        .as_deref()
        .map(|endpoint| OtlpTraces::start(endpoint, service))
        .transpose()?;
    tracing_subscriber::registry()
        .with(logs)
        .with(exported.as_ref().map(|exported| {
            exported
                .layer()
                .with_filter(tracing_subscriber::EnvFilter::new(
                    multicluster_runtime::LOG_FILTER,
                ))
        }))
        .init();
    Ok(exported)
}

/// What an example's `main` returns on failure: printed as the error's
/// message and its causes, rather than the `Debug` form `main` would show.
pub struct MainError(Box<dyn std::error::Error + Send + Sync>);

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<E> for MainError {
    fn from(err: E) -> Self {
        Self(err.into())
    }
}

impl std::fmt::Debug for MainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}

/// How long a CRD an example installs may take to be established.
const CRD_ESTABLISHED_WITHIN: Duration = Duration::from_secs(30);

/// Applies `crd` to the hub (server-side, as `field_manager`) and waits
/// until it is established, for the examples whose hub type is their own.
pub async fn install_crd(
    hub: &kube::Client,
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    field_manager: &str,
) -> Result<(), MainError> {
    use kube::runtime::wait::{await_condition, conditions};
    let name = crd.metadata.name.clone().unwrap_or_default();
    let crds = Api::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >::all(hub.clone());
    crds.patch(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(crd),
    )
    .await?;
    tokio::time::timeout(
        CRD_ESTABLISHED_WITHIN,
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await
    .map_err(|_| {
        format!("the CRD {name} was not established within {CRD_ESTABLISHED_WITHIN:?}")
    })??;
    Ok(())
}

/// The name of the copy of `source`.
pub fn copy_name(source: &str) -> String {
    format!("{source}-copy")
}

/// The annotation on a copy naming the replica that wrote it (set by
/// [`controller_on_replica`]).
pub const COPIED_BY_ANNOTATION: &str = "multicluster.example/copied-by";

/// Builds the controller; `name` shows up in logs and metrics.
pub fn controller(name: &str) -> Result<Controller, Error> {
    build(name, None)
}

/// Builds the controller for one replica of several: each copy it writes
/// names `replica` in [`COPIED_BY_ANNOTATION`].
pub fn controller_on_replica(name: &str, replica: &str) -> Result<Controller, Error> {
    build(name, Some(replica))
}

fn build(name: &str, replica: Option<&str>) -> Result<Controller, Error> {
    Controller::builder(name)
        .for_resource(Watch::<ConfigMap>::new().filter(sync_filter()))
        .owns(Watch::<ConfigMap>::new())
        .max_concurrent_reconciles(4)
        .build_with_context(CopyContext::new(replica), reconcile)
}

/// Passes the events of ConfigMaps labelled [`SYNC_LABEL`]`=true` (and of
/// those that just lost the label).
pub fn sync_filter() -> Filter<ConfigMap> {
    filters::labels([(SYNC_LABEL.to_string(), "true".to_string())].into())
}

/// What every copy reconcile shares: the replica that writes the copies,
/// when there are several.
#[derive(Debug, Default)]
pub struct CopyContext {
    replica: Option<Arc<str>>,
}

impl CopyContext {
    /// The context for `replica` (named on each copy it writes, in
    /// [`COPIED_BY_ANNOTATION`]), or for a single replica.
    pub fn new(replica: Option<&str>) -> Arc<Self> {
        Arc::new(Self {
            replica: replica.map(Arc::from),
        })
    }
}

/// The copy reconciler: makes `<name>-copy` (owned by its source) equal to
/// the labelled source, or deletes it when the source is gone or no longer
/// labelled.
pub async fn reconcile(
    request: Request,
    cluster: Cluster,
    context: Arc<CopyContext>,
) -> Result<Action, SyncError> {
    let replica = context.replica.clone();
    let namespace = request
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let copies = Api::<ConfigMap>::namespaced(cluster.client(), &namespace);
    let copy = copy_name(&request.name);
    let source = cluster
        .cache()
        .get::<ConfigMap>(Some(&namespace), &request.name)
        .await
        .map_err(|err| SyncError::Cache(request.clone(), err))?;
    let Some(source) = source.filter(|cm| {
        cm.metadata.deletion_timestamp.is_none()
            && cm
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SYNC_LABEL))
                .map(String::as_str)
                == Some("true")
    }) else {
        // Gone (or no longer labelled): the copy goes too. Garbage collection
        // would do it for deletions, but not every cluster runs it.
        match copies.delete(&copy, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(cluster = %request.cluster, "{namespace}/{copy} deleted: its source is gone")
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(SyncError::Write(request, err)),
        }
        return Ok(Action::await_change());
    };
    let owner = source
        .controller_owner_ref(&())
        .map(|owner| serde_json::to_value(owner).unwrap_or_default());
    let desired = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": copy,
            "namespace": namespace,
            "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
            "annotations": replica.iter().map(|r| (COPIED_BY_ANNOTATION, r.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
        },
        "data": source.data.clone().unwrap_or_default(),
    });
    copies
        .patch(
            &copy,
            &PatchParams::apply("multicluster-example").force(),
            &Patch::Apply(desired),
        )
        .await
        .map_err(|err| SyncError::Write(request.clone(), err))?;
    tracing::info!(
        cluster = %request.cluster,
        keys = source.data.as_ref().map_or(0, |d| d.len()),
        "{namespace}/{} copied to {copy}",
        request.name
    );
    Ok(Action::await_change())
}

/// For the examples that propagate hub ConfigMaps: the copy a hub
/// ConfigMap wants in a member (same namespace, name and data).
pub fn hub_copy(hub: &ConfigMap) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: hub.metadata.name.clone(),
            namespace: hub.metadata.namespace.clone(),
            ..Default::default()
        },
        data: hub.data.clone(),
        ..ConfigMap::default()
    }
}
