#!/usr/bin/env bash
# Prints the path of the cargo-nextest `make test` runs the tests with,
# built from crates.io on first use and cached (hack/cargo-tool.sh). It
# runs tests of several test binaries at once, where `cargo test` runs one
# binary after another and leaves a core idle whenever a binary is down to
# its last slow test. Without self-update: nothing here fetches releases
# from GitHub.
set -euo pipefail
exec "$(dirname "$0")/cargo-tool.sh" cargo-nextest 0.9.151 \
  --no-default-features --features default-no-update
