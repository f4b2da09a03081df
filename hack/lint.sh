#!/usr/bin/env bash
# Formatting, clippy and the libraries' rustdoc (broken links, bad HTML),
# warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib --quiet
# Each library documents alone too, as `cargo doc -p <crate>` on a fresh
# clone does (.cargo/config.toml names the k8s-openapi version then).
for manifest in crates/*/Cargo.toml providers/*/Cargo.toml; do
    package=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | head -1)
    RUSTDOCFLAGS="-D warnings" cargo doc -p "$package" --no-deps --lib --quiet
done
# The core's optional parts (features health, testing) each build alone and
# without the others; the coordinators without sharding.
for features in "" health kubeconfig testing; do
    cargo clippy -p multicluster-runtime --lib \
        --no-default-features --features "$features" -- -D warnings
done
cargo clippy -p multicluster-coordinator --lib --no-default-features -- -D warnings
# No module of a crate imports from another in a circle.
python3 hack/module-cycles.py
# The monitoring check's Go source is formatted.
unformatted=$(gofmt -l hack/monitoring hack/controlplane)
[ -z "$unformatted" ] || { echo "gofmt: $unformatted" >&2; exit 1; }
