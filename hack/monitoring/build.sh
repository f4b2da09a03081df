#!/usr/bin/env bash
# Builds hack/monitoring's checker (Prometheus's own PromQL parser and
# rule-file loader, at the version pinned in go.mod) into a cache directory
# outside the repository keyed by that version; a finished build is reused.
# Prints the binary's path on stdout.
#
#   MCR_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-~/.cache}/multicluster-runtime)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "github.com/prometheus/prometheus" { print $2; exit }' "$here/go.mod")
sum=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-12)
cache_root=${MCR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/multicluster-runtime}
out="$cache_root/monitoring-check/prometheus-${version}-${sum}"
if [ -x "$out/monitoring-check" ]; then
  echo "$out/monitoring-check"
  exit 0
fi
command -v go >/dev/null || { echo "go is not installed; it is needed to build the monitoring check" >&2; exit 1; }
echo "building the monitoring check (Prometheus ${version}) into $out" >&2
mkdir -p "$out"
scratch=$(mktemp -d "$out.partial.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
cd "$here"
go build -trimpath -ldflags "-s -w" -o "$scratch/monitoring-check" .
mv "$scratch/monitoring-check" "$out/monitoring-check"
echo "$out/monitoring-check"
