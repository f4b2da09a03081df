//! Each example's README lists its flags as its `--help` prints them, and
//! a test of each example checks that they still do.

use std::path::Path;

/// The heading the flags follow, in a ```` ```text ```` block.
const HEADING: &str = "## Flags";

/// Checks that the README of the example in `manifest_dir` holds, under
/// `## Flags`, what `binary --help` prints (run with an empty environment:
/// clap shows the values of the variables a flag reads). With
/// `UPDATE_README_FLAGS=1` in the test's environment it writes the block
/// instead.
pub fn flags_match(binary: &str, manifest_dir: &str) {
    let output = std::process::Command::new(binary)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap_or_else(|err| panic!("running {binary} --help: {err}"));
    assert!(
        output.status.success(),
        "{binary} --help: {}",
        output.status
    );
    let help = String::from_utf8(output.stdout).expect("--help prints UTF-8");
    let help = help.trim_end();
    let path = Path::new(manifest_dir).join("README.md");
    let readme = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    let Some((before, block, after)) = flags_block(&readme) else {
        panic!(
            "{} has no `{HEADING}` heading followed by a ```text block",
            path.display()
        );
    };
    if std::env::var_os("UPDATE_README_FLAGS").is_some() {
        let after = if after.starts_with('\n') {
            after.to_string()
        } else {
            format!("\n{after}")
        };
        std::fs::write(&path, format!("{before}{help}{after}"))
            .unwrap_or_else(|err| panic!("writing {}: {err}", path.display()));
        return;
    }
    assert!(
        block == help,
        "the flags in {} are not what --help prints; run the test with UPDATE_README_FLAGS=1 to write them\n--- README\n{block}\n--- --help\n{help}",
        path.display()
    );
}

/// `readme` cut around the flags block: what comes before its text, the
/// text, and what comes after it.
fn flags_block(readme: &str) -> Option<(&str, &str, &str)> {
    let heading = readme.find(&format!("\n{HEADING}\n"))?;
    let open = "```text\n";
    let start = heading + readme[heading..].find(open)? + open.len();
    // An empty block (a README not filled yet) closes at once.
    let end = if readme[start..].starts_with("```") {
        start
    } else {
        start + readme[start..].find("\n```")?
    };
    Some((&readme[..start], &readme[start..end], &readme[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_after_the_heading_is_found() {
        let readme =
            "# x\n\n## Flags\n\nSome words.\n\n```text\nUsage: x\n\n  --a\n```\n\n## Test\n";
        let (before, block, after) = flags_block(readme).expect("found");
        assert_eq!(block, "Usage: x\n\n  --a");
        assert!(before.ends_with("```text\n") && after.starts_with("\n```\n\n## Test"));
        assert!(flags_block("# x\n\n```text\nUsage\n```\n").is_none());
        let (_, empty, after) = flags_block("# x\n## Flags\n\n```text\n```\n").expect("found");
        assert_eq!((empty, after), ("", "```\n"));
    }
}
