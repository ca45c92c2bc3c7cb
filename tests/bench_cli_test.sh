#!/usr/bin/env bash
# conveyor-bench as a user runs it: generates its dataset, prints a throughput, writes the JSON
# fields it promises, says when there is no GPU, applies --on-error to a bad file, and reads tar
# shards (made by conveyor-prepare, found beside the bench: build/tools/) with a folder reference,
# reads a shard named like a pipe: command as the file it is, and runs --workers auto.
set -euo pipefail
bench="$1"
python="${2:-python3}"  # a Python with matplotlib: the one conveyor-bench --plot runs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CONVEYOR_CACHE="$tmp/cache"
fail() { echo "FAIL: $*"; exit 1; }

"$bench" --generate 20 --batch-size 8 --workers 2 --epochs 1 --compare ceiling \
  --json "$tmp/out.json" --plot "$tmp/plot.svg" >"$tmp/stdout" 2>"$tmp/stderr" ||
  { cat "$tmp/stderr"; fail "bench exited non-zero"; }
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

# Tar shards as --data, the folder they were made from as --reference-data: the table and the JSON
# name each run's source, and the ceiling reads the folder.
prepare="$(dirname "$bench")/../tools/conveyor-prepare"
[ -x "$prepare" ] || fail "no conveyor-prepare at $prepare (it is built beside conveyor-bench)"
folder=$(dirname "$(ls -d "$tmp"/cache/datasets/*/class_000)")
"$prepare" "$folder" "$tmp/wds/train" --format wds --shard-size 500K >/dev/null 2>"$tmp/stderr" ||
  fail "conveyor-prepare failed: $(cat "$tmp/stderr")"
shards=$(ls "$tmp"/wds/train-*.tar | wc -l)
[ "$shards" -ge 2 ] || fail "expected several shards, got $shards"
pattern="$tmp/wds/train-{000000..$(printf '%06d' $((shards - 1)))}.tar"
if "$bench" --data "$pattern" --compare ceiling --epochs 1 >"$tmp/stdout" 2>"$tmp/stderr"; then
  fail "--compare ceiling on shards without a folder --reference-data exited 0"
fi
grep -q -- "--reference-data" "$tmp/stderr" || fail "no hint at --reference-data: $(cat "$tmp/stderr")"
"$bench" --data "$pattern" --reference-data "folder=$folder" --compare ceiling --batch-size 8 \
  --workers 2 --epochs 1 --rounds 1 --json "$tmp/shards.json" >"$tmp/stdout" 2>"$tmp/stderr" ||
  fail "bench on shards failed: $(cat "$tmp/stderr")"
grep -q "^source: tar_shards (local)" "$tmp/stdout" || fail "table does not name the source: $(cat "$tmp/stdout")"
grep -q "conveyor:folder .*reads image_folder: $folder" "$tmp/stdout" ||
  fail "table does not name the reference's source: $(cat "$tmp/stdout")"
grep -Eq "^conveyor:folder +[0-9.]+ +20 " "$tmp/stdout" || fail "no conveyor:folder row: $(cat "$tmp/stdout")"
for expect in '"source": "tar_shards (local)"' '"images": 20,' '"conveyor_folder_source": "image_folder"' \
  "\"conveyor_folder_data\": \"$folder\"" '"conveyor_folder_images": 20,' "\"ceiling_data\": \"$folder\"" \
  '"conveyor_folder_ratio"' '"conveyor_folder_images_per_s_rounds": ['; do
  grep -qF "$expect" "$tmp/shards.json" || fail "JSON lacks $expect: $(cat "$tmp/shards.json")"
