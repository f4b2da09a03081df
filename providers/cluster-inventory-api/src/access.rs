//! Access providers (KEP-5339): the consumer's provider file and the
//! kubeconfig it yields for a ClusterProfile.
//!
//! The provider file lists exec credential plugins by access-provider name.
//! For a profile, the first provider in file order that the profile offers
//! (in `status.accessProviders`, or for a profile read through v1alpha1 the
//! deprecated `status.credentialProviders`) is used: the server and CA come
//! from the profile's `cluster` entry, the credentials from the plugin. A
//! profile read through v1alpha2 follows its rules: `credentialProviders`
//! is no field of it, nor is a CA file path (`certificate-authority`) in
//! its `cluster` entries. kube-rs runs
//! the plugin, passes the cluster entry (and its
//! `client.authentication.k8s.io/exec` extension as `spec.cluster.config`)
//! when `provideClusterInfo` is set, and runs it again before the token
//! expires.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use kube::api::DynamicObject;
use kube::config::{
    AuthInfo, Cluster, Context, ExecConfig, ExecInteractiveMode, Kubeconfig, NamedAuthInfo,
    NamedCluster, NamedContext,
};
use serde::{Deserialize, Serialize};

use multicluster_runtime::client::{BadServer, ExecPolicy, Servers};

use crate::ApiVersion;

/// Profile extension with extra plugin arguments. The ClusterProfile CRD
/// declares every extension's value an object, so the form an API server
/// stores is `{"args": ["--region", "eu-1"]}`; a bare list of strings (the
/// form upstream's Go library reads, which only objects built in memory can
/// hold) is accepted too.
pub const ADDITIONAL_ARGS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";
/// Profile extension with extra plugin environment variables (a string map).
pub const ADDITIONAL_ENVS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs";

/// The value of an additional-args extension, in either of its forms.
#[derive(Deserialize)]
#[serde(untagged)]
enum AdditionalArgs {
    /// `{"args": [...]}`: what the real CRD can store.
    Object(ArgsObject),
    /// `[...]`: what upstream's Go library reads.
    List(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArgsObject {
    args: Vec<String>,
}

impl AdditionalArgs {
    fn read(value: &serde_json::Value) -> Result<Vec<String>, String> {
        match serde_json::from_value(value.clone()) {
            Ok(AdditionalArgs::Object(ArgsObject { args }) | AdditionalArgs::List(args)) => {
                Ok(args)
            }
            Err(_) => Err(format!(
                "extension {ADDITIONAL_ARGS_EXTENSION} is neither {{\"args\": [strings]}} nor a list of strings"
            )),
        }
    }
}

/// The consumer's provider file (Go flag `--clusterprofile-provider-file`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProviderFile {
    /// Plugins by access-provider name; earlier entries are preferred.
    pub providers: Vec<AccessProvider>,
}

/// One access provider of the provider file.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccessProvider {
    /// The name profiles list in `status.accessProviders[].name`.
    pub name: String,
    /// The exec credential plugin (kubeconfig `users[].user.exec` format).
    pub exec_config: ExecConfig,
    /// What to do with a profile's additional-args extension.
    #[serde(default, rename = "profileSourcedCLIArgsPolicy")]
    pub profile_sourced_cli_args_policy: ArgsPolicy,
    /// What to do with a profile's additional-envs extension.
    #[serde(default)]
    pub profile_sourced_env_vars_policy: EnvVarsPolicy,
    /// The variables a profile's additional-envs extension may set, under
    /// a policy that reads it (this library's field; Go's reader ignores
    /// it): any other is refused, with the profile. A list of what may
    /// not be set always misses the next variable that steers a plugin
    /// (its proxy, its CA, its config file); variables that change what
    /// code it runs cannot be named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profile_sourced_env_var_names: Vec<String>,
    /// The servers this provider's credentials may be sent to (this
    /// library's field): host patterns and IP networks as
    /// [`Servers::from_patterns`] takes them (`*.eks.amazonaws.com`,
    /// `api.example.com:6443`, `10.0.0.0/8`), and servers named one by one
    /// with their CA (`{"server": "api.a.example:6443",
    /// "certificateAuthorityData": "<base64 PEM>"}`). A profile naming
    /// another server is refused before the plugin runs. A provider whose
    /// plugin receives what profiles write ([`AccessProvider::profile_input`])
    /// runs only for servers named one by one
    /// ([`Servers::names_each_server`]), unless
    /// [`AccessProvider::allow_unbound_profile_input`] is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<BoundServer>,
    /// A CA bundle (base64 of PEM, as a kubeconfig's
    /// `certificate-authority-data`) the servers must chain to; it
    /// replaces the profile's CA (this library's field). A server named
    /// with its own CA chains to that one.
    #[serde(
        default,
        rename = "serverCAData",
        skip_serializing_if = "Option::is_none"
    )]
    pub server_ca_data: Option<String>,
    /// Lets the plugin run with what profiles write for servers not named
    /// one by one (this library's field, default false): whoever may
    /// write a ClusterProfile's status can then choose whose credential
    /// the plugin mints and which server it is sent to. Only the steering
    /// rules (the crate README) stand between them; logged at start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unbound_profile_input: bool,
}

