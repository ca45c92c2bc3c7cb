#!/usr/bin/env bash
# A libFuzzer target for a bounded time: configures a separate clang build (-DCONVEYOR_FUZZ=ON:
# ASan + UBSan, nothing else built), builds TARGET (default conveyor-jpeg-fuzz, issue 10; or
# conveyor-shard-fuzz, issue 13), writes its seed corpus and fuzzes for $FUZZ_SECONDS (default
# 60). Fails on any finding (crash, sanitizer report, leak, timeout, out-of-memory) and prints the
# reproducer's path.
# Per target, where present (issue 29): tests/fuzz/TARGET.dict, a dictionary of the format's
# tokens; tests/fuzz/TARGET.options, libFuzzer flags in OSS-Fuzz's form ("[libfuzzer]", then
# "max_len = N" lines); tests/fuzz/corpus/TARGET/, inputs that long runs found, read beside the
# seeds. The run's seed is fixed, $FUZZ_SEED (default 1), so that CI repeats itself; a long run
# in a session takes FUZZ_SEED=0 (libFuzzer then draws one) and adds what it finds to the corpus.
# Usage: fuzz_test.sh SOURCE_DIR FUZZ_BUILD_DIR [TARGET]
set -euo pipefail
src=$(cd "$1" && pwd)
build=$2
target=${3:-conveyor-jpeg-fuzz}
seconds=${FUZZ_SECONDS:-60}
seed=${FUZZ_SEED:-1}
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
flags=()
[ -f "tests/fuzz/$target.dict" ] && flags+=(-dict="$src/tests/fuzz/$target.dict")
if [ -f "tests/fuzz/$target.options" ]; then
  while read -r flag; do flags+=("$flag"); done < <(sed -n 's/^ *\([a-z_]*\) *= *\([^ ]*\) *$/-\1=\2/p' \
    "tests/fuzz/$target.options")
fi
corpus=()
[ -d "tests/fuzz/corpus/$target" ] && corpus+=("$src/tests/fuzz/corpus/$target")

status=0
"$fuzzer" -max_total_time="$seconds" -seed="$seed" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "${flags[@]}" -artifact_prefix="$run/artifacts/" "$run/corpus" \
  "${corpus[@]}" >"$run/fuzz.log" 2>&1 || status=$?
grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$run/fuzz.log" || true
found=$(find "$run/artifacts" -type f)
if [ "$status" -ne 0 ] || [ -n "$found" ]; then
  tail -n 80 "$run/fuzz.log"
  echo "fuzz: FINDING (exit status $status); reproducer(s):"
  for f in $found; do echo "  $f   (replay: $fuzzer $f)"; done
  exit 1
fi
echo "fuzz: ${seconds}s, seed $seed, no finding ($(ls "$run/corpus" | wc -l) corpus files)"
