#!/usr/bin/env bash
# conveyor-bench as a user runs it: generates its dataset, prints a throughput, writes the JSON
# fields it promises, says when there is no GPU, and applies --on-error to a bad file.
set -euo pipefail
bench="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CONVEYOR_CACHE="$tmp/cache"
fail() { echo "FAIL: $*"; exit 1; }

"$bench" --generate 20 --batch-size 8 --workers 2 --epochs 1 --compare ceiling \
  --json "$tmp/out.json" >"$tmp/stdout" 2>"$tmp/stderr" || { cat "$tmp/stderr"; fail "bench exited non-zero"; }
grep -q "images/s" "$tmp/stdout" || fail "no throughput printed"
for key in images_per_s images epochs batch_size workers errors skipped ceiling_images_per_s; do
  grep -q "\"$key\"" "$tmp/out.json" || fail "JSON lacks $key"
done
grep -q '"images": 20,' "$tmp/out.json" || fail "expected 20 images: $(cat "$tmp/out.json")"
if grep -q '"cuda_available": false' "$tmp/out.json"; then
  grep -q "CPU only" "$tmp/stdout" || fail "no GPU here, but the bench did not say it ran on the CPU"
fi
ls "$tmp"/cache/datasets/*/class_000/*.jpg >/dev/null || fail "dataset not generated in the cache"

# A bad file: under raise the bench fails naming it; under skip it is counted.
mkdir -p "$tmp/bad/a"
cp "$tmp"/cache/datasets/*/class_000/*.jpg "$tmp/bad/a/"
head -c 3000 "$(ls "$tmp"/cache/datasets/*/class_001/*.jpg | head -1)" >"$tmp/bad/a/truncated.jpg"
if "$bench" --data "$tmp/bad" --batch-size 2 --workers 2 --epochs 1 >"$tmp/stdout" 2>"$tmp/stderr"; then
  fail "--on-error raise (the default) exited 0 with a truncated file"
fi
grep -q "truncated.jpg" "$tmp/stderr" || fail "error does not name the file: $(cat "$tmp/stderr")"
"$bench" --data "$tmp/bad" --batch-size 2 --workers 2 --epochs 1 --on-error skip \
  --json "$tmp/skip.json" >"$tmp/stdout" 2>"$tmp/stderr" || fail "--on-error skip failed: $(cat "$tmp/stderr")"
grep -q '"skipped": 1,' "$tmp/skip.json" || fail "skip not counted: $(cat "$tmp/skip.json")"
echo "conveyor-bench CLI: all checks passed"
