#!/usr/bin/env bash
# scripts/gpu-check run's verdicts, with stand-ins for the carried binaries (scripts that print
# what gtest, conveyor-bench, pytest and compute-sanitizer print), so that every outcome the GPU
# machine can give is checked here in seconds: what it leaves under $OUT (what the device tool
# brings back: at most 8 files, at most 2 folders down, plain names), a step cut by its limit
# (SKIPPED (deadline), exit 0), a failing or crashing test (exit 1), skips counted by reason and,
# on a machine with a GPU, a skip saying GPU decode or CUDA could not start as a PROBLEM line,
# memcheck's filter, leak check and "not supported", why the Python step did not run, and the
# SQLite bench's figures (issue 36).
# `scripts/gpu-check prove` runs the real binaries (DEVICE=cpu in a minimal Debian root).
#   tests/gpu_check_test.sh SCRIPT     (SCRIPT: scripts/gpu-check)
set -uo pipefail
script=$(realpath "${1:?usage: gpu_check_test.sh SCRIPT}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# A repository with the script and a carried folder of stand-ins.
repo=$tmp/repo
carry=$repo/build-gpu-carry
mkdir -p "$repo/scripts" "$carry/bin" "$carry/lib" "$carry/scripts" "$carry/python" "$tmp/path"
cp "$script" "$repo/scripts/gpu-check"
tar -C "$carry" -cJf "$carry/lib.tar.xz" lib && rm -rf "$carry/lib"
echo 0000000 >"$carry/commit"

# gtest_standin FILE CASE...: a test binary printing gtest's lines for each CASE, NAME:RESULT[:WHY]
# with RESULT ok, fail, skip (WHY: the GTEST_SKIP message), hang (the test never ends) or crash.
gtest_standin() {
  local file=$1
  shift
  {
    echo '#!/usr/bin/env bash'
    echo 'echo "[==========] Running $# tests."'
    local c name result why
    for c in "$@"; do
      name=${c%%:*}
      result=${c#*:}
      why=${result#*:}
      result=${result%%:*}
      echo "echo '[ RUN      ] $name'"
      case $result in
        ok) echo "echo '[       OK ] $name (1 ms)'" ;;
        fail) echo "echo 'x.cpp:1: Failure'; echo '[  FAILED  ] $name (1 ms)'; failed=1" ;;
        skip) printf "echo 'x.cpp:2: Skipped'; echo '%s'; echo; echo '[  SKIPPED ] %s (0 ms)'\n" "$why" "$name" ;;
        hang) echo "sleep 60" ;;
        crash) echo 'kill -SEGV $$' ;;
      esac
    done
    echo 'echo "[==========] done."'
    echo 'exit ${failed:-0}'
  } >"$file"
  chmod +x "$file"
}

