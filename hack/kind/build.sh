#!/usr/bin/env bash
# Builds the kind CLI (the release pinned in go.mod) from the Go module
# proxy, cached as the test control plane is; prints the binary's path. The
# kind provider's tests run it against podman.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../go-tool.sh" kind sigs.k8s.io/kind
