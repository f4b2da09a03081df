#!/usr/bin/env bash
# Builds helm (the release pinned in go.mod) from the Go module proxy into
# a cache directory outside the repository keyed by that version, as the
# test control plane is built; a finished build is reused. Prints the
# binary's path on stdout. The chart's tests and `make lint` run it.
#
#   MCR_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-~/.cache}/multicluster-runtime)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "require" && $2 == "helm.sh/helm/v4" { print $3; exit }' "$here/go.mod")
cache_root=${MCR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/multicluster-runtime}
out="$cache_root/helm/helm-${version}"
if [ -x "$out/helm" ]; then
  echo "$out/helm"
  exit 0
fi
command -v go >/dev/null || { echo "go is not installed; it is needed to build helm" >&2; exit 1; }
echo "building helm ${version} into $out (first run only; takes a few minutes)" >&2
mkdir -p "$out"
# Built into a scratch directory and moved into place: an interrupted build
# never leaves a binary that looks finished.
scratch=$(mktemp -d "$out.partial.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
cd "$here"
go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=${version}" -o "$scratch/helm" helm.sh/helm/v4/cmd/helm
mv "$scratch/helm" "$out/helm"
echo "$out/helm"
