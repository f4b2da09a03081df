//! What a kubeconfig may make this process do, decided before anything in
//! it is run, opened or dialled.
//!
//! A kubeconfig is more than a server and a credential. It can name a
//! command to run (an exec credential plugin), local files to read (a token
//! file, a CA, a client certificate and key), an auth provider and a proxy,
//! and it can turn TLS verification off. In a kubeconfig the operator wrote,
//! that is convenience. In one read from a cluster object (a kubeconfig
//! Secret, Cluster API's `<name>-kubeconfig` Secret, a ClusterProfile), it
//! lets whoever may write that object run commands as the controller, or
//! have it send one of its files (in a pod, its own service account token)
//! as a bearer token to a server of their choosing.
//!
//! A [`KubeconfigPolicy`] says which of these a kubeconfig may use.
//! [`crate::client::build`] checks the context it is about to use (its
//! cluster and its user) against the policy first; a kubeconfig that uses
//! anything the policy does not allow is refused as a whole with
//! [`Error::KubeconfigRefused`], which names each refused field and the
//! policy field that would allow it, never the field's value.
//!
//! Which policy applies is the provider's choice, by who wrote the
//! kubeconfig:
//!
//! | source | default |
//! |---|---|
//! | cluster objects: kubeconfig Secrets, Cluster API Secrets, ClusterProfile Secrets and status | [`KubeconfigPolicy::untrusted`] (also `Default`): nothing beyond a server, inline CA data and inline credentials |
//! | what the operator gave the process: kubeconfig files, the kind CLI, a ClusterProfile provider file's plugins | [`KubeconfigPolicy::trusted`]: everything, as kubectl allows |
//!
//! Exec plugins can also be allowed one command at a time
//! ([`ExecPolicy::allowlist`]), as client-go's credential plugin policy
//! (Kubernetes 1.35) allows them: by absolute path, a bare command name
//! being looked up on `PATH` and run from the path it was found at.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kube::config::{AuthInfo, Kubeconfig};

use crate::Error;

/// What a kubeconfig may use beyond a server, inline CA data and inline
/// credentials (a token, basic auth, client certificate and key data).
/// Build it from [`KubeconfigPolicy::untrusted`] (the `Default`) or
/// [`KubeconfigPolicy::trusted`] and the setters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct KubeconfigPolicy {
    /// Which exec credential plugins (`users[].user.exec`) may run.
    pub exec: ExecPolicy,
    /// Whether files may be named: `tokenFile`, `client-certificate`,
    /// `client-key` of the user, `certificate-authority` of the cluster.
    /// They are read by this process and, for a token, sent to the server.
    pub local_files: bool,
    /// Whether `users[].user.auth-provider` may be used.
    pub auth_providers: bool,
    /// Whether `clusters[].cluster.insecure-skip-tls-verify: true` may
    /// turn off the verification of the server's certificate.
    pub insecure_skip_tls_verify: bool,
    /// Whether `clusters[].cluster.proxy-url` may pick the proxy the
    /// member is reached through. (`HTTPS_PROXY` and `NO_PROXY` from the
    /// environment are the operator's and always apply.)
    pub proxy_url: bool,
}

crate::option_setters!(KubeconfigPolicy {
    exec: ExecPolicy,
    local_files: bool,
    auth_providers: bool,
    insecure_skip_tls_verify: bool,
    proxy_url: bool,
});

impl Default for KubeconfigPolicy {
    fn default() -> Self {
        Self::untrusted()
    }
}

impl KubeconfigPolicy {
    /// For kubeconfigs read from cluster objects: no exec plugin, no local
    /// file, no auth provider, no skipping TLS verification, no proxy URL.
    pub fn untrusted() -> Self {
        Self {
            exec: ExecPolicy::DenyAll,
            local_files: false,
            auth_providers: false,
            insecure_skip_tls_verify: false,
            proxy_url: false,
        }
    }

    /// For kubeconfigs the operator wrote: everything kubectl would use.
    pub fn trusted() -> Self {
        Self {
            exec: ExecPolicy::AllowAll,
            local_files: true,
            auth_providers: true,
            insecure_skip_tls_verify: true,
            proxy_url: true,
        }
    }