done
# A downloaded shard named like a comma list with a pipe: command (issue 29): --data names an
# existing file, so it is that file, literally, relative or absolute; nothing runs (the command
# would create PWNED in the current folder).
mkdir -p "$tmp/evil"
bench_path=$(readlink -f "$bench")  # run from $tmp/evil
for name in 'a.tar,pipe:touch PWNED;x-000000.tar' '{pipe:touch PWNED;y-000000,z}.tar'; do
  cp "$tmp/wds/train-000000.tar" "$tmp/evil/$name"
  for data in "$name" "$tmp/evil/$name"; do
    (cd "$tmp/evil" && "$bench_path" --data "$data" --batch-size 2 --workers 2 --epochs 1 --rounds 1 \
      --json "$tmp/evil.json" >"$tmp/stdout" 2>"$tmp/stderr") ||
      fail "bench on a shard named $data failed: $(cat "$tmp/stderr")"
    grep -qF '"source": "tar_shards (local)"' "$tmp/evil.json" ||
      fail "a shard named $data is not one local shard: $(cat "$tmp/evil.json")"
    grep -Eq '"images": [1-9]' "$tmp/evil.json" || fail "no images from $data: $(cat "$tmp/evil.json")"
    [ -z "$(find "$tmp" -name 'PWNED*')" ] || fail "--data $data ran a command"
  done
done
# --plot: an SVG with the three panels, a line per run, the time split; its figures agree with the
# JSON's (worker time by stage within the fill time, decode the largest stage).
python3 - "$tmp/plot.svg" "$tmp/out.json" <<'PY' || fail "plot check failed"
import json, sys, xml.etree.ElementTree as ET
svg = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
texts = " ".join(t.text or "" for t in svg.iter(ns + "text"))
for want in ("Images/s over time", "Per-batch latency", "Where the time goes", "conveyor:",
             "ceiling:", "decode", "resize, flip, layout", "waiting for a batch", "--plot"):
    assert want in texts, f"plot lacks {want!r}"
# matplotlib draws each line as a path in a group named after it (bench/plot.py).
def drawn(prefix):
    return [g.get("id") for g in svg.iter(ns + "g") if (g.get("id") or "").startswith(prefix)
            and any(len((p.get("d") or "").split("L")) >= 2 for p in g.iter(ns + "path"))]
lines = drawn("rate:") + drawn("latency:")
assert len(drawn("rate:")) >= 2 and drawn("latency:"), f"expected rate lines for conveyor and ceiling and a latency curve, got {lines}"
j = json.load(open(sys.argv[2]))
work = j["time_read_seconds"] + j["time_decode_seconds"] + j["time_transform_seconds"]
assert j["time_decode_seconds"] > 0 and j["time_transform_seconds"] > 0, j
assert work <= j["fill_seconds"] * 1.001 + 1e-3, (work, j["fill_seconds"])
# The crop's decode is its own share, not folded into the transform's (with the own entropy
# decoder, issue 35, the decode no longer always outweighs the resize on these small photos).
assert j["time_decode_seconds"] > 0.25 * (j["time_decode_seconds"] + j["time_transform_seconds"]), j
PY
# --workers auto: Conveyor tunes within --max-workers (the ceiling runs that many threads); the JSON
# gives its choice over time and the CPU each run used, the plot draws the choice.
"$bench" --data "$folder" --batch-size 4 --workers auto --max-workers 2 --epochs 2 --rounds 1 \
  --compare ceiling --json "$tmp/auto.json" --plot "$tmp/auto.svg" >"$tmp/stdout" 2>"$tmp/stderr" ||
  fail "--workers auto failed: $(cat "$tmp/stderr")"
