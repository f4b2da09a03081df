#!/usr/bin/env bash
# Builds one command of a Go module pinned in hack/<tool>/go.mod (helm,
# kind, the monitoring check) with the installed Go toolchain from the Go
# module proxy, into a cache directory outside the repository keyed by the
# tool, its go.mod, go.sum and Go files; a finished build is reused. Prints
# the binary's path on stdout.
#
#   hack/go-tool.sh <tool> <package> [ldflags]
#   MCR_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-~/.cache}/multicluster-runtime)
set -euo pipefail
tool=$1 package=$2 ldflags=${3:-}
here=$(cd "$(dirname "$0")/$tool" && pwd)
sum=$(cat "$here/go.mod" "$here/go.sum" "$here"/*.go | sha256sum | cut -c1-12)
cache_root=${MCR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/multicluster-runtime}
out="$cache_root/$tool/$tool-$sum"
if [ -x "$out/$tool" ]; then
  echo "$out/$tool"
  exit 0
fi
command -v go >/dev/null || { echo "go is not installed; it is needed to build $tool" >&2; exit 1; }
echo "building $tool ($package, pinned in hack/$tool/go.mod) into $out (first run only)" >&2
mkdir -p "$out"
# Built into a scratch directory and moved into place: an interrupted build
# never leaves a binary that looks finished.
scratch=$(mktemp -d "$out.partial.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
cd "$here"
go build -trimpath -ldflags "-s -w $ldflags" -o "$scratch/$tool" "$package"
mv "$scratch/$tool" "$out/$tool"
echo "$out/$tool"
