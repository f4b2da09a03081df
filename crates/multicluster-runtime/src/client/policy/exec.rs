//! Which exec credential plugins a kubeconfig may run: client-go's plugin
//! policy, an allowlist by absolute path, and the variables a plugin of an
//! allowlist may not be given.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::Error;

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

    /// Whether setting `variable` for a plugin changes which code it runs: the
    /// dynamic loader's variables, the command search path, shells' and
    /// interpreters' startup files, options and module paths. Also refused in
    /// a ClusterProfile's additional-envs extension.
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
        ];
        let upper = variable.to_ascii_uppercase();
        upper.starts_with("LD_")
            || upper.starts_with("DYLD_")
            || upper.starts_with("PYTHON")
            || upper.starts_with("BASH_FUNC_")
            || NAMES.contains(&upper.as_str())
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