    /// Checks `kubeconfig`, already cut to one context (its cluster and at
    /// most one user), and returns what to build from: the same, with an
    /// allowlisted plugin's command replaced by the path it was found at,
    /// so that what runs is what was checked. Every refused field is named.
    pub(crate) fn admit(&self, mut kubeconfig: Kubeconfig) -> Result<Kubeconfig, Vec<Refusal>> {
        let mut refused = Vec::new();
        for named in &kubeconfig.clusters {
            let Some(cluster) = &named.cluster else {
                continue;
            };
            let at = |key: &str| format!("clusters[{:?}].cluster.{key}", named.name);
            if !self.local_files && is_set(&cluster.certificate_authority) {
                refused.push(Refusal::new(
                    at("certificate-authority"),
                    Refused::LocalFile,
                ));
            }
            if !self.insecure_skip_tls_verify && cluster.insecure_skip_tls_verify == Some(true) {
                refused.push(Refusal::new(
                    at("insecure-skip-tls-verify"),
                    Refused::InsecureSkipTlsVerify,
                ));
            }
            if !self.proxy_url && is_set(&cluster.proxy_url) {
                refused.push(Refusal::new(at("proxy-url"), Refused::ProxyUrl));
            }
        }
        for named in &mut kubeconfig.auth_infos {
            let Some(user) = &mut named.auth_info else {
                continue;
            };
            let at = |key: &str| format!("users[{:?}].user.{key}", named.name);
            self.check_user(user, at, &mut refused);
        }
        if refused.is_empty() {
            Ok(kubeconfig)
        } else {
            Err(refused)
        }
    }

    fn check_user(
        &self,
        user: &mut AuthInfo,
        at: impl Fn(&str) -> String,
        refused: &mut Vec<Refusal>,
    ) {
        if !self.local_files {
            for (key, value) in [
                ("tokenFile", &user.token_file),
                ("client-certificate", &user.client_certificate),
                ("client-key", &user.client_key),
            ] {
                if is_set(value) {
                    refused.push(Refusal::new(at(key), Refused::LocalFile));
                }
            }
        }
        if !self.auth_providers && user.auth_provider.is_some() {
            refused.push(Refusal::new(at("auth-provider"), Refused::AuthProvider));
        }
        let Some(exec) = &mut user.exec else {
            return;
        };
        match &self.exec {
            ExecPolicy::AllowAll => {}
            ExecPolicy::DenyAll => refused.push(Refusal::new(at("exec"), Refused::Exec)),
            ExecPolicy::Allowlist(allowlist) => {
                let command = exec.command.as_deref().unwrap_or_default();
                match resolve(command) {
                    None => refused.push(Refusal::new(at("exec.command"), Refused::ExecUnresolved)),
                    Some(path) if !allowlist.commands.contains(&path) => {
                        refused.push(Refusal::new(at("exec.command"), Refused::ExecNotAllowed));
                    }
                    Some(path) => exec.command = Some(path.to_string_lossy().into_owned()),
                }
                for variable in environment_names(exec.env.as_deref()) {
                    if changes_code(variable) {
                        refused.push(Refusal::new(
                            at("exec.env"),
                            Refused::ExecEnvironment(variable.to_string()),
                        ));
                    }
                }
            }
        }
    }
}

/// Which exec credential plugins a kubeconfig may run (client-go's
/// `PluginPolicy`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExecPolicy {
    /// None (the default).
    #[default]
    DenyAll,
    /// Any command, with any arguments and environment.
    AllowAll,
    /// Only these commands. A kubeconfig still chooses the arguments and
    /// environment it runs them with, so list commands that only obtain
    /// credentials (`aws-iam-authenticator`, `gke-gcloud-auth-plugin`,
    /// `kubelogin`), not a general CLI or a shell. A plugin of an
    /// allowlisted command may not set variables that change what code it
    /// runs (`LD_*`, `DYLD_*`, `PATH`, `BASH_ENV`, interpreters' startup
    /// and module paths).
    Allowlist(Allowlist),
}

impl ExecPolicy {
    /// Only the commands at these absolute paths: see [`Allowlist::new`].
    pub fn allowlist(
        commands: impl IntoIterator<Item = impl Into<PathBuf>>,
    ) -> Result<Self, Error> {
        Allowlist::new(commands).map(Self::Allowlist)
    }
}

/// Commands exec credential plugins may run, by absolute path.
///
/// A kubeconfig's `command` is allowed when it is one of these paths, or a
/// bare name (no `/`) that `PATH` finds at one of them; it then runs from
/// that path. A relative path with a `/` depends on the working directory
/// and is never allowed. Paths are compared as written, symbolic links
/// unresolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Allowlist {
    commands: Vec<PathBuf>,
}