/// One entry of [`AccessProvider::servers`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BoundServer {
    /// A host pattern or an IP network ([`Servers::from_patterns`]).
    Pattern(String),
    /// One server (`host:port`, or an `https://` URL naming both) and the
    /// CA its certificate must chain to ([`Servers::named`]).
    #[serde(rename_all = "camelCase")]
    Named {
        /// The server.
        server: String,
        /// Its CA, base64 of PEM as a kubeconfig's
        /// `certificate-authority-data`.
        certificate_authority_data: String,
    },
}

/// Shows the server, not the CA data.
impl std::fmt::Debug for BoundServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BoundServer::Pattern(pattern) => write!(f, "{pattern:?}"),
            BoundServer::Named { server, .. } => write!(f, "{server:?} with its CA"),
        }
    }
}

impl AccessProvider {
    /// The servers this provider is bound to, `None` when it is bound to
    /// none; an error names what is wrong with the patterns or a CA.
    pub fn binding(&self) -> Result<Option<Servers>, String> {
        if self.servers.is_empty() && self.server_ca_data.is_none() {
            return Ok(None);
        }
        let decode = |data: &str, what: &str| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map(|pem| String::from_utf8_lossy(&pem).into_owned())
                .map_err(|_| format!("{what} is not base64"))
        };
        let mut servers = Servers::new();
        for entry in &self.servers {
            servers = match entry {
                BoundServer::Pattern(pattern) => {
                    servers.pattern(pattern).map_err(|err| err.to_string())?
                }
                BoundServer::Named {
                    server,
                    certificate_authority_data,
                } => {
                    let pem = decode(
                        certificate_authority_data,
                        &format!("the certificateAuthorityData of server {server:?}"),
                    )?;
                    servers.named(server, pem).map_err(|err| err.to_string())?
                }
            };
        }
        if let Some(data) = &self.server_ca_data {
            servers = servers
                .ca_bundle(decode(data, "serverCAData")?)
                .map_err(|err| err.to_string())?;
        }
        Ok(Some(servers))
    }

    /// What of a profile this provider's plugin receives, as the provider
    /// file's fields that hand it over: `provideClusterInfo` (the cluster
    /// entry and its exec extension), an arguments policy that appends,
    /// an environment policy that reads. Empty: the plugin mints the same
    /// whatever a profile writes.
    pub fn profile_input(&self) -> Vec<&'static str> {
        let mut input = Vec::new();
        if self.exec_config.provide_cluster_info {
            input.push("execConfig.provideClusterInfo");
        }
        if self.profile_sourced_cli_args_policy != ArgsPolicy::Ignore {
            input.push("profileSourcedCLIArgsPolicy");
        }
        if self.profile_sourced_env_vars_policy != EnvVarsPolicy::Ignore {
            input.push("profileSourcedEnvVarsPolicy");
        }
        input
    }

    /// Why profiles may not use this provider, if they may not: its
    /// plugin receives what they write and it is neither bound to servers
    /// named one by one nor allowed otherwise
    /// ([`AccessProvider::allow_unbound_profile_input`]).
    pub fn unbound_profile_input(&self) -> Option<String> {
        let input = self.profile_input();
        if input.is_empty() || self.allow_unbound_profile_input {
            return None;
        }
        let binding = self.binding().ok().flatten();
        if binding.as_ref().is_some_and(Servers::names_each_server) {
            return None;
        }
        let bound = match &binding {
            None => "is bound to no servers",
            Some(_) => {
                "is bound to servers not named one by one (a *. pattern, a network, a host without its port, a server without a CA)"
            }
        };
        Some(format!(
            "access provider {:?} hands its plugin what profiles write ({}) and {bound}, so a profile could have it mint another member's credential for a server of its choosing; name each server with its CA in the provider's servers, or set allowUnboundProfileInput to allow it",
            self.name,
            input.join(", ")
        ))
    }
}

