#!/usr/bin/env bash
# Installs command-line tools the tests use when they are missing: kubectl
# (Debian package kubernetes-client). Needs root for apt-get.
set -euo pipefail
if ! command -v kubectl >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "kubectl is missing; install it (e.g. apt-get install kubernetes-client)" >&2
    exit 1
  fi
  echo "installing kubectl (kubernetes-client)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
fi
