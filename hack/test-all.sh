#!/usr/bin/env bash
# Runs every test in the workspace, then fails if any etcd, kube-apiserver,
# kube-controller-manager or kubectl that this run started is still running.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every process the tests start inherits this variable, whatever becomes of
# its parent, so the processes this run left behind are told apart from
# control planes other programs run on the machine meanwhile.
export MCR_TEST_RUN="test-all-$$-$(date +%s%N)"
# kube-controller-manager shows as "kube-controller": process names are cut to 15 characters.
leftovers() {
  for pid in $(pgrep -x etcd; pgrep -x kube-apiserver; pgrep -x kube-controller; pgrep -x kubectl); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "MCR_TEST_RUN=$MCR_TEST_RUN"; then
      echo "$pid"
    fi
  done
}
status=0
# cargo-nextest runs tests of several binaries at once (.config/nextest.toml
# says how many), each in a process of its own; `make test` builds it.
nextest=$(hack/nextest.sh)
# Benches are left to `make bench`: --all-targets would run them here too.
"$nextest" nextest run --workspace --lib --bins --tests --examples || status=$?
# Doc tests: nextest does not run them.
cargo test --workspace --no-fail-fast --doc || status=$?
left=$(leftovers)
if [ -n "$left" ]; then
  echo "control plane processes left behind by the tests:" >&2
  ps -o pid,args -p $(echo "$left" | tr '\n' ' ') >&2 || true
  status=1
fi
exit $status