# The healthy carried folder: every binary run knows, tests that pass or skip as on a machine
# without a GPU.
healthy() {
  rm -f "$carry"/bin/*
  local t
  for t in loader_gpu_test pinned_test prefetch_test copy_stage_test torch_data_errors_test \
    gpudecode_test gpu_decode_loader_test; do
    gtest_standin "$carry/bin/$t" "$t.Works:ok" "Completion/LoaderGpu.OnTheGpu/HostCallback:skip:no usable CUDA device: none here"
  done
  for t in loader_gpu_test gpu_decode_loader_test copy_stage_test loader_test engine_parts_test \
    alloc_failure_test; do
    gtest_standin "$carry/bin/$t.debug" "$t.WorksInDebug:ok"
  done
  gtest_standin "$carry/bin/gpudecode_gpu_test" \
    "GpuDecode.A:skip:GPU decode unavailable: libnvjpeg.so.13 could not create the hardware backend" \
    "GpuDecode.B:skip:GPU decode unavailable: libnvjpeg.so.13 could not create the hardware backend" \
    "GpuDecode.C:skip:needs two GPUs; this machine has one"
  cat >"$carry/bin/conveyor-bench" <<'EOF'
#!/usr/bin/env bash
echo "conveyor-bench: dataset /tmp/gpu-check-test-photos" >&2
json=""
while (($#)); do [ "$1" = --json ] && json=$2; shift; done
echo "conveyor 1000.0 img/s x 1.10x"
[ -z "$json" ] || echo '{"h2d_gb_per_s": 50.5, "overlap_ratio": 0.9}' >"$json"
EOF
  printf '#!/usr/bin/env bash\necho "gpu: 100 images/s"\n' >"$carry/bin/gpudecode-bench"
  printf '#!/usr/bin/env bash\necho "BM_Engine 1 ns"\n' >"$carry/bin/engine-bench"
  printf '#!/usr/bin/env bash\necho "[rank 0] coverage ok cuda:0"\necho "[rank 1] coverage ok cuda:0"\n' \
    >"$carry/scripts/ddp-run"
  printf '#!/usr/bin/env bash\nexit 0\n' >"$carry/bin/ddp_train"
  chmod +x "$carry"/bin/* "$carry/scripts/ddp-run"
}

# check VAR=VALUE... -- EXPECTED_EXIT: runs `run` with those variables and stand-ins first on PATH
# (no python3 with torch unless a test puts one there), into $tmp/out; sets $summary.
summary=""
check() {
  local vars=()
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  local expected=$2 rc=0
  rm -rf "$tmp/out"
  env -i PATH="$tmp/path:/usr/bin:/bin" HOME="$tmp" TMPDIR="$tmp" TORCH_LIBS=/nonexistent \
    OUT="$tmp/out" "${vars[@]}" bash "$repo/scripts/gpu-check" run >"$tmp/stdout" 2>&1 || rc=$?
  summary=$(cat "$tmp/out/summary.txt" 2>/dev/null)
  if [ "$rc" != "$expected" ]; then
    fail "run with ${vars[*]}: exit $rc, expected $expected; it printed:"
    sed 's/^/    /' "$tmp/stdout"
  fi
}
has() {
  grep -qE -- "$2" <<<"$summary" || { fail "$1: no line matching '$2' in the summary:"; sed 's/^/    /' <<<"$summary"; }
}
hasnt() {
  ! grep -qE -- "$2" <<<"$summary" || fail "$1: a line matching '$2' in the summary: $(grep -E -- "$2" <<<"$summary")"
}
# python3 that has no torch: the Python step and torch's libraries are not looked for there.
printf '#!/usr/bin/env bash\nexit 1\n' >"$tmp/path/python3"
chmod +x "$tmp/path/python3"

# 1. A whole run without a GPU: exit 0, and every file under $OUT comes back.
healthy
check DEVICE=cpu -- 0
has "a healthy run" 'done: every step that ran passed'
files=$(cd "$tmp/out" 2>/dev/null && find . -mindepth 1 | sed 's|^\./||')
[ "$(cd "$tmp/out" && find . -type f | wc -l)" -le 8 ] ||
  fail "more than 8 files under \$OUT (the device tool brings back 8): $(echo $files)"
while read -r f; do
  [[ $f =~ ^([A-Za-z0-9._-]+/){0,2}[A-Za-z0-9._-]+$ ]] || fail "under \$OUT, not brought back: '$f'"
  [ ! -L "$tmp/out/$f" ] || fail "under \$OUT, a link: $f"
done <<<"$files"
has "the summary names its files" '\] out: .*summary.txt'
grep -q '"conveyor_bench": {"h2d_gb_per_s"' "$tmp/out/bench.json" 2>/dev/null &&
  grep -q '"gpu_decode_hw_only": {' "$tmp/out/bench.json" ||
  fail "bench.json does not hold every benchmark's JSON: $(cat "$tmp/out/bench.json" 2>/dev/null)"
has "the Debug list" 'tests \(Debug\) loader_gpu_test.debug: ok'
has "skips are counted with their reason" 'gpudecode_gpu_test: 2 skipped: GPU decode unavailable: libnvjpeg.so.13 could not create the hardware backend \(e.g. GpuDecode.A\)'
hasnt "without a GPU, GPU decode's skips are expected" 'PROBLEM:'
has "the limits add up to the deadline" 'deadline 385 s'

# 2. A step cut by its limit: SKIPPED (deadline), the run still green, and soon over.
healthy
gtest_standin "$carry/bin/gpudecode_gpu_test" "GpuDecode.A:ok" "GpuDecode.Slow:hang" "GpuDecode.C:ok"
start=$SECONDS
check DEVICE=cpu GPU_CHECK_STEPS=tests GPU_CHECK_STEP_LIMIT_tests=5 DEADLINE=100 -- 0
has "a test cut by the step's limit" 'tests gpudecode_gpu_test: SKIPPED \(deadline\); 1 passed, 0 failed, 0 skipped; cut while running GpuDecode.Slow'
has "the binaries after it in the step" 'tests gpu_decode_loader_test: SKIPPED \(deadline\)'
has "a cut run is green" 'done: every step that ran passed; [1-9][0-9]* cut by the deadline'
hasnt "no step failed" 'FAILED'
((SECONDS - start < 25)) || fail "the cut run took $((SECONDS - start)) s for a 5 s limit"
printf '#!/usr/bin/env bash\nsleep 60\n' >"$carry/bin/conveyor-bench"
check DEVICE=cpu GPU_CHECK_STEPS=bench,gpudecode_bench GPU_CHECK_STEP_LIMIT_bench=3 DEADLINE=100 -- 0
has "a benchmark cut by its limit" 'conveyor-bench: SKIPPED \(deadline\)'
has "the next step runs in its own time" 'gpudecode-bench: ok'
check DEVICE=cpu GPU_CHECK_STEPS=bench,gpudecode_bench DEADLINE=2 -- 0
has "a step past the run's deadline" 'gpudecode_bench: SKIPPED \(deadline'

# 3. A test that fails, or a binary that crashes, makes the run red.
healthy
gtest_standin "$carry/bin/pinned_test" "Pinned.A:ok" "Pinned.B:fail" "Pinned.C:skip:why not"
check DEVICE=cpu GPU_CHECK_STEPS=tests -- 1
has "a failing test" 'tests pinned_test: FAILED, exit 1 \(1 passed, 1 failed, 1 skipped\)'
has "a red run's last line" 'done: FAILED'
healthy
gtest_standin "$carry/bin/prefetch_test" "Prefetch.A:ok" "Prefetch.Crashes:crash"
check DEVICE=cpu GPU_CHECK_STEPS=tests -- 1
has "a crash names the test" 'tests prefetch_test: FAILED, exit [0-9]+ \(1 passed, 0 failed, 0 skipped; ended while running Prefetch.Crashes\)'

# 4. On a machine with a GPU: GPU decode or CUDA that could not start is a PROBLEM, other skips
# are counted; memcheck runs the named tests without the caching allocator, or says it is not
# supported.
healthy
cat >"$tmp/path/compute-sanitizer" <<EOF
#!/usr/bin/env bash
echo "\$PYTORCH_NO_CUDA_MEMORY_CACHING \$*" >>"$tmp/sanitizer-calls"
echo "========= COMPUTE-SANITIZER"
echo "========= Error: Device not supported"
exit 1
EOF
chmod +x "$tmp/path/compute-sanitizer"
rm -f "$tmp/sanitizer-calls"
check DEVICE=cuda GPU_CHECK_STEPS=tests,memcheck -- 0
has "GPU decode's backend could not start" 'PROBLEM: gpudecode_gpu_test: 2 tests skipped on a machine with a GPU: GPU decode unavailable: libnvjpeg.so.13 could not create the hardware backend'
has "CUDA could not start" 'PROBLEM: loader_gpu_test: 1 tests skipped on a machine with a GPU: no usable CUDA device'
hasnt "an expected skip is no problem" 'PROBLEM: .*needs two GPUs'
has "an expected skip is counted" 'gpudecode_gpu_test: 1 skipped: needs two GPUs; this machine has one'
has "memcheck refused" 'memcheck: not supported on this machine.s runtime \(========= Error: Device not supported\)'
has "problems are counted in the last line" 'done: every step that ran passed; 0 cut by the deadline \(SKIPPED \(deadline\)\); [1-9][0-9]* PROBLEM lines'
cat >"$tmp/path/compute-sanitizer" <<EOF
#!/usr/bin/env bash
echo "\$PYTORCH_NO_CUDA_MEMORY_CACHING \$*" >>"$tmp/sanitizer-calls"
echo "========= COMPUTE-SANITIZER"
while [[ \$1 == --* ]]; do [ "\$1" = --tool ] || [ "\$1" = --leak-check ] || [ "\$1" = --error-exitcode ] && shift; shift; done
"\$@"
echo "========= ERROR SUMMARY: 0 errors"
EOF
rm -f "$tmp/sanitizer-calls"
check DEVICE=cuda GPU_CHECK_STEPS=memcheck -- 0
has "memcheck of the named tests" 'memcheck loader_gpu_test: ok \(1 passed; ERROR SUMMARY: 0 errors\)'
calls=$(cat "$tmp/sanitizer-calls" 2>/dev/null)
grep -q 'loader_gpu_test' <<<"$calls" || fail "memcheck did not run loader_gpu_test: $calls"
! grep -v '^1 --tool memcheck --leak-check full ' <<<"$calls" | grep -q . ||
  fail "memcheck without the caching allocator off and the leak check: $(grep -v '^1 --tool memcheck --leak-check full ' <<<"$calls")"
! grep -q 'AFailed\|Sticky\|LaunchError\|CudaError\|Corrupt\|gtest_filter=\*$\|gtest_filter=-' <<<"$calls" ||
  fail "memcheck runs a test that makes a CUDA error on purpose, or every test: $calls"
printf '#!/usr/bin/env bash\necho "========= ERROR SUMMARY: 2 errors"\nexit 3\n' >"$tmp/path/compute-sanitizer"
check DEVICE=cuda GPU_CHECK_STEPS=memcheck -- 1
has "memcheck's errors" 'memcheck loader_gpu_test: FAILED, exit 3 \(0 passed; ERROR SUMMARY: 2 errors\)'
rm -f "$tmp/path/compute-sanitizer"

# 5. Python: where the carried folder has no package for python3's version, the summary says
# which it has and why; where it has one, pytest's skips are counted, and on a GPU a skip that
# says CUDA is not usable is a PROBLEM.
cat >"$tmp/path/python3" <<'EOF'
#!/usr/bin/env bash
[ "$1" = -c ] && { echo cp312; exit 0; }
echo "PYTHONPATH=$PYTHONPATH"
echo "ss.                                                [100%]"
echo "SKIPPED [2] tests/python/test_cuda.py:24: no usable CUDA device here: the CUDA path needs a GPU"
echo "1 passed, 2 skipped in 0.50s"
EOF
chmod +x "$tmp/path/python3"
mkdir -p "$carry/python/cp311/conveyor"
echo "no CPython 3.12 with its headers was found when the folder was packed" >"$carry/python/cp312.missing"
check DEVICE=cuda GPU_CHECK_STEPS=python -- 0
has "why the Python step did not run" 'python: skipped \(python3 here is cp312; the carried folder has the package for: cp311; no CPython 3.12 with its headers was found'
rm "$carry/python/cp312.missing"
mkdir -p "$carry/python/cp312/conveyor"
check DEVICE=cuda GPU_CHECK_STEPS=python -- 0
has "the Python tests" 'python tests \(test_cuda.py, cp312\): ok \(1 passed, 2 skipped in 0.50s\)'
has "pytest's skips" 'python: 2 skipped: no usable CUDA device here'
has "CUDA not usable from Python on a GPU" 'PROBLEM: python: 2 tests skipped on a machine with a GPU'
grep -q "PYTHONPATH=build-gpu-carry/python/cp312" "$tmp/out/python.log" ||
  fail "pytest did not get the carried cp312 package: $(cat "$tmp/out/python.log")"

# 6. The SQLite bench (issue 36), when GPU_CHECK_STEPS names it: bench.py --sqlite with the carried
# package, $WORKERS workers against 1 and against ImageFolder, its row and ratios in the summary;
# a bench that fails makes the run red.
cat >"$tmp/path/python3" <<'EOF'
#!/usr/bin/env bash
[ "$1" = -c ] && { echo cp312; exit 0; }
echo "PYTHONPATH=$PYTHONPATH ARGS $*"
echo "conveyor-sqlite             16     7012.5             31      0.412"
echo "conveyor-sqlite@1            1      601.0             28      0.046"
echo "conveyor-sqlite / conveyor-folder            0.950x  target >= 0.9x  (rounds: 0.950)"
echo "conveyor-sqlite / conveyor-sqlite@1          11.668x  (rounds: 11.668)"
exit "${SQLITE_BENCH_EXIT:-0}"
EOF
check DEVICE=cuda GPU_CHECK_STEPS=sqlite_bench -- 0
has "the SQLite bench's figures" 'sqlite bench: ok \(conveyor-sqlite 16 7012.5 31 0.412;conveyor-sqlite / conveyor-folder 0.950x target >= 0.9x \(rounds: 0.950\);conveyor-sqlite / conveyor-sqlite@1 11.668x'
grep -q "PYTHONPATH=build-gpu-carry/python/cp312 ARGS bench/python/bench.py --sqlite --sqlite-images 2000 --workers 16 .*--loaders conveyor-sqlite,conveyor-sqlite@1,conveyor-folder" "$tmp/out/python.log" ||
  fail "the SQLite bench did not run as expected: $(cat "$tmp/out/python.log")"
check DEVICE=cuda GPU_CHECK_STEPS=sqlite_bench SQLITE_BENCH_EXIT=1 -- 1
has "a failing SQLite bench" 'sqlite bench: FAILED, exit 1'

if [ "$failures" -ne 0 ]; then
  echo "gpu_check_test: $failures checks failed"
  exit 1
fi
echo "gpu_check_test: every check passed"
