#!/usr/bin/env bash
# Builds hack/monitoring's checker (Prometheus's own PromQL parser and
# rule-file loader, at the version pinned in go.mod) from the Go module
# proxy, cached as the test control plane is; prints the binary's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../go-tool.sh" monitoring .
