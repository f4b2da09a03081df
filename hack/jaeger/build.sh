#!/usr/bin/env bash
# Builds Jaeger (the release pinned in go.mod) from the Go module proxy,
# cached as the test control plane is; prints the binary's path. The trace
# tests export spans to it over OTLP and read them back from its query API.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../go-tool.sh" jaeger github.com/jaegertracing/jaeger/cmd/jaeger
