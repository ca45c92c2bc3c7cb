#!/usr/bin/env bash
# 3 ranks x 2 epochs of 100 samples, which 3 does not divide. Without drop_last every rank gets 34
# samples and the 2 missing places repeat the head of the epoch's order (PyTorch's padding); with
# --drop-last every rank gets 33 distinct samples and one is left out.
# Usage: coverage_uneven.sh DDP_TRAIN DDP_RUN WORK_DIR
set -euo pipefail
train=$1 run=$2 work=$3
here=$(dirname "$0")
rm -rf "$work" && mkdir -p "$work"
for mode in pad drop; do
  flag=()
  [ "$mode" = pad ] || flag=(--drop-last)
  out=$("$run" 3 -- "$train" --epochs 2 --samples 100 --batch 8 --workers 2 "${flag[@]}" \
    --log "$work/$mode" 2>&1) || { echo "$out"; exit 1; }
  echo "$out" | grep -E 'coverage|summary'
  [ "$(echo "$out" | grep -c 'coverage ok')" -eq 2 ]
  python3 "$here/check_logs.py" coverage --logs "$work/$mode" --ranks 3 --samples 100 --epochs 2 \
    "${flag[@]}"
done
