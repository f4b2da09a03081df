#!/usr/bin/env bash
# Runs every test in the workspace, then fails if any etcd or kube-apiserver
# process was left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
# kube-controller-manager shows as "kube-controller": process names are cut to 15 characters.
leftovers() { pgrep -x etcd || true; pgrep -x kube-apiserver || true; pgrep -x kube-controller || true; }
before=$(leftovers | sort)
status=0
# Benches are left to `make bench`: --all-targets would run them here too.
cargo test --workspace --no-fail-fast --lib --bins --tests --examples || status=$?
# Doc tests are not part of --all-targets.
cargo test --workspace --no-fail-fast --doc || status=$?
after=$(leftovers | sort)
left=$(comm -13 <(echo "$before") <(echo "$after") | sed '/^$/d')
if [ -n "$left" ]; then
  echo "control plane processes left behind by the tests:" >&2
  ps -o pid,args -p $(echo "$left" | tr '\n' ' ') >&2 || true
  status=1
fi
exit $status
