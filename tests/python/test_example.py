"""examples/train.py: stopped with Ctrl-C mid-epoch and restarted, it resumes at the next batch,
with the batches an uninterrupted run trains on."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from conftest import REPO

TRAIN = REPO / "examples" / "train.py"
STEP = re.compile(r"^epoch (\d+) batch (\d+) step (\d+) loss \S+ wait \S+ ms indices (\S+)$")


def steps(output: str):
    return [(int(m[1]), int(m[2]), m[4]) for m in map(STEP.match, output.splitlines()) if m]


def train(data, *extra):
    return [sys.executable, str(TRAIN), "--data", str(data), "--size", "32", "--batch", "4",
            "--workers", "2", "--epochs", "2", *extra]


def test_ctrl_c_then_restart_resumes_at_the_next_batch(photos, tmp_path):
    whole = subprocess.run(train(photos), capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr
    expected = steps(whole.stdout)
    assert len(expected) == 12  # 27 images, batches of 4, drop_last: 6 per epoch

    checkpoint = tmp_path / "ckpt.pt"
    first = subprocess.Popen(train(photos, "--checkpoint", str(checkpoint), "--step-delay", "0.3"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        while len(steps("\n".join(lines))) < 3:  # a few steps into epoch 0
            line = first.stdout.readline()
            assert line, first.stderr.read()
            lines.append(line.rstrip("\n"))
        first.send_signal(signal.SIGINT)
        rest, err = first.communicate(timeout=120)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 130, err
    before = steps("\n".join(lines) + "\n" + rest)
    assert 3 <= len(before) < 6, "stopped mid-epoch"
    assert "saved" in rest

    again = subprocess.run(train(photos, "--checkpoint", str(checkpoint)), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stdout
    after = steps(again.stdout)
    assert before + after == expected  # the next batch, and the same batches as one whole run
