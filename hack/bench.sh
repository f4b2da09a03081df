#!/usr/bin/env bash
# Runs the benchmarks one after another (they share two cores) and prints
# their figures; copy them into BENCHMARKS.md with the machine they ran on.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr)"
cargo bench --workspace
