#!/usr/bin/env bash
# Builds the Go side of the kubeconfig fleet bench's request round
# (main.go, client-go pinned in go.mod) from the Go module proxy, cached as
# the test control plane is; prints the binary's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../go-tool.sh" client-go-requests .
