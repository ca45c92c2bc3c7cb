#!/usr/bin/env bash
# A rank killed mid-epoch, then the job restarted from the last checkpoint.
# 2 ranks, 96 samples, batch 8: 6 steps per epoch, 2 epochs. Checkpoints every 4 steps (and at
# epoch ends); rank 1 sends itself SIGKILL on the batch of step 9 (epoch 1, its 4th batch), so the
# last checkpoint is step 8, in the middle of epoch 1. The launcher must fail and leave no rank
# running; the restarted job must finish, and counting the first run's samples before step 8 plus
# all of the second run's, every epoch must hold every sample exactly once.
# Usage: kill_resume.sh DDP_TRAIN DDP_RUN WORK_DIR
set -euo pipefail
train=$1 run=$2 work=$3
here=$(dirname "$0")
rm -rf "$work" && mkdir -p "$work"
args=(--epochs 2 --samples 96 --batch 8 --workers 2 --checkpoint "$work/ckpt" --checkpoint-every 4)

if out=$("$run" 2 -- "$train" "${args[@]}" --log "$work/first" --die-at-step 9 --die-rank 1 2>&1); then
  echo "$out"; echo "FAIL: the launcher exited 0 although rank 1 was killed"; exit 1
fi
echo "$out" | grep -E 'SIGKILL|ddp-run'
echo "$out" | grep -q 'rank 1 (pid [0-9]*) was killed by signal 9' ||
  { echo "$out"; echo "FAIL: the launcher did not report rank 1's SIGKILL"; exit 1; }
if pgrep -f -- "--checkpoint $work/ckpt" >/dev/null; then
  echo "FAIL: ranks still running after the launcher exited"; exit 1
fi
read -r step world <"$work/ckpt/latest"
echo "last checkpoint: step $step, saved by $world ranks"
[ "$step" -eq 8 ] && [ "$world" -eq 2 ]

out=$("$run" 2 -- "$train" "${args[@]}" --log "$work/second" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -E 'resumed|coverage|summary'
echo "$out" | grep -q 'resumed from .*step-8' || { echo "FAIL: the job did not resume"; exit 1; }
python3 "$here/check_logs.py" resume --first "$work/first" --ranks1 2 --checkpoint-step "$step" \
  --second "$work/second" --ranks2 2 --samples 96 --epochs 2