impl Allowlist {
    /// An allowlist of `commands`; each must be an absolute path in its
    /// normal form (no `.` or `..` parts, no `//`), and there must be at
    /// least one (to allow none, use [`ExecPolicy::DenyAll`]).
    pub fn new(commands: impl IntoIterator<Item = impl Into<PathBuf>>) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidOptions {
            component: "kubeconfig policy".to_string(),
            reason,
        };
        let commands: Vec<PathBuf> = commands.into_iter().map(Into::into).collect();
        if commands.is_empty() {
            return Err(invalid(
                "an exec plugin allowlist needs at least one command; ExecPolicy::DenyAll allows none"
                    .to_string(),
            ));
        }
        for command in &commands {
            if !command.is_absolute() || !is_normal(command) {
                return Err(invalid(format!(
                    "exec plugin allowlist entry {} is not an absolute path in normal form",
                    command.display()
                )));
            }
        }
        Ok(Self { commands })
    }

    /// The commands allowed.
    pub fn commands(&self) -> &[PathBuf] {
        &self.commands
    }
}

/// One field a kubeconfig uses that its policy does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusal {
    /// Where in the kubeconfig, as its YAML spells it
    /// (`users["admin"].user.tokenFile`).
    pub field: String,
    /// What it would have done.
    pub refused: Refused,
}

impl Refusal {
    fn new(field: String, refused: Refused) -> Self {
        Self { field, refused }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.field, self.refused)
    }
}

/// What a refused field would have done, and what would allow it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// Run a command, with exec plugins denied.
    Exec,
    /// Run a command that is not on the allowlist.
    ExecNotAllowed,
    /// Run a command that cannot be checked against the allowlist: a
    /// relative path, or a name `PATH` does not find.
    ExecUnresolved,
    /// Run an allowlisted command with this variable set, which changes
    /// what code it runs.
    ExecEnvironment(String),
    /// Read a local file.
    LocalFile,
    /// Use an auth provider.
    AuthProvider,
    /// Skip verifying the server's certificate.
    InsecureSkipTlsVerify,
    /// Pick the proxy.
    ProxyUrl,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Exec => f.write_str(
                "runs a command, which kubeconfigs from this source may not (KubeconfigPolicy::exec allows it)",
            ),
            Refused::ExecNotAllowed => f.write_str(
                "is not on the exec plugin allowlist (KubeconfigPolicy::exec)",
            ),
            Refused::ExecUnresolved => f.write_str(
                "is neither an absolute path nor a name found on PATH, so it cannot be checked against the exec plugin allowlist (KubeconfigPolicy::exec)",
            ),
            Refused::ExecEnvironment(variable) => write!(
                f,
                "sets {variable:?}, which changes what code an allowlisted plugin runs (only ExecPolicy::AllowAll allows it)"
            ),
            Refused::LocalFile => f.write_str(
                "names a local file, which kubeconfigs from this source may not read (KubeconfigPolicy::local_files allows it)",
            ),
            Refused::AuthProvider => f.write_str(
                "uses an auth provider, which kubeconfigs from this source may not (KubeconfigPolicy::auth_providers allows it)",
            ),
            Refused::InsecureSkipTlsVerify => f.write_str(
                "turns off verifying the server's certificate, which kubeconfigs from this source may not (KubeconfigPolicy::insecure_skip_tls_verify allows it)",
            ),
            Refused::ProxyUrl => f.write_str(
                "picks a proxy, which kubeconfigs from this source may not (KubeconfigPolicy::proxy_url allows it)",
            ),
        }
    }
}

