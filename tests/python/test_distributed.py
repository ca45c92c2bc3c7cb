"""2 and 3 ranks through torch.distributed (Gloo on loopback, one process each): disjoint and
complete coverage with equal batch counts; elastic resume from 3 ranks to 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port

WORKER = Path(__file__).with_name("ddp_worker.py")


def run_ranks(world: int, out: Path, *args: str) -> list:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo")
    ranks = [subprocess.Popen([sys.executable, str(WORKER), str(out), *args],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    try:
        for r, p in enumerate(ranks):
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"rank {r} failed:\n{err}"
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    mode = args[1]
    return [json.loads((out / f"{mode}-rank-{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_disjoint_complete_shares_with_equal_batches(tmp_path, world):
    results = run_ranks(world, tmp_path, "96", "epoch")
    for epoch in range(2):
        shares = [set(r["epochs"][epoch]) for r in results]
        assert all(len(r["epochs"][epoch]) == 96 // world for r in results)
        assert set().union(*shares) == set(range(96))
        assert sum(len(s) for s in shares) == 96  # disjoint
    assert results[0]["epochs"][0] != results[0]["epochs"][1]  # reshuffled by set_epoch
    assert len({r["batches"] for r in results}) == 1


def test_elastic_resume_from_three_ranks_to_two(tmp_path):
    # 3 ranks take 2 batches of 4 each (24 samples), then 2 ranks share out the other 72.
    first = run_ranks(3, tmp_path, "96", "stop", "2")
    consumed = [i for r in first for i in r["epochs"][0]]
    assert len(consumed) == 24
    second = run_ranks(2, tmp_path, "96", "resume", "3")
    rest = [i for r in second for i in r["epochs"][0]]
    assert sorted(consumed + rest) == list(range(96)), "every sample once in the resumed epoch"
    assert len(second[0]["epochs"][0]) == len(second[1]["epochs"][0]) == 36
    for r in second:  # the next epoch is an ordinary 2-rank epoch
        assert len(r["epochs"][1]) == 48
    assert sorted(i for r in second for i in r["epochs"][1]) == list(range(96))
