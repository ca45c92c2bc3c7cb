#!/usr/bin/env bash
# A libFuzzer target for a bounded time: configures a separate clang build (-DCONVEYOR_FUZZ=ON:
# ASan + UBSan, nothing else built), builds TARGET (default conveyor-jpeg-fuzz, issue 10; or
# conveyor-shard-fuzz, issue 13), writes its seed corpus and fuzzes for $FUZZ_SECONDS (default
# 60). Fails on any finding (crash, sanitizer report, leak, timeout, out-of-memory) and prints the
# reproducer's path.
# Per target, beside its source in tests/fuzz, each optional: TARGET.dict, a libFuzzer dictionary
# of its format's tokens; TARGET.options, more libFuzzer flags, one a line (# starts a comment);
# corpus/NAME/ (NAME: TARGET without conveyor- and -fuzz), the inputs that long runs found, fuzzed
# with the seeds (libFuzzer writes new inputs only to the run's own corpus, the first folder).
# Usage: fuzz_test.sh SOURCE_DIR FUZZ_BUILD_DIR [TARGET]
set -euo pipefail
src=$(cd "$1" && pwd)
build=$2
target=${3:-conveyor-jpeg-fuzz}
seconds=${FUZZ_SECONDS:-60}
mkdir -p "$build"
build=$(cd "$build" && pwd)

cd "$src"
BUILD_DIR="$build" scripts/configure -DCONVEYOR_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang
cmake --build "$build" --target "$target" -j "$(nproc)" >"$build/$target-build.log" 2>&1 ||
  { cat "$build/$target-build.log"; exit 1; }
fuzzer="$build/tests/fuzz/$target"

# A fresh corpus every run: the seeds only, so that the run is repeatable.
run="$build/ctest-run-$target"
rm -rf "$run"
mkdir -p "$run/corpus" "$run/artifacts"
"$fuzzer" --write-seeds "$run/corpus"
fuzz_dir="$src/tests/fuzz"
flags=()
[ -f "$fuzz_dir/$target.dict" ] && flags+=("-dict=$fuzz_dir/$target.dict")
if [ -f "$fuzz_dir/$target.options" ]; then
  while read -r flag _; do
    case "$flag" in '' | '#'*) ;; *) flags+=("$flag") ;; esac
  done <"$fuzz_dir/$target.options"
fi
corpora=("$run/corpus")
name=${target#conveyor-}
name=${name%-fuzz}
[ -d "$fuzz_dir/corpus/$name" ] && corpora+=("$fuzz_dir/corpus/$name")

status=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$run/artifacts/" "${flags[@]}" "${corpora[@]}" >"$run/fuzz.log" 2>&1 ||
  status=$?
grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$run/fuzz.log" || true
found=$(find "$run/artifacts" -type f)
if [ "$status" -ne 0 ] || [ -n "$found" ]; then
  tail -n 80 "$run/fuzz.log"
  echo "fuzz: FINDING (exit status $status); reproducer(s):"
  for f in $found; do echo "  $f   (replay: $fuzzer $f)"; done
  exit 1
fi
echo "fuzz: ${seconds}s, no finding ($(ls "$run/corpus" | wc -l) corpus files)"
