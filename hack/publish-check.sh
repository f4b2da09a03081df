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
# cargo verifies each crate against the packages it has just made, served
# from a local registry under target/package, and extracts them into
# $CARGO_HOME/registry/src/-<hash of that path>/. A clone at the same path
# that ran before left an extraction of the same name and version, which
# cargo reuses: the providers would be built against the old core. Remove
# the extracted copies of this workspace's packages first.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/multicluster-*
# Cargo also trusts what it built from a registry before and never rebuilds
# it when the source changes; in a reused target directory the providers
# would link the old core's build. Clean the core's artifacts (about half a
# minute of rebuilding).
cargo clean --quiet -p multicluster-runtime -p multicluster-envtest
cargo publish --workspace --dry-run "$@"