/// Shows the plugin's command, the names of its variables and its servers:
/// arguments and values can be credentials.
impl std::fmt::Debug for AccessProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env_names: Vec<&str> = self
            .exec_config
            .env
            .iter()
            .flatten()
            .filter_map(|var| var.get("name").map(String::as_str))
            .collect();
        f.debug_struct("AccessProvider")
            .field("name", &self.name)
            .field("command", &self.exec_config.command)
            .field("env_names", &env_names)
            .field(
                "profile_sourced_cli_args_policy",
                &self.profile_sourced_cli_args_policy,
            )
            .field(
                "profile_sourced_env_vars_policy",
                &self.profile_sourced_env_vars_policy,
            )
            .field(
                "profile_sourced_env_var_names",
                &self.profile_sourced_env_var_names,
            )
            .field("servers", &self.servers)
            .field("server_ca_data", &self.server_ca_data.is_some())
            .field(
                "allow_unbound_profile_input",
                &self.allow_unbound_profile_input,
            )
            .finish_non_exhaustive()
    }
}

/// How arguments from a profile's additional-args extension are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArgsPolicy {
    /// Not used (also the meaning of an empty value).
    #[default]
    #[serde(alias = "")]
    Ignore,
    /// Appended after the configured arguments.
    Append,
}

/// How variables from a profile's additional-envs extension are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnvVarsPolicy {
    /// Not used (also the meaning of an empty value).
    #[default]
    #[serde(alias = "")]
    Ignore,
    /// Added unless the configured environment already sets them.
    AppendIfNotExists,
    /// Added, overriding configured values of the same name.
    Replace,
}

/// Why the provider file or a profile's access cannot be used. Messages
/// name the file or profile and never quote values (they can be secrets).
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The provider file cannot be read or is not valid.
    #[error("provider file {path}: {reason}")]
    ProviderFile {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The profile cannot be accessed with the configured providers.
    #[error("ClusterProfile {profile}: {reason}")]
    Profile {
        /// `<namespace>/<name>` of the profile.
        profile: String,
        /// What is wrong.
        reason: String,
    },
    /// The profile asks for what the provider file does not allow: a
    /// server outside the provider's binding, a variable not named for it.
    /// Counted as a refused kubeconfig.
    #[error("ClusterProfile {profile}: {reason}")]
    Refused {
        /// `<namespace>/<name>` of the profile.
        profile: String,
        /// What is refused, and the option that would allow it.
        reason: String,
    },
}

