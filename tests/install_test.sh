#!/usr/bin/env bash
# install_find_package: installs Conveyor from the build tree into a temporary prefix, then builds
# and runs a separate user project (tests/consumer) that finds it with find_package(conveyor),
# links conveyor::conveyor and includes only <conveyor/conveyor.h>: once per C++ standard, each in
# its own build directory.
# Usage: tests/install_test.sh BUILD_DIR SOURCE_DIR TORCH_PREFIX [STANDARDS]
#   STANDARDS: e.g. "17 20" (the default; also $CONVEYOR_CONSUMER_STANDARDS).
set -euo pipefail
build_dir="$1"
source_dir="$2"
torch_prefix="$3"
standards="${4:-${CONVEYOR_CONSUMER_STANDARDS:-17 20}}"
# A fixed folder inside the build tree, and the build's own compiler launcher (ccache, with its
# base folder): the consumer's compiles then hit the cache from one run, or one clone, to the next.
tmp="$build_dir/install-test"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; exit 1; }
# A detail header is installed only for the public headers that include it (templates): one that
# no installed header includes belongs in a library's src/, not in the package.
include_dir="$tmp/prefix/include"
for header in "$include_dir"/conveyor/detail/*.h; do
  name="conveyor/detail/$(basename "$header")"
  grep -rqF --include='*.h' "#include \"$name\"" "$include_dir" ||
    { echo "installed $name is included by no installed header" >&2; exit 1; }
done
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
launcher=$(sed -n 's/^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
for std in $standards; do
  build="$tmp/build-cxx$std"
  cmake -S "$source_dir/tests/consumer" -B "$build" -DCMAKE_CXX_STANDARD="$std" \
    ${compiler:+-DCMAKE_CXX_COMPILER="$compiler"} ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"} \
    -DCMAKE_PREFIX_PATH="$tmp/prefix;$torch_prefix" >"$tmp/configure.log" 2>&1 ||
    { cat "$tmp/configure.log"; echo "C++$std consumer: configure failed" >&2; exit 1; }
  cmake --build "$build" -j2 >"$tmp/build.log" 2>&1 ||
    { cat "$tmp/build.log"; echo "C++$std consumer: build failed" >&2; exit 1; }
  "$build/app"
done
echo "installed package: found, built as C++${standards// /, C++} with -Wall -Wextra -Werror, ran"
