#!/usr/bin/env bash
# Builds the test control plane binaries (etcd, kube-apiserver,
# kube-controller-manager, and kubectl for the tests that put `kubectl proxy`
# in front of a member) from the Go modules pinned in go.mod, into a cache
# directory outside the repository keyed by their versions. What is already
# built is reused. Prints the directory on stdout.
#
#   MCR_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-~/.cache}/multicluster-runtime)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$here/go.mod")
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' "$here/go.mod")
cache_root=${MCR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/multicluster-runtime}
out="$cache_root/controlplane/kubernetes-${k8s_version}-etcd-${etcd_version}"
kubernetes_commands=(kube-apiserver kube-controller-manager kubectl)
binaries=("${kubernetes_commands[@]}" etcd)

complete=yes
for b in "${binaries[@]}"; do [ -x "$out/$b" ] || complete=no; done
if [ "$complete" = yes ]; then
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "go is not installed; it is needed to build the test control plane" >&2; exit 1; }
echo "building Kubernetes ${k8s_version} and etcd ${etcd_version} into $out (first run only; takes several minutes)" >&2
mkdir -p "$out"
# Build into a scratch directory and move into place, so an interrupted build
# never leaves a half-populated cache that looks complete.
scratch=$(mktemp -d "$out.partial.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
cd "$here"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
missing=()
for b in "${kubernetes_commands[@]}"; do
  [ -x "$out/$b" ] || missing+=("k8s.io/kubernetes/cmd/$b")
done
[ ${#missing[@]} -eq 0 ] || go build -trimpath -ldflags "$ldflags" -o "$scratch/" "${missing[@]}"
[ -x "$out/etcd" ] || go build -trimpath -ldflags "-s -w" -o "$scratch/etcd" go.etcd.io/etcd/server/v3
for b in "${binaries[@]}"; do [ -x "$out/$b" ] || mv "$scratch/$b" "$out/$b"; done
echo "$out"
