#!/usr/bin/env bash
# make demo: starts a local control plane, creates three namespaces with
# sample ConfigMaps, and runs examples/namespace against it until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/controlplane/build.sh >/dev/null
hack/ensure-tools.sh
cargo build -q -p multicluster-example-local-control-plane -p multicluster-example-namespace

work=$(mktemp -d)
kubeconfig="$work/kubeconfig"
cp_pid=""
cleanup() {
  if [ -n "$cp_pid" ] && kill -0 "$cp_pid" 2>/dev/null; then
    kill -TERM "$cp_pid" 2>/dev/null || true
    wait "$cp_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

target/debug/multicluster-example-local-control-plane --kubeconfig "$kubeconfig" &
cp_pid=$!
for _ in $(seq 1 600); do
  [ -s "$kubeconfig" ] && break
  kill -0 "$cp_pid" 2>/dev/null || { echo "the control plane failed to start" >&2; exit 1; }
  sleep 0.1
done
[ -s "$kubeconfig" ] || { echo "the control plane did not start within 60 s" >&2; exit 1; }
export KUBECONFIG="$kubeconfig"

for ns in demo-a demo-b demo-c; do
  kubectl create namespace "$ns" >/dev/null
  kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  labels:
    multicluster.example/sync: "true"
data:
  greeting: hello from $ns
  replicas: "3"
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: not-copied
data:
  note: no sync label, so the controller leaves it alone
YAML
done

cat <<MSG
Three namespaces (demo-a, demo-b, demo-c) are clusters of the fleet. Try, in another shell:
  export KUBECONFIG=$kubeconfig
  kubectl -n demo-b patch configmap settings --type merge -p '{"data":{"greeting":"changed"}}'
  kubectl -n demo-c delete configmap settings
  kubectl get configmaps -A -l '!multicluster.example/sync'
Metrics and cluster states: http://127.0.0.1:8081/metrics and /clusters. Ctrl-C stops everything.
MSG
status=0
target/debug/multicluster-example-namespace "$@" || status=$?
# 130: stopped by Ctrl-C, the normal way out.
[ "$status" -eq 0 ] || [ "$status" -eq 130 ] || exit "$status"
