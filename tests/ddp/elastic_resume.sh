#!/usr/bin/env bash
# Elastic resume: 3 ranks save mid-epoch, 2 ranks finish the job.
# 96 samples, batch 8: with 3 ranks an epoch is 4 steps of 24 samples. The first job stops after
# step 2 (48 samples consumed), checkpointing. The second job, on 2 ranks, must cover exactly the
# 48 samples not consumed (24 per rank, 3 batches each, each sample once), then a whole epoch 1.
# Usage: elastic_resume.sh DDP_TRAIN DDP_RUN WORK_DIR
set -euo pipefail
train=$1 run=$2 work=$3
here=$(dirname "$0")
rm -rf "$work" && mkdir -p "$work"
args=(--epochs 2 --samples 96 --batch 8 --workers 2 --checkpoint "$work/ckpt")

out=$("$run" 3 -- "$train" "${args[@]}" --log "$work/first" --stop-at-step 2 2>&1) ||
  { echo "$out"; exit 1; }
echo "$out" | grep -E 'summary'
read -r step world <"$work/ckpt/latest"
echo "checkpoint: step $step, saved by $world ranks"
[ "$step" -eq 2 ] && [ "$world" -eq 3 ]

out=$("$run" 2 -- "$train" "${args[@]}" --log "$work/second" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -E 'resumed|coverage|summary'
echo "$out" | grep -q 'resumed from .*step-2: step 2, epoch 0, saved by 3 ranks, now 2' ||
  { echo "FAIL: the job did not resume on 2 ranks"; exit 1; }
python3 "$here/check_logs.py" resume --first "$work/first" --ranks1 3 --checkpoint-step "$step" \
  --second "$work/second" --ranks2 2 --samples 96 --epochs 2
# The resumed part of epoch 0: 2 ranks x 3 batches x 24 samples.
python3 - "$work/second" <<'PY'
import sys
for r in range(2):
    lines = [l for l in open(f"{sys.argv[1]}.rank{r}.log") if l.startswith("epoch 0 ")]
    n = sum(len(l.split()) - 5 for l in lines)
    assert (len(lines), n) == (3, 24), f"rank {r}: {len(lines)} batches, {n} samples in epoch 0"
print("resumed epoch 0: 2 ranks x 3 batches x 24 samples")
PY