impl ProviderFile {
    /// Reads and checks a provider file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, AccessError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|err| AccessError::ProviderFile {
            path: path.display().to_string(),
            reason: format!("cannot be read: {err}"),
        })?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses and checks provider-file JSON; `source` names it in errors.
    pub fn from_json(text: &str, source: &str) -> Result<Self, AccessError> {
        let invalid = |reason: String| AccessError::ProviderFile {
            path: source.to_string(),
            reason,
        };
        let file: Self = serde_json::from_str(text).map_err(|err| invalid(json_problem(&err)))?;
        file.check().map_err(invalid)?;
        Ok(file)
    }

    fn check(&self) -> Result<(), String> {
        if self.providers.is_empty() {
            return Err("it lists no providers".into());
        }
        let mut seen = std::collections::HashSet::new();
        for (index, provider) in self.providers.iter().enumerate() {
            if provider.name.is_empty() {
                return Err(format!("provider #{index} has no name"));
            }
            if !seen.insert(provider.name.as_str()) {
                return Err(format!("provider {:?} is listed twice", provider.name));
            }
            if provider
                .exec_config
                .command
                .as_deref()
                .is_none_or(str::is_empty)
            {
                return Err(format!(
                    "provider {:?} has no execConfig.command",
                    provider.name
                ));
            }
            provider
                .binding()
                .map_err(|reason| format!("provider {:?}: {reason}", provider.name))?;
            if let Some(name) = provider
                .profile_sourced_env_var_names
                .iter()
                .find(|name| ExecPolicy::variable_changes_code(name) || name.is_empty())
            {
                return Err(format!(
                    "provider {:?}: profileSourcedEnvVarNames names {name:?}, which changes what code a plugin runs",
                    provider.name
                ));
            }
        }
        Ok(())
    }

    /// Logs, once for each provider whose plugin receives what profiles
    /// write, what that allows: a warning for one allowed any server
    /// (`allowUnboundProfileInput`), and for one whose profiles are
    /// refused for want of servers named one by one.
    pub fn warn_about_profile_input(&self) {
        for provider in &self.providers {
            let input = provider.profile_input();
            if input.is_empty() {
                continue;
            }
            if let Some(reason) = provider.unbound_profile_input() {
                tracing::warn!(provider = %provider.name, "profiles choosing it are refused: {reason}");
            } else if provider.allow_unbound_profile_input
                && !provider
                    .binding()
                    .ok()
                    .flatten()
                    .is_some_and(|servers| servers.names_each_server())
            {
                tracing::warn!(
                    provider = %provider.name,
                    "allowUnboundProfileInput: its plugin runs with what ClusterProfiles write ({}) for servers nobody named one by one; whoever may write a ClusterProfile's status can choose whose credential it mints and where it is sent",
                    input.join(", ")
                );
            }
        }
    }

    /// Sets [`AccessProvider::allow_unbound_profile_input`] on the
    /// provider `name` (an example's flag); an error when the file has
    /// no such provider.
    pub fn allow_unbound_profile_input(&mut self, name: &str) -> Result<(), AccessError> {
        let known = quoted_list(self.providers.iter().map(|p| p.name.as_str()));
        let provider = self
            .providers
            .iter_mut()
            .find(|provider| provider.name == name)
            .ok_or_else(|| AccessError::ProviderFile {
                path: "the provider file".to_string(),
                reason: format!("it has no provider {name:?} (it has {known})"),
            })?;
        provider.allow_unbound_profile_input = true;
        Ok(())
    }

    /// The access to `profile`: the first provider in file order that the
    /// profile offers, with its plugin call adjusted for the profile.
    ///
    /// Long on purpose: the checks on a profile in the order they apply, each
    /// with its own error naming the field it refuses.
    pub fn access_for(&self, profile: &DynamicObject) -> Result<ProfileAccess, AccessError> {
        let profile_name = format!(
            "{}/{}",
            profile.metadata.namespace.as_deref().unwrap_or_default(),
            profile.metadata.name.as_deref().unwrap_or_default()
        );
        let problem = |reason: String| AccessError::Profile {
            profile: profile_name.clone(),
            reason,
        };
        let refused = |reason: String| AccessError::Refused {
            profile: profile_name.clone(),
            reason,
        };
        let offered = offered_providers(profile);
        let (provider, (field, entry)) = self
            .providers
            .iter()
            .find_map(|provider| Some((provider, offered.get(provider.name.as_str())?.clone())))
            .ok_or_else(|| {
                problem(format!(
                    "none of its access providers ({}) is in the provider file ({})",
                    quoted_list(offered.keys().copied()),
                    quoted_list(self.providers.iter().map(|p| p.name.as_str()))
                ))
            })?;
        let at = format!("status.{field}[{:?}]", provider.name);
        if ApiVersion::of(profile) == Some(ApiVersion::V1Alpha2)
            && entry["cluster"].get("certificate-authority").is_some()
        {
            return Err(problem(format!(
                "{at}.cluster.certificate-authority is no field of {}",
                ApiVersion::V1Alpha2
            )));
        }
        let cluster: Cluster = serde_json::from_value(entry["cluster"].clone())
            .map_err(|_| problem(format!("{at}.cluster is not a kubeconfig cluster entry")))?;
        if let Err(bad) = BadServer::check(cluster.server.as_deref()) {
            return Err(refused(format!("{at}.cluster.server {bad}")));
        }
        if let Some(reason) = provider.unbound_profile_input() {
            return Err(refused(reason));
        }
        let binding = provider
            .binding()
            .map_err(|reason| problem(format!("{at}: {reason}")))?;
        let mut cluster = cluster;
        if let Some(servers) = &binding {
            let server = cluster.server.clone().unwrap_or_default();
            if !servers.admits(&server) {
                return Err(refused(format!(
                    "{at}.cluster.server is not among the servers access provider {:?} may send credentials to (its servers in the provider file)",
                    provider.name
                )));
            }
            if let Some(ca) = servers.ca_data_for(&server) {
                cluster.certificate_authority_data = Some(ca);
                cluster.certificate_authority = None;
                cluster.insecure_skip_tls_verify = Some(false);
            }
        }
        let call = plugin_call(provider, &cluster).map_err(|refusal| match refusal {
            Refusal::Problem(reason) => problem(format!("{at}: {reason}")),
            Refusal::Refused(reason) => refused(format!("{at}: {reason}")),
        })?;
        let exec = call.exec;
        let kubeconfig = Kubeconfig {
            clusters: vec![NamedCluster {
                name: profile_name.clone(),
                cluster: Some(cluster),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: provider.name.clone(),
                auth_info: Some(AuthInfo {
                    exec: Some(exec),
                    ..AuthInfo::default()
                }),
                ..NamedAuthInfo::default()
            }],
            contexts: vec![NamedContext {
                name: profile_name.clone(),
                context: Some(Context {
                    cluster: profile_name.clone(),
                    user: Some(provider.name.clone()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some(profile_name),
            ..Kubeconfig::default()
        };
        Ok(ProfileAccess {
            provider: provider.name.clone(),
            deprecated_field: field == "credentialProviders",
            input: call.profile_input,
            kubeconfig,
        })
    }
}

/// What the provider file yields for one profile.
#[derive(Clone)]
pub struct ProfileAccess {
    /// The access provider chosen.
    pub provider: String,
    /// Whether the profile listed it only in the deprecated
    /// `status.credentialProviders`.
    pub deprecated_field: bool,
    /// What the profile hands the plugin beyond the provider file's
    /// settings and the server (the exec extension it is given as
    /// `spec.cluster.config`, the additional arguments and variables it
    /// reads), with the provider's name, as text equal for inputs equal in
    /// meaning: JSON compared as values (keys sorted), and empty lists,
    /// empty objects and nulls taken as absent. `None` when it hands the
    /// plugin nothing, so the plugin cannot tell this profile's call from
    /// another's but by the server.
    pub input: Option<String>,
    /// One context: the profile's cluster entry with the provider's plugin.
    pub kubeconfig: Kubeconfig,
}

impl ProfileAccess {
    /// The server the profile names.
    pub fn server(&self) -> &str {
        self.kubeconfig
            .clusters
            .first()
            .and_then(|named| named.cluster.as_ref())
            .and_then(|cluster| cluster.server.as_deref())
            .unwrap_or_default()
    }
}

/// Shows the provider and the server only: the plugin's settings can hold
/// credentials.
impl std::fmt::Debug for ProfileAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = self
            .kubeconfig
            .clusters
            .first()
            .and_then(|named| named.cluster.as_ref())
            .and_then(|cluster| cluster.server.as_deref());
        f.debug_struct("ProfileAccess")
            .field("provider", &self.provider)
            .field("deprecated_field", &self.deprecated_field)
            .field("server", &server)
            .finish_non_exhaustive()
    }
}

impl ProfileAccess {
    /// The kubeconfig as canonical text (JSON, keys sorted), so equal
    /// settings always give equal text: see
    /// [`KubeconfigCluster::text_of`](multicluster_runtime::provider::kubeconfig::KubeconfigCluster::text_of).
    pub fn text(&self) -> String {
        multicluster_runtime::provider::kubeconfig::KubeconfigCluster::text_of(&self.kubeconfig)
    }
}

/// The profile's access providers by name, each with the status field it
/// came from; on a name clash `accessProviders` wins over the deprecated
/// `credentialProviders`, which only v1alpha1 has.
fn offered_providers(profile: &DynamicObject) -> BTreeMap<&str, (&'static str, serde_json::Value)> {
    let mut offered = BTreeMap::new();
    let fields: &[&'static str] = match ApiVersion::of(profile) {
        Some(ApiVersion::V1Alpha2) => &["accessProviders"],
        _ => &["credentialProviders", "accessProviders"],
    };
    for &field in fields {
        for entry in profile.data["status"][field]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(name) = entry["name"].as_str() {
                offered.insert(name, (field, entry.clone()));
            }
        }
    }
    offered
}

/// Why a profile's plugin call cannot be made.
enum Refusal {
    /// Its extensions are malformed.
    Problem(String),
    /// It asks for what the provider file does not allow.
    Refused(String),
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Refusal::Problem(reason)
    }
}

