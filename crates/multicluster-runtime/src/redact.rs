//! Error text that is safe to log: `multicluster-core`'s `redact` (see
//! there for what is withheld and why), and the description of
//! kube-runtime's watch errors, which the core, a crate of shared types
//! without kube-runtime, cannot name.

pub use multicluster_core::redact::*;

use kube::runtime::watcher as watches;

/// A watch error, its client error described as [`Redacted::kube`]
/// describes one (kube-rs's own text of a failed credential plugin lists
/// the environment it set).
pub fn watcher(err: &watches::Error) -> Redacted {
    let text = match err {
        watches::Error::InitialListFailed(inner) => {
            format!(
                "failed to perform initial object list: {}",
                kube_error(inner)
            )
        }
        watches::Error::WatchStartFailed(inner) => {
            format!("failed to start watching object: {}", kube_error(inner))
        }
        watches::Error::WatchFailed(inner) => {
            format!("watch stream failed: {}", kube_error(inner))
        }
        other => other.to_string(),
    };
    Redacted::described(err, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_failed_by_its_credential_plugin_names_no_credential() {
        const SECRET: &str = "s3cr3t-t0k3n-value";
        use std::os::unix::process::ExitStatusExt;
        let run = kube::client::AuthError::AuthExecRun {
            cmd: format!("KUBE_PASSWORD=\"{SECRET}\" \"plugin\" \"--token={SECRET}\""),
            out: Box::new(std::process::Output {
                status: std::process::ExitStatus::from_raw(3 << 8),
                stdout: format!("{{\"token\": \"{SECRET}\"}}").into_bytes(),
                stderr: format!("KUBE_PASSWORD={SECRET}").into_bytes(),
            }),
        };
        let watch = watches::Error::WatchFailed(kube::Error::Auth(run));
        let text = watcher(&watch);
        assert!(
            text.starts_with("watch stream failed: the credential plugin failed"),
            "{text}"
        );
        assert!(!text.contains(SECRET), "{text}");
    }
}
