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
