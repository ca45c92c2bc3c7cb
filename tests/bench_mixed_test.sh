#!/usr/bin/env bash
# conveyor-bench --compare all on the generated mixed dataset (gray, CMYK with and without the
# Adobe marker, YCCK, progressive and 4:4:4 among baseline photos): Conveyor and every reference
# finish with 0 errors. Then, with a truncated file added under --on-error skip, each reference
# counts its own errors and skips in the JSON.
set -euo pipefail
bench="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CONVEYOR_CACHE="$tmp/cache"
fail() { echo "FAIL: $*"; exit 1; }
refs="ceiling torch torch_fused naive"

"$bench" --dataset mixed --generate 50 --batch-size 8 --workers 2 --epochs 1 --rounds 1 \
  --compare all --json "$tmp/mixed.json" >"$tmp/stdout" 2>"$tmp/stderr" ||
  { cat "$tmp/stderr"; fail "--compare all exited non-zero on the mixed dataset"; }
cat "$tmp/stdout"
data=$(ls -d "$tmp"/cache/datasets/photos-mixed-*)
[ "$(find "$data" -name '*.jpg' | wc -l)" -eq 50 ] || fail "expected 50 files in $data"
# The mix is there: Adobe markers (CMYK, YCCK) and progressive frames (SOF2).
[ "$(LC_ALL=C grep -l -a 'Adobe' -r "$data" | wc -l)" -ge 2 ] || fail "no Adobe CMYK/YCCK files"
LC_ALL=C grep -l -a -P '\xff\xc2' -r "$data" >/dev/null || fail "no progressive files"
grep -q '"images": 50,' "$tmp/mixed.json" || fail "Conveyor did not deliver 50 images"
grep -q '"errors": 0,' "$tmp/mixed.json" || fail "Conveyor reported errors"
for r in $refs; do
  grep -q "\"${r}_images_per_s\"" "$tmp/mixed.json" || fail "JSON lacks ${r}_images_per_s"
  grep -q "\"${r}_errors\": 0," "$tmp/mixed.json" || fail "$r reported errors: $(cat "$tmp/mixed.json")"
  grep -q "\"${r}_skipped\": 0," "$tmp/mixed.json" || fail "$r skipped files"
done

# One truncated file among them: under skip every run counts it and still finishes.
mkdir -p "$tmp/bad/a"
cp "$data"/class_000/*.jpg "$tmp/bad/a/"
head -c 3000 "$data/class_000/img_000000.jpg" >"$tmp/bad/a/truncated.jpg"
"$bench" --data "$tmp/bad" --batch-size 2 --workers 2 --epochs 1 --rounds 1 --compare all \
  --on-error skip --json "$tmp/skip.json" >"$tmp/stdout" 2>"$tmp/stderr" ||
  fail "--on-error skip failed: $(cat "$tmp/stderr")"
grep -q '"skipped": 1,' "$tmp/skip.json" || fail "Conveyor's skip not counted"
for r in $refs; do
  grep -q "\"${r}_errors\": [1-9]" "$tmp/skip.json" || fail "$r errors not counted: $(cat "$tmp/skip.json")"
  grep -q "\"${r}_skipped\": [1-9]" "$tmp/skip.json" || fail "$r skips not counted"
done
echo "conveyor-bench mixed dataset: all checks passed"
