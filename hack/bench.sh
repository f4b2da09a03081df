#!/usr/bin/env bash
# Runs the benchmarks one after another (they share two cores) and prints
# their figures; copy them into BENCHMARKS.md with the machine they ran on.
#
# Sizes come from each benchmark's variable (FLEET_SIZES,
# KUBECONFIG_FLEET_SIZES, NAMESPACE_COUNTS, FILE_CONTEXTS,
# FAILOVER_CLUSTERS, SHARDING_CLUSTERS, PROPAGATION_MEMBERS,
# ROLLOUT_MEMBERS; see
# BENCHMARKS.md). QUICK=1 (make
# bench QUICK=1) sets the small sizes nobody set, for a run that only shows
# everything still works: about 15 minutes on two cores, most of it the
# fixed timings of the isolation, leader election and sharding benches
# (leases lapsing, a hung member waited out).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${QUICK:-}" = 1 ]; then
  export FLEET_SIZES="${FLEET_SIZES:-10}"
  export KUBECONFIG_FLEET_SIZES="${KUBECONFIG_FLEET_SIZES:-20}"
  export NAMESPACE_COUNTS="${NAMESPACE_COUNTS:-20}"
  export FILE_CONTEXTS="${FILE_CONTEXTS:-20}"
  export FAILOVER_CLUSTERS="${FAILOVER_CLUSTERS:-5}"
  export SHARDING_CLUSTERS="${SHARDING_CLUSTERS:-50}"
  export PROPAGATION_MEMBERS="${PROPAGATION_MEMBERS:-20}"
  export ROLLOUT_MEMBERS="${ROLLOUT_MEMBERS:-20}"
fi
# The Go side of the kubeconfig fleet's request round (client-go).
KUBECONFIG_FLEET_CLIENT_GO="${KUBECONFIG_FLEET_CLIENT_GO:-$(hack/client-go-requests/build.sh)}"
export KUBECONFIG_FLEET_CLIENT_GO
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"
cargo bench --workspace
