#!/usr/bin/env bash
# Builds krew's manifest validator (the release pinned in go.mod) from the
# Go module proxy, cached as the test control plane is; prints the binary's
# path. `make lint` checks crates/kubectl-mcr/krew/mcr.yaml with it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../go-tool.sh" krew sigs.k8s.io/krew/cmd/validate-krew-manifest
