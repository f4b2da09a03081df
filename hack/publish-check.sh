#!/usr/bin/env bash
# Checks that every library crate would publish: `cargo publish --workspace
# --dry-run` packages each crate and builds it from its package alone, in
# dependency order, resolving the workspace's own crates from the packages
# (examples are publish = false and skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
# Libraries never pick a k8s-openapi version (only binaries do), so a
# crate built on its own has none, and k8s-openapi's build script refuses to
# build. A binary would choose one; here the variable stands in for it, with
# the version the workspace's tests use.
export K8S_OPENAPI_ENABLED_VERSION=1.35
cargo publish --workspace --dry-run "$@"
