//! Which exec credential plugins a kubeconfig may run: client-go's plugin
//! policy, an allowlist by absolute path, and for each plugin on it the
//! variables a kubeconfig may set for it and the servers its credentials
//! may go to.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::servers::Servers;
use crate::Error;

/// Which exec credential plugins a kubeconfig may run (client-go's
/// `PluginPolicy`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExecPolicy {
    /// None (the default).
    #[default]
    DenyAll,
    /// Any command, with any arguments and environment, sending its
    /// credentials to any server.
    AllowAll,
    /// Only these plugins. A kubeconfig still chooses the arguments it runs
    /// them with, so list commands that only obtain credentials
    /// (`aws-iam-authenticator`, `gke-gcloud-auth-plugin`, `kubelogin`),
    /// not a general CLI or a shell. It may set only the variables named
    /// for the plugin ([`AllowedPlugin::env`]), and, where the plugin is
    /// bound to servers ([`AllowedPlugin::servers`]), name only those.
    Allowlist(Allowlist),
}

impl ExecPolicy {
    /// Only the commands at these absolute paths, each with no variable a
    /// kubeconfig may set and bound to no servers: see [`Allowlist::new`]
    /// and, to name variables or bind servers, [`Allowlist::of`].
    pub fn allowlist(
        commands: impl IntoIterator<Item = impl Into<PathBuf>>,
    ) -> Result<Self, Error> {
        Allowlist::new(commands).map(Self::Allowlist)
    }

    /// Whether setting `variable` for a plugin changes which code it runs: the
    /// dynamic loader's variables, the command search path, shells' and
    /// interpreters' startup files, options and module paths. Such a
    /// variable can never be named for a plugin ([`AllowedPlugin::env`]).
    pub fn variable_changes_code(variable: &str) -> bool {
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
            "GLIBC_TUNABLES",
        ];
        let upper = variable.to_ascii_uppercase();
        upper.starts_with("LD_")
            || upper.starts_with("DYLD_")
            || upper.starts_with("PYTHON")
            || upper.starts_with("BASH_FUNC_")
            || NAMES.contains(&upper.as_str())
    }
}

/// The exec credential plugins kubeconfigs from one source may run.
///
/// A kubeconfig's `command` is allowed when it is one of these paths, or a
/// bare name (no `/`) that `PATH` finds at one of them; it then runs from
/// that path. A relative path with a `/` depends on the working directory
/// and is never allowed. Paths are compared as written, symbolic links
/// unresolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Allowlist {
    plugins: Vec<AllowedPlugin>,
}

impl Allowlist {
    /// An allowlist of `commands`, each an [`AllowedPlugin::new`] (no
    /// variable named, bound to no servers); there must be at least one (to
    /// allow none, use [`ExecPolicy::DenyAll`]).
    pub fn new(commands: impl IntoIterator<Item = impl Into<PathBuf>>) -> Result<Self, Error> {
        let plugins = commands
            .into_iter()
            .map(AllowedPlugin::new)
            .collect::<Result<Vec<_>, _>>()?;
        Self::of(plugins)
    }

    /// An allowlist of `plugins`, each with its variables and servers;
    /// there must be at least one.
    pub fn of(plugins: impl IntoIterator<Item = AllowedPlugin>) -> Result<Self, Error> {
        let plugins: Vec<AllowedPlugin> = plugins.into_iter().collect();
        if plugins.is_empty() {
            return Err(invalid(
                "an exec plugin allowlist needs at least one command; ExecPolicy::DenyAll allows none"
                    .to_string(),
            ));
        }
        Ok(Self { plugins })
    }

    /// The commands allowed.
    pub fn commands(&self) -> impl Iterator<Item = &Path> {
        self.plugins.iter().map(|plugin| plugin.command.as_path())
    }

    /// The plugins allowed.
    pub fn plugins(&self) -> &[AllowedPlugin] {
        &self.plugins
    }

