//! Checking Grafana dashboards and Prometheus rule files against the
//! metrics a library exports, with Prometheus's own PromQL parser and rule
//! loader: a checker built from the Go module proxy by a script of the
//! caller's (this workspace's `hack/monitoring/build.sh`), as the control
//! plane's binaries are.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the checker with `build_script` (a finished build is reused by
/// the script) and returns its path; the script's own words on failure.
pub fn checker(build_script: &Path) -> Result<PathBuf, String> {
    crate::tools::built_by(build_script)
}

/// Runs `checker` on `files` against the metrics in `exported` (a file in
/// the text format a scrape gets): whether they passed, and what it said.
pub fn check(checker: &Path, exported: &Path, files: &[PathBuf]) -> (bool, String) {
    let output = match Command::new(checker)
        .arg("-exported")
        .arg(exported)
        .args(files)
        .output()
    {
        Ok(output) => output,
        Err(err) => return (false, format!("running {}: {err}", checker.display())),
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}