/// A profile's plugin call, and what the profile put into it.
struct PluginCall {
    exec: ExecConfig,
    profile_input: Option<String>,
}

/// The provider's exec settings adjusted for one profile — on a copy, so
/// one profile's extensions never reach another's plugin call.
fn plugin_call(provider: &AccessProvider, cluster: &Cluster) -> Result<PluginCall, Refusal> {
    let mut exec = provider.exec_config.clone();
    // Nobody is at a terminal to answer a prompt.
    exec.interactive_mode = Some(ExecInteractiveMode::Never);
    // What the profile hands the plugin: the exec extension (given to it
    // with provideClusterInfo) and what the policies let it add.
    let mut input = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    for extension in cluster.extensions.iter().flatten() {
        // Two of one name would be read one way here and another by
        // whoever reads the entry next.
        if !seen.insert(extension.name.as_str()) {
            return Err(Refusal::Problem(format!(
                "cluster.extensions lists {:?} twice",
                extension.name
            )));
        }
        match extension.name.as_str() {
            "client.authentication.k8s.io/exec" if exec.provide_cluster_info => {
                input.insert("config", extension.extension.clone());
            }
            ADDITIONAL_ARGS_EXTENSION => match provider.profile_sourced_cli_args_policy {
                ArgsPolicy::Ignore => {}
                ArgsPolicy::Append => {
                    let extra = AdditionalArgs::read(&extension.extension)?;
                    input.insert("args", serde_json::json!(extra));
                    exec.args.get_or_insert_default().extend(extra);
                }
            },
            ADDITIONAL_ENVS_EXTENSION => {
                let policy = provider.profile_sourced_env_vars_policy;
                if policy == EnvVarsPolicy::Ignore {
                    continue;
                }
                let extra: BTreeMap<String, String> =
                    serde_json::from_value(extension.extension.clone()).map_err(|_| {
                        format!("extension {ADDITIONAL_ENVS_EXTENSION} is not a map of strings")
                    })?;
                // A profile's variables are data for the plugin, and only
                // those the operator named.
                if let Some(name) = extra
                    .keys()
                    .find(|name| !provider.profile_sourced_env_var_names.contains(name))
                {
                    return Err(Refusal::Refused(format!(
                        "extension {ADDITIONAL_ENVS_EXTENSION} sets {name:?}, a variable not named in the provider's profileSourcedEnvVarNames"
                    )));
                }
                // The input is what reaches the plugin: a variable the
                // configured environment keeps is no input of the profile.
                let mut applied = BTreeMap::new();
                let env = exec.env.get_or_insert_default();
                for (name, value) in extra {
                    let existing = env.iter_mut().find(|var| var.get("name") == Some(&name));
                    match (existing, policy) {
                        (Some(var), EnvVarsPolicy::Replace) => {
                            var.insert("value".into(), value.clone());
                            applied.insert(name, value);
                        }
                        (Some(_), _) => {}
                        (None, _) => {
                            env.push(HashMap::from([
                                ("name".to_string(), name.clone()),
                                ("value".to_string(), value.clone()),
                            ]));
                            applied.insert(name, value);
                        }
                    }
                }
                input.insert("env", serde_json::json!(applied));
            }
            _ => {}
        }
    }
    let input: serde_json::Map<String, serde_json::Value> = input
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_string(), meaning(&value)?)))
        .collect();
    let profile_input = (!input.is_empty()).then(|| {
        let input = sorted(serde_json::Value::Object(input));
        serde_json::json!({"input": input, "provider": provider.name}).to_string()
    });
    Ok(PluginCall {
        exec,
        profile_input,
    })
}

