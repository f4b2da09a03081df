//! Command-line tools a test runs, built from the Go module proxy by a
//! script of the caller's (this workspace's `hack/helm/build.sh`,
//! `hack/kind/build.sh`, `hack/monitoring/build.sh`), as the control
//! plane's binaries are: the script builds once, caches, and prints the
//! binary's path.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `build_script` (a finished build is reused by the script) and
/// returns the path it printed; the script's own words on failure.
pub fn built_by(build_script: &Path) -> Result<PathBuf, String> {
    let built = Command::new(build_script)
        .output()
        .map_err(|err| format!("running {}: {err}", build_script.display()))?;
    if !built.status.success() {
        return Err(format!(
            "{} failed:\n{}",
            build_script.display(),
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&built.stdout).trim().to_string(),
    ))
}
