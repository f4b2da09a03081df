#!/usr/bin/env bash
# Formatting, clippy and the libraries' rustdoc (broken links, bad HTML),
# warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# With the whole workspace selected, the examples pick the k8s-openapi
# version the libraries need to build.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib --quiet
# The core's optional parts (features health, sharding, testing) each build
# alone and without the others. One package alone has no binary to pick the
# k8s-openapi version, so it is given here.
for features in "" health sharding testing; do
    K8S_OPENAPI_ENABLED_VERSION=1.35 cargo clippy -p multicluster-runtime --lib \
        --no-default-features --features "$features" -- -D warnings
done