/// `value` as the plugin takes it: nulls, empty lists and empty objects
/// are absent (a plugin reading JSON cannot tell them from a missing
/// field), inside objects and lists as at the top; `None` when nothing is
/// left.
fn meaning(value: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::Value;
    match value {
        Value::Null => None,
        Value::Array(items) => {
            let items: Vec<Value> = items
                .iter()
                .map(|item| meaning(item).unwrap_or(Value::Null))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(fields) => {
            let fields: serde_json::Map<String, Value> = fields
                .iter()
                .filter_map(|(key, value)| Some((key.clone(), meaning(value)?)))
                .collect();
            (!fields.is_empty()).then_some(Value::Object(fields))
        }
        other => Some(other.clone()),
    }
}

/// `value` with every object's keys in order, so equal values print
/// equal text whichever map serde_json was built with.
fn sorted(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        Value::Object(fields) => {
            let fields: BTreeMap<String, Value> = fields
                .into_iter()
                .map(|(key, value)| (key, sorted(value)))
                .collect();
            Value::Object(fields.into_iter().collect())
        }
        other => other,
    }
}

fn quoted_list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<String> = names.map(|name| format!("{name:?}")).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// A serde_json error without the values it may quote.
fn json_problem(err: &serde_json::Error) -> String {
    let text = err.to_string();
    let at = format!("line {} column {}", err.line(), err.column());
    match err.classify() {
        serde_json::error::Category::Data
            if text.starts_with("unknown variant")
                || text.starts_with("missing field")
                || text.starts_with("unknown field") =>
        {
            text
        }
        serde_json::error::Category::Data => format!("a value has the wrong type or form at {at}"),
        serde_json::error::Category::Io => format!("cannot be read: {text}"),
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            format!("it is not valid JSON (at {at})")
        }
    }
}

#[cfg(test)]
mod tests;
