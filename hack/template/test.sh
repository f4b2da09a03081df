#!/usr/bin/env bash
# Generates a project from templates/fleet-controller with the real
# cargo-generate (built from crates.io once, cached like the control
# plane; 0.23.7 is the newest whose locked dependencies build with this
# machine's Rust 1.95: 0.25 and 0.26 lock crates that need 1.96 and 1.97), once per provider the template offers, against this checkout's
# crates, and runs each project's own test (real control planes).
#
#   hack/template/test.sh
#   MCR_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-~/.cache}/multicluster-runtime)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
version=0.23.7
# Without its default features: no git (the template is a local path
# here), so no HTTP client or git stack to build.
generate=$("$root/hack/cargo-tool.sh" cargo-generate "$version" --no-default-features)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for provider in kubeconfig namespace; do
  name="fleet-$provider"
  "$generate" generate --path "$root/templates/fleet-controller" \
    --name "$name" --destination "$scratch" --vcs none --silent \
    --define "provider=$provider" --define "mcr_path=$root"
  echo "template: testing $name (provider $provider)" >&2
  # Its own target directory under this checkout's: the generated projects
  # share their dependencies' builds, and `cargo clean` removes them.
  # The generated code is formatted and clippy-clean as it comes; its
  # warnings are errors (dependencies' are capped).
  (
    cd "$scratch/$name"
    export CARGO_TARGET_DIR="$root/target/template" CARGO_PROFILE_DEV_DEBUG=line-tables-only
    cargo fmt --check
    cargo clippy --quiet --all-targets -- -D warnings
    RUSTFLAGS="-D warnings" cargo test --quiet
  )
done
