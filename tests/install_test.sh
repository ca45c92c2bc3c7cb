#!/usr/bin/env bash
# Installs Conveyor from the build tree into a temporary prefix, then builds and runs a separate
# user project that finds it with find_package(conveyor) and links conveyor::conveyor.
set -euo pipefail
build_dir="$1"
source_dir="$2"
torch_prefix="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >"$tmp/install.log"
cmake -S "$source_dir/tests/consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix;$torch_prefix" \
  >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" -j2 >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
"$tmp/build/app"
echo "installed package: found, linked and ran"