/// Several refusals as one line.
pub(crate) fn describe(refused: &[Refusal]) -> String {
    refused
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn is_set(value: &Option<String>) -> bool {
    value.as_deref().is_some_and(|value| !value.is_empty())
}

/// Whether `path` is written in normal form: a root, then plain names
/// (no `.`, `..` or empty parts; `Path::components` would hide some).
fn is_normal(path: &Path) -> bool {
    let text = path.to_string_lossy();
    text.strip_prefix('/').is_some_and(|rest| {
        rest.split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
    })
}

/// Where `command` runs from: itself when absolute, the first executable
/// file of that name in `PATH`'s absolute directories when it is a bare
/// name, `None` otherwise (a relative path depends on the working
/// directory, which a kubeconfig's author does not know either).
fn resolve(command: &str) -> Option<PathBuf> {
    let path = Path::new(command);
    if path.is_absolute() {
        return Some(path.to_path_buf());
    }
    if command.is_empty() || command.contains('/') {
        return None;
    }
    let directories = std::env::var_os("PATH")?;
    std::env::split_paths(&directories)
        .filter(|directory| directory.is_absolute())
        .map(|directory| directory.join(command))
        .find(|candidate| is_executable_file(candidate))
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

fn environment_names(env: Option<&[HashMap<String, String>]>) -> impl Iterator<Item = &str> {
    env.into_iter()
        .flatten()
        .filter_map(|variable| variable.get("name").map(String::as_str))
}

/// Whether setting `variable` for a plugin changes which code it runs: the
/// dynamic loader's variables, the command search path, shells' and
/// interpreters' startup files, options and module paths. Also refused in
/// a ClusterProfile's additional-envs extension.
pub fn changes_code(variable: &str) -> bool {
    const NAMES: &[&str] = &[
        "PATH",
        "IFS",
        "ENV",
        "BASH_ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PROMPT_COMMAND",
        "GCONV_PATH",
        "HOSTALIASES",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PERL5OPT",
        "PERL5LIB",
        "PERLLIB",
        "RUBYOPT",
        "RUBYLIB",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "CLASSPATH",
        "GIT_EXEC_PATH",
        "GIT_SSH_COMMAND",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "EDITOR",
        "VISUAL",
        "PAGER",
        "BROWSER",
        "TMPDIR",
        "HOME",
        "XDG_CONFIG_HOME",
        "KUBECONFIG",
    ];
    let upper = variable.to_ascii_uppercase();
    upper.starts_with("LD_")
        || upper.starts_with("DYLD_")
        || upper.starts_with("PYTHON")
        || upper.starts_with("BASH_FUNC_")
        || NAMES.contains(&upper.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::kubeconfig::parse;

    const EVERYTHING: &str = "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: https://203.0.113.1:6443\n    certificate-authority: /etc/ca.pem\n    insecure-skip-tls-verify: true\n    proxy-url: http://203.0.113.9:3128\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n    client-certificate: /etc/cert.pem\n    client-key: /etc/key.pem\n    auth-provider:\n      name: oidc\n      config:\n        id-token: x\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"id > /tmp/mark\"]\n";

    fn fields(refused: &[Refusal]) -> Vec<&str> {
        refused.iter().map(|r| r.field.as_str()).collect()
    }

    #[test]
    fn an_untrusted_kubeconfig_is_refused_for_every_field_it_may_not_use() {
        let kubeconfig = parse(EVERYTHING, "test").expect("parses");
        let refused = KubeconfigPolicy::default()
            .admit(kubeconfig)
            .expect_err("refused");
        assert_eq!(
            fields(&refused),
            [
                r#"clusters["c"].cluster.certificate-authority"#,
                r#"clusters["c"].cluster.insecure-skip-tls-verify"#,
                r#"clusters["c"].cluster.proxy-url"#,
                r#"users["u"].user.tokenFile"#,
                r#"users["u"].user.client-certificate"#,
                r#"users["u"].user.client-key"#,
                r#"users["u"].user.auth-provider"#,
                r#"users["u"].user.exec"#,
            ]
        );
        let text = describe(&refused);
        for value in [
            "/etc/ca.pem",
            "203.0.113.9",
            "serviceaccount",
            "/bin/sh",
            "mark",
        ] {
            assert!(!text.contains(value), "quotes {value}: {text}");
        }
        for option in [
            "KubeconfigPolicy::local_files",
            "KubeconfigPolicy::insecure_skip_tls_verify",
            "KubeconfigPolicy::proxy_url",
            "KubeconfigPolicy::auth_providers",
            "KubeconfigPolicy::exec",
        ] {
            assert!(text.contains(option), "names {option}: {text}");
        }
    }

    #[test]
    fn a_trusted_kubeconfig_keeps_everything() {
        let kubeconfig = parse(EVERYTHING, "test").expect("parses");
        let admitted = KubeconfigPolicy::trusted()
            .admit(kubeconfig.clone())
            .expect("admitted");
        assert_eq!(
            crate::client::kubeconfig::canonical_text(&admitted),
            crate::client::kubeconfig::canonical_text(&kubeconfig)
        );
    }

    #[test]
    fn inline_data_and_empty_fields_are_not_refused() {
        let text = "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: https://203.0.113.1:6443\n    certificate-authority-data: Q0E=\n    certificate-authority: \"\"\n    insecure-skip-tls-verify: false\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n";
        let kubeconfig = parse(text, "test").expect("parses");
        KubeconfigPolicy::untrusted()
            .admit(kubeconfig)
            .expect("nothing to refuse");
    }

    #[test]
    fn an_allowlist_admits_its_commands_by_path_or_name_and_runs_the_path() {
        let directory = tempfile::tempdir().expect("dir");
        let plugin = directory.path().join("fleet-credentials");
        std::fs::write(&plugin, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let policy = KubeconfigPolicy::untrusted()
            .exec(ExecPolicy::allowlist([plugin.clone()]).expect("valid"));
        let with = |command: &str, env: &str| {
            parse(
                &format!("apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: https://203.0.113.1:6443\ncontexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {command}\n      env: {env}\n"),
                "test",
            )
            .expect("parses")
        };
        let command_of = |kubeconfig: Kubeconfig| {
            kubeconfig.auth_infos[0]
                .auth_info
                .as_ref()
                .and_then(|user| user.exec.as_ref())
                .and_then(|exec| exec.command.clone())
        };
        let admitted = policy
            .admit(with(&plugin.display().to_string(), "[]"))
            .expect("by its path");
        assert_eq!(command_of(admitted), Some(plugin.display().to_string()));

        // Found on PATH: runs from where it was found. (PATH is read, not
        // changed: the test's directory is not on it, so a bare name of a
        // command that PATH has, but the allowlist not, is refused.)
        let refused = policy.admit(with("sh", "[]")).expect_err("not allowlisted");
        assert_eq!(refused[0].refused, Refused::ExecNotAllowed);
        let system = KubeconfigPolicy::untrusted()
            .exec(ExecPolicy::allowlist([resolve("sh").expect("sh on PATH")]).expect("valid"));
        let admitted = system.admit(with("sh", "[]")).expect("found on PATH");
        assert_eq!(
            command_of(admitted).map(PathBuf::from),
            resolve("sh"),
            "runs the path that was checked"
        );

        for relative in [
            "./fleet-credentials",
            "bin/fleet-credentials",
            "no-such-command-here",
        ] {
            let refused = policy.admit(with(relative, "[]")).expect_err(relative);
            assert_eq!(refused[0].refused, Refused::ExecUnresolved, "{relative}");
        }
        let refused = policy
            .admit(with(
                &plugin.display().to_string(),
                "[{name: LD_PRELOAD, value: /tmp/x.so}, {name: REGION, value: eu}]",
            ))
            .expect_err("loader variable");
        assert_eq!(
            refused,
            [Refusal::new(
                r#"users["u"].user.exec.env"#.to_string(),
                Refused::ExecEnvironment("LD_PRELOAD".to_string())
            )]
        );
        assert!(!describe(&refused).contains("/tmp/x.so"));
    }

    #[test]
    fn allowlists_take_absolute_paths_in_normal_form_only() {
        for bad in [
            "sh",
            "bin/sh",
            "/usr/bin/../bin/sh",
            "/usr//bin/sh",
            "/usr/./bin",
        ] {
            let err = ExecPolicy::allowlist([bad]).expect_err(bad);
            assert!(err.to_string().contains("not an absolute path"), "{err}");
        }
        assert!(ExecPolicy::allowlist(Vec::<PathBuf>::new()).is_err());
        assert!(ExecPolicy::allowlist(["/usr/local/bin/aws-iam-authenticator"]).is_ok());
    }

    #[test]
    fn variables_that_change_code_are_told_apart() {
        for name in [
            "LD_PRELOAD",
            "ld_library_path",
            "DYLD_INSERT_LIBRARIES",
            "PATH",
            "PYTHONPATH",
            "NODE_OPTIONS",
            "BASH_ENV",
        ] {
            assert!(changes_code(name), "{name}");
        }
        for name in [
            "AWS_REGION",
            "AWS_PROFILE",
            "REGION",
            "CLUSTER_NAME",
            "AZURE_TENANT_ID",
        ] {
            assert!(!changes_code(name), "{name}");
        }
    }
}