grep -q "workers auto, at most 2" "$tmp/stdout" || fail "table does not say auto: $(cat "$tmp/stdout")"
python3 - "$tmp/auto.json" "$tmp/auto.svg" "$tmp/out.json" <<'PY' || fail "--workers auto JSON or plot check failed"
import json, sys, xml.etree.ElementTree as ET
j = json.load(open(sys.argv[1]))
assert j["auto_workers"] is True and j["workers"] == 2 and j["images"] == 40, j
history = j["active_workers_history"]
assert history and history[0]["batch"] == 0 and history[0]["seconds"] == 0, history
assert all(1 <= h["workers"] <= 2 for h in history) and 1 <= j["active_workers"] <= 2, history
assert j["cpu_seconds"] > 0 and j["ceiling_cpu_seconds"] > 0, j
runs = {r["name"]: r for r in j["runs"]}
assert runs["ceiling"]["workers"] == 2 and runs["ceiling"]["active_workers_history"] == [], runs
fixed = json.load(open(sys.argv[3]))
assert fixed["auto_workers"] is False and fixed["active_workers_history"] == [], fixed
assert fixed["active_workers"] == 2 and fixed["cpu_seconds"] > 0, fixed
svg = ET.parse(sys.argv[2]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert any(g.get("id") == "workers:conveyor" for g in svg.iter(ns + "g")), "no active workers line"
PY
if "$bench" --data "$folder" --workers 2 --max-workers 2 --epochs 1 >"$tmp/stdout" 2>"$tmp/stderr"; then
  fail "--max-workers with a fixed --workers exited 0"
fi
grep -q -- "--max-workers is the budget of --workers auto" "$tmp/stderr" ||
  fail "--max-workers without auto: no clear error: $(cat "$tmp/stderr")"
if "$bench" --data "$folder" --workers many --epochs 1 >"$tmp/stdout" 2>"$tmp/stderr"; then
  fail "--workers many exited 0"
fi
grep -q "positive number or auto" "$tmp/stderr" || fail "--workers many: no clear error: $(cat "$tmp/stderr")"
# .png from matplotlib too (the venv's: scripts/setup installs it); another name is refused up front.
"$bench" --data "$folder" --batch-size 8 --workers 2 --epochs 1 --rounds 1 --plot "$tmp/plot.png" \
  >"$tmp/stdout" 2>"$tmp/stderr" || fail "--plot FILE.png failed: $(cat "$tmp/stderr")"
[ "$(head -c 8 "$tmp/plot.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] ||
  fail "--plot FILE.png did not write a PNG"
[ ! -e "$tmp/plot.png.json" ] || fail "--plot FILE.png left its temporary JSON"
if "$bench" --data "$folder" --epochs 1 --plot "$tmp/plot.pdf" >"$tmp/stdout" 2>"$tmp/stderr"; then
  fail "--plot FILE.pdf exited 0"
fi
grep -q "FILE.svg or FILE.png" "$tmp/stderr" || fail "--plot FILE.pdf: no clear error: $(cat "$tmp/stderr")"
# --gpu-decode (issue 24): where it cannot run (--device cpu: GPU decode writes into device memory)
# Conveyor decodes everything on the CPU, and the table and the JSON say why; a mode it does not
# know is refused up front; the plot draws the decode thread's bars and each decoder's share for a
# run that had GPU decode (the JSON edited to say so: no GPU here).
"$bench" --data "$folder" --batch-size 8 --workers 2 --epochs 1 --rounds 1 --device cpu \
  --gpu-decode auto --compare cpu-decode --json "$tmp/gpu.json" >"$tmp/stdout" 2>"$tmp/stderr" ||
  fail "--gpu-decode auto on the CPU failed: $(cat "$tmp/stderr")"
grep -q "^GPU decode unused: batches go to the CPU" "$tmp/stdout" ||
  fail "--gpu-decode auto on the CPU: the table does not say why it is unused: $(cat "$tmp/stdout")"
python3 - "$tmp/gpu.json" <<'PY' || fail "--gpu-decode JSON check failed"
import json, sys
j = json.load(open(sys.argv[1]))
g = j["gpu_decode"]
assert j["gpu_decode_mode"] == "auto" and j["images"] == 20, j
assert g["active"] is False and g["gpu_images"] == 0, g
assert g["status"].startswith("GPU decode unused: batches go to the CPU"), g
assert j["runs"][0]["gpu_decode"] == g, j["runs"][0]
# --compare cpu-decode: Conveyor without GPU decode in the same rounds, as a reference.
assert j["conveyor_cpu_decode_images"] == 20 and j["conveyor_cpu_decode_ratio"] > 0, j
cpu = [r for r in j["runs"] if r["name"] == "conveyor:cpu-decode"]
assert cpu and cpu[0]["gpu_decode"]["status"] == "off", j["runs"]
PY
grep -Eq "^conveyor:cpu-decode +[0-9.]+ +20 " "$tmp/stdout" || fail "no conveyor:cpu-decode row: $(cat "$tmp/stdout")"
if "$bench" --data "$folder" --epochs 1 --compare cpu-decode >"$tmp/stdout" 2>"$tmp/stderr"; then
  fail "--compare cpu-decode without --gpu-decode exited 0"
fi
grep -q "cpu-decode is Conveyor with --gpu-decode off" "$tmp/stderr" ||
  fail "--compare cpu-decode alone: no clear error: $(cat "$tmp/stderr")"
# --compare no-discard (issue 35): Conveyor with the JPEG discard hook off, in the same rounds.
"$bench" --data "$folder" --batch-size 8 --workers 2 --epochs 1 --rounds 1 --device cpu \
  --compare no-discard >"$tmp/stdout" 2>"$tmp/stderr" ||
  fail "--compare no-discard failed: $(cat "$tmp/stderr")"
grep -Eq "^conveyor:no-discard +[0-9.]+ +20 " "$tmp/stdout" ||
  fail "no conveyor:no-discard row: $(cat "$tmp/stdout")"
# --compare stock-entropy (issue 35): Conveyor with its own JPEG entropy decoder (the default),
# beside Conveyor with libjpeg-turbo's in the same rounds.
"$bench" --data "$folder" --batch-size 8 --workers 2 --epochs 1 --rounds 1 --device cpu \
  --compare stock-entropy >"$tmp/stdout" 2>"$tmp/stderr" ||
  fail "--compare stock-entropy failed: $(cat "$tmp/stderr")"
grep -Eq "^conveyor:stock-entropy +[0-9.]+ +20 " "$tmp/stdout" ||
  fail "no conveyor:stock-entropy row: $(cat "$tmp/stdout")"
# With --epochs 2 and the ceiling, epoch 1 (the entropy index filling) and the later epochs are
# reported apart against it, and the index's size per file.
"$bench" --data "$folder" --batch-size 8 --workers 2 --epochs 2 --rounds 1 --device cpu \
  --compare ceiling >"$tmp/stdout" 2>"$tmp/stderr" ||
  fail "--epochs 2 --compare ceiling failed: $(cat "$tmp/stderr")"
for key in epoch1_over_ceiling later_epochs_over_ceiling entropy_index_bytes_per_file; do
  grep -Eq "^$key [0-9.]+$" "$tmp/stdout" || fail "no $key line: $(cat "$tmp/stdout")"
done
if "$bench" --data "$folder" --epochs 1 --stock-entropy --compare stock-entropy \
  >"$tmp/stdout" 2>"$tmp/stderr"; then
  fail "--stock-entropy --compare stock-entropy exited 0"
fi
grep -q "stock-entropy is Conveyor without the own entropy decoder" "$tmp/stderr" ||
  fail "--stock-entropy --compare stock-entropy: no clear error: $(cat "$tmp/stderr")"
for mode in 1.5 gpu; do
  if "$bench" --data "$folder" --epochs 1 --gpu-decode "$mode" >"$tmp/stdout" 2>"$tmp/stderr"; then
    fail "--gpu-decode $mode exited 0"
  fi
  grep -q "off, auto, hw-only or a share in \[0, 1\]" "$tmp/stderr" ||
    fail "--gpu-decode $mode: no clear error: $(cat "$tmp/stderr")"
done
python3 - "$tmp/gpu.json" "$tmp/gpu-active.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["runs"][0]["gpu_decode"].update(active=True, gpu_share=0.4, gpu_images=8, cpu_images=12,
                                  gpu_busy_seconds=0.5, gpu_idle_seconds=0.25)
json.dump(j, open(sys.argv[2], "w"))
PY
"$python" "$(dirname "$bench")/conveyor-bench-plot.py" "$tmp/gpu-active.json" "$tmp/gpu.svg" ||
  fail "plot.py failed on a run with GPU decode"
python3 - "$tmp/gpu.svg" <<'PY' || fail "the plot of a run with GPU decode lacks its figures"
import sys, xml.etree.ElementTree as ET
svg = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
texts = " ".join(t.text or "" for t in svg.iter(ns + "text"))
for want in ("40% decoded on the GPU", "GPU decode, 40%", "workers (2), 60%", "GPU decode: busy",
             "GPU decode: idle"):
    assert want in texts, f"plot lacks {want!r}"
ids = {g.get("id") for g in svg.iter(ns + "g")}
for want in ("gpu:conveyor:gpu_busy_seconds", "gpu:conveyor:gpu_idle_seconds"):
    assert want in ids, f"no {want} bar"
PY
echo "conveyor-bench CLI: all checks passed"
