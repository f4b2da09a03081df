#!/usr/bin/env bash
# Installs a command from crates.io (`cargo install --locked`, the version
# pinned by the caller) into a cache directory outside the repository, and
# prints the path of its binary; a finished install is reused, so it is
# built once per machine (cargo-nextest for `make test`, cargo-generate for
# `make template`).
#
#   hack/cargo-tool.sh <crate> <version> [more `cargo install` options]
#   MCR_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-~/.cache}/multicluster-runtime)
set -euo pipefail
crate=$1 version=$2
shift 2
cache_root=${MCR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/multicluster-runtime}
tool="$cache_root/$crate/$crate-$version"
if [ ! -x "$tool/bin/$crate" ]; then
  echo "building $crate $version into $tool (first run only)" >&2
  mkdir -p "$(dirname "$tool")"
  # Installed into a scratch directory and moved into place: an interrupted
  # build never leaves a binary that looks finished.
  partial=$(mktemp -d "$tool.partial.XXXXXX")
  trap 'rm -rf "$partial"' EXIT
  cargo install "$crate" --version "$version" --locked --root "$partial" --quiet "$@"
  rm -rf "$tool"
  mv "$partial" "$tool"
  trap - EXIT
fi
echo "$tool/bin/$crate"
