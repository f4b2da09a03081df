#!/usr/bin/env bash
# Prints the path of the cargo-nextest `make test` runs the tests with,
# built from crates.io on first use and cached (hack/cargo-tool.sh). It
# runs tests of several test binaries at once, where `cargo test` runs one
# binary after another and leaves a core idle whenever a binary is down to
# its last slow test. Without self-update: nothing here fetches releases
# from GitHub.
#
# Built unoptimised and without debug info: it only lists and spawns test
# processes (listing the workspace's 507 tests takes 2.2 s against 1.7 s
# optimised), and the build costs 200 s of CPU instead of about 540 s,
# which on a fresh machine is time every test waits for.
set -euo pipefail
CARGO_PROFILE_DEV_DEBUG=0 exec "$(dirname "$0")/cargo-tool.sh" cargo-nextest 0.9.151 \
  --debug --no-default-features --features default-no-update
