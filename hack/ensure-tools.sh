#!/usr/bin/env bash
# Installs command-line tools the tests use when they are missing, from
# Debian's packages: kubectl (kubernetes-client); podman, runc and a static
# busybox for the kind provider's node containers (kind's own node image
# cannot be pulled here, so the tests make nodes of their own). Needs root
# for apt-get.
set -euo pipefail
missing=()
command -v kubectl >/dev/null || missing+=(kubernetes-client)
command -v podman >/dev/null || missing+=(podman)
# crun, podman's default runtime, refuses hybrid cgroup hierarchies.
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/bin/busybox ] && file_is_static=$(ldd /usr/bin/busybox 2>&1 | grep -c "not a dynamic" || true) || file_is_static=0
[ "$file_is_static" -gt 0 ] || missing+=(busybox-static)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing: ${missing[*]}; install them (apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
