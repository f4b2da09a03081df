#!/usr/bin/env bash
# Builds cargo-nextest from crates.io (first run only, cached like the
# control plane) and prints the path of its binary. `make test` runs the
# workspace's tests with it: it runs tests of several test binaries at
# once, where `cargo test` runs one binary after another and leaves a core
# idle whenever a binary is down to its last slow test.
#
#   hack/nextest/build.sh
#   MCR_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-~/.cache}/multicluster-runtime)
set -euo pipefail
version=0.9.151
cache_root=${MCR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/multicluster-runtime}
tool="$cache_root/nextest/cargo-nextest-$version"
if [ ! -x "$tool/bin/cargo-nextest" ]; then
  echo "building cargo-nextest $version into $tool (first run only)" >&2
  # Without self-update: nothing here fetches releases from GitHub.
  mkdir -p "$(dirname "$tool")"
  partial=$(mktemp -d "$tool.partial.XXXXXX")
  trap 'rm -rf "$partial"' EXIT
  cargo install cargo-nextest --version "$version" --locked --no-default-features \
    --features default-no-update --root "$partial" --quiet
  rm -rf "$tool"
  mv "$partial" "$tool"
  trap - EXIT
fi
echo "$tool/bin/cargo-nextest"
