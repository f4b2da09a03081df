#!/usr/bin/env bash
# Builds helm (the release pinned in go.mod) from the Go module proxy, cached
# as the test control plane is; prints the binary's path. The chart's tests
# and `make lint` run it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "require" && $2 == "helm.sh/helm/v4" { print $3; exit }' "$here/go.mod")
exec "$here/../go-tool.sh" helm helm.sh/helm/v4/cmd/helm "-X helm.sh/helm/v4/internal/version.version=${version}"