    /// The plugin allowed at `path`, if any.
    pub(super) fn plugin(&self, path: &Path) -> Option<&AllowedPlugin> {
        self.plugins.iter().find(|plugin| plugin.command == path)
    }
}

/// One plugin of an [`Allowlist`]: its command, the variables a kubeconfig
/// may set for it, and the servers its credentials may be sent to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AllowedPlugin {
    command: PathBuf,
    env: BTreeSet<String>,
    servers: Option<Servers>,
}

impl AllowedPlugin {
    /// The command at `command`, an absolute path in its normal form (no
    /// `.` or `..` parts, no `//`); a kubeconfig may set no variable for it
    /// and name any server until [`AllowedPlugin::env`] and
    /// [`AllowedPlugin::servers`] say otherwise.
    pub fn new(command: impl Into<PathBuf>) -> Result<Self, Error> {
        let command = command.into();
        if !command.is_absolute() || !is_normal(&command) {
            return Err(invalid(format!(
                "exec plugin allowlist entry {} is not an absolute path in normal form",
                command.display()
            )));
        }
        Ok(Self {
            command,
            env: BTreeSet::new(),
            servers: None,
        })
    }

    /// The variables a kubeconfig's `env` may set for this plugin (by
    /// exact name): any other is refused, whatever its value. Variables
    /// that change what code a plugin runs
    /// ([`ExecPolicy::variable_changes_code`]) cannot be named. The
    /// plugin still inherits this process's own environment, and gets
    /// `KUBERNETES_EXEC_INFO`, as the exec protocol defines.
    pub fn env<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
    ) -> Result<Self, Error> {
        for name in names {
            let name = name.into();
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(invalid(format!("{name:?} is not a variable name")));
            }
            if ExecPolicy::variable_changes_code(&name) {
                return Err(invalid(format!(
                    "{name:?} changes what code a plugin runs and cannot be allowed for a kubeconfig to set"
                )));
            }
            self.env.insert(name);
        }
        Ok(self)
    }

    /// Binds the plugin to `servers`: a kubeconfig running it must name a
    /// server inside the binding, or it is refused before the plugin runs.
    #[must_use]
    pub fn servers(mut self, servers: Servers) -> Self {
        self.servers = Some(servers);
        self
    }

    /// The command's path.
    pub fn command(&self) -> &Path {
        &self.command
    }

    /// The variables a kubeconfig may set for it.
    pub fn allowed_env(&self) -> &BTreeSet<String> {
        &self.env
    }

    /// The servers it is bound to (`None`: any server).
    pub fn bound_servers(&self) -> Option<&Servers> {
        self.servers.as_ref()
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidOptions {
        component: "kubeconfig policy".to_string(),
        reason,
    }
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
pub(super) fn resolve(command: &str) -> Option<PathBuf> {
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

pub(super) fn environment_names(
    env: Option<&[HashMap<String, String>]>,
) -> impl Iterator<Item = &str> {
    env.into_iter()
        .flatten()
        .filter_map(|variable| variable.get("name").map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn variables_that_change_code_cannot_be_named_for_a_plugin() {
        let plugin = AllowedPlugin::new("/usr/local/bin/kubelogin").expect("path");
        for name in ["LD_PRELOAD", "PATH", "GLIBC_TUNABLES", "", "A=B"] {
            assert!(plugin.clone().env([name]).is_err(), "{name}");
        }
        let plugin = plugin.env(["AZURE_TENANT_ID"]).expect("plain variable");
        assert!(plugin.allowed_env().contains("AZURE_TENANT_ID"));
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
            assert!(ExecPolicy::variable_changes_code(name), "{name}");
        }
        for name in [
            "AWS_REGION",
            "AWS_PROFILE",
            "REGION",
            "CLUSTER_NAME",
            "AZURE_TENANT_ID",
        ] {
            assert!(!ExecPolicy::variable_changes_code(name), "{name}");
        }
    }
}
