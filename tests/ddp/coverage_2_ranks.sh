#!/usr/bin/env bash
# 2 ranks x 2 epochs of 96 samples: disjoint, complete, equal counts (no padding).
# Usage: coverage_2_ranks.sh DDP_TRAIN DDP_RUN WORK_DIR
set -euo pipefail
train=$1 run=$2 work=$3
here=$(dirname "$0")
rm -rf "$work" && mkdir -p "$work"
out=$("$run" 2 -- "$train" --epochs 2 --samples 96 --batch 8 --workers 2 --log "$work/run" 2>&1) ||
  { echo "$out"; exit 1; }
echo "$out" | grep -E 'coverage|summary'
[ "$(echo "$out" | grep -c 'coverage ok')" -eq 2 ]  # the job's own all-gather check, per epoch
python3 "$here/check_logs.py" coverage --logs "$work/run" --ranks 2 --samples 96 --epochs 2
