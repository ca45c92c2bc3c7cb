"""bench/python/bench.py --clip (issue 31) end to end on a tiny dataset: the CLIP-style shards
(jpg + txt + json) are written with webdataset.ShardWriter, indexed with conveyor-prepare
--index-only and read by every loader of the comparison, each reading every sample of every
epoch and handing the loop str captions and parsed JSON. Not a timing: only that the figures
exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import conveyor
from conftest import REPO, prepare_tool

BENCH = REPO / "bench" / "python" / "bench.py"
SAMPLES, PER_SHARD, EPOCHS = 30, 8, 2


def _run_clip(tmp_path: Path, loaders: str) -> dict:
    images = tmp_path / "img"
    conveyor.generate_image_folder(str(images), classes=1, images_per_class=6, seed=3)
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--clip", "--data", str(images), "--clip-samples",
         str(SAMPLES), "--clip-per-shard", str(PER_SHARD), "--batch-size", "6", "--epochs",
         str(EPOCHS), "--rounds", "1", "--workers", "2", "--loaders", loaders,
         "--conveyor-prepare", prepare_tool(), "--clip-shards", str(tmp_path / "shards"),
         "--json", str(report)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    figures = json.loads(report.read_text())
    for name in loaders.split(","):
        (result,) = figures["loaders"][name]["rounds"]
        assert "error" not in result, (name, result["error"])
        assert result["samples"] == SAMPLES * EPOCHS, name
        assert result["samples_per_s"] > 0, name
        assert f"\n{name} " in done.stdout, done.stdout  # its row in the table
    return figures


def test_the_clip_comparison_reads_every_sample_with_conveyors_fields(tmp_path):
    figures = _run_clip(tmp_path, "conveyor-fields,conveyor-image,conveyor-fields-indexed,"
                                  "conveyor-image-indexed")
    # CLIP-style shards: 4 of at most 8 samples, ~100-byte captions, ~1 kB JSON, and the index.
    assert sorted(p.name for p in (tmp_path / "shards").glob("clip-*.tar")) == [
        f"clip-{i:06d}.tar" for i in range(4)]
    assert (tmp_path / "shards" / "clip.index.json").exists()
    sizes = figures["mean_member_bytes"]
    assert 85 <= sizes["txt"] <= 120 and 900 <= sizes["json"] <= 1300, sizes
    assert "index_seconds" in figures
    for ratio in ("conveyor-fields / conveyor-image",
                  "conveyor-fields-indexed / conveyor-image-indexed"):
        assert figures["ratios"][ratio]["median"] > 0, ratio
    for name in ("conveyor-fields", "conveyor-fields-indexed"):
        (result,) = figures["loaders"][name]["rounds"]
        assert result["fill_seconds"] > 0 and result["skipped"] == 0, (name, result)
    # Again into the same folder: the shards are rewritten and their index replaced.
    again = _run_clip(tmp_path, "conveyor-fields-indexed")
    assert "index_error" not in again and "conveyor-fields-indexed" in again["loaders"]


def test_the_clip_comparison_against_webdataset(tmp_path):
    pytest.importorskip("torchvision", reason="the webdataset run uses torchvision's v2 "
                                              "transforms (bench/python/setup-peers)")
    figures = _run_clip(tmp_path, "conveyor-fields,webdataset")
    assert figures["ratios"]["conveyor-fields / webdataset"]["median"] > 0
