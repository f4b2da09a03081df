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
    # Binary crates (the kubectl plugin) have no library to document.
    [ -f "$(dirname "$manifest")/src/lib.rs" ] || continue
    package=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | head -1)
    RUSTDOCFLAGS="-D warnings" cargo doc -p "$package" --no-deps --lib --quiet
done
# The core's optional parts (features health, kubeconfig, testing,
# opentelemetry) each build alone and without the others; the coordinators
# without sharding.
for features in "" health kubeconfig testing opentelemetry; do
    cargo clippy -p multicluster-runtime --lib \
        --no-default-features --features "$features" -- -D warnings
done
cargo clippy -p multicluster-coordinator --lib --no-default-features -- -D warnings
# No module of a crate imports from another in a circle.
python3 hack/module-cycles.py
# The monitoring check's Go source is formatted.
unformatted=$(gofmt -l hack/monitoring hack/controlplane hack/helm hack/kind hack/jaeger hack/krew hack/client-go-requests)
[ -z "$unformatted" ] || { echo "gofmt: $unformatted" >&2; exit 1; }
# The Helm chart, by the real helm (built from its Go module), with each
# provider and each way of sharing the work; nothing of the user's Helm
# configuration is read.
helm=$(hack/helm/build.sh)
helm_home=$(mktemp -d)
trap 'rm -rf "$helm_home"' EXIT
for provider in kubeconfig cluster-api cluster-inventory-api namespace; do
    for mode in "mode=leaderElection" "mode=sharding" "mode=single"; do
        HELM_CONFIG_HOME="$helm_home" HELM_CACHE_HOME="$helm_home" HELM_DATA_HOME="$helm_home" \
            "$helm" lint --strict --quiet charts/multicluster-controller \
            --set "provider=$provider,$mode,metrics.serviceMonitor.enabled=true"
    done
done
# The kubectl plugin's krew manifest, by krew's own validator (built from
# its Go module); installing needs the release's archives, so it is skipped.
krew_validate=$(hack/krew/build.sh)
"$krew_validate" -manifest crates/kubectl-mcr/krew/mcr.yaml -skip-install 2>/tmp/krew-validate.$$ \
    || { cat /tmp/krew-validate.$$ >&2; rm -f /tmp/krew-validate.$$; exit 1; }
rm -f /tmp/krew-validate.$$
