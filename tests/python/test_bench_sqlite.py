"""bench/python/bench.py --sqlite and --sqlite-memory (issue 36) end to end on a tiny dataset: the
photos written once into a SQLite database, read by conveyor.from_dataset over the user's own
Dataset (2 workers and 1), by Conveyor's ImageFolder and by PyTorch's DataLoader (PIL and
torchvision v2, where torchvision is installed: otherwise a skip that says why), each run
reading every sample of every epoch; the GIL per sample from stats(); the peak PSS of each run's
process tree with its worker processes counted. Not a timing: only that the figures exist."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import conveyor
from conftest import REPO

BENCH = REPO / "bench" / "python" / "bench.py"
IMAGES, EPOCHS = 12, 2
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def _bench(tmp_path: Path, *options: str) -> tuple:
    images = tmp_path / "img"
    conveyor.generate_image_folder(str(images), classes=2, images_per_class=IMAGES // 2,
                                   seed=3, mixed=True)
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--data", str(images), "--batch-size", "4", "--epochs",
         str(EPOCHS), "--rounds", "1", "--workers", "2", "--json", str(report), *options],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(report.read_text()), done.stdout


def _check_torch_run(result: dict) -> None:
    if HAS_TORCHVISION:
        assert "skipped" not in result and "error" not in result, result
        assert result["samples"] == IMAGES * EPOCHS
    else:
        assert "torchvision is not installed" in result["skipped"], result


def test_the_sqlite_comparison_reads_every_sample_from_the_users_dataset(tmp_path):
    figures, table = _bench(tmp_path, "--sqlite", "--loaders",
                            "conveyor-sqlite,conveyor-sqlite@1,conveyor-folder,torch-sqlite")
    db = Path(figures["sqlite"]["db"])
    assert db == tmp_path / "img.sqlite" and figures["sqlite"]["images"] == IMAGES
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT COUNT(*), COUNT(DISTINCT cls) FROM photos").fetchone() == (
            IMAGES, 2)
    loaders = figures["loaders"]
    for name, workers in (("conveyor-sqlite", 2), ("conveyor-sqlite@1", 1),
                          ("conveyor-folder", 2)):
        (result,) = loaders[name]["rounds"]
        assert "error" not in result, (name, result["error"])
        assert result["workers"] == workers, name
        assert result["samples"] == IMAGES * EPOCHS and result["samples_per_s"] > 0, name
        assert f"\n{name} " in table, table  # its row in the table
    for name in ("conveyor-sqlite", "conveyor-sqlite@1"):
        (result,) = loaders[name]["rounds"]
        # __getitem__ ran once per sample read, under the GIL, on the workers' threads.
        assert result["gil"]["calls"] >= IMAGES * EPOCHS and result["gil"]["held_seconds"] > 0
        assert 0 < result["gil"]["share"] < 1, result["gil"]
        assert result["skipped"] == 0
        # Each worker thread kept its own connection (at most one more: a call from the loop's
        # thread), not one per sample.
        assert 1 <= result["connections"] <= result["workers"] + 1, result
        assert loaders[name]["gil_us_per_sample"] > 0
    (torch_run,) = loaders["torch-sqlite"]["rounds"]
    _check_torch_run(torch_run)
    ratios = figures["ratios"]
    assert ratios["conveyor-sqlite / conveyor-folder"]["target"] == 0.9
    assert ratios["conveyor-sqlite / conveyor-sqlite@1"]["median"] > 0
    assert ("conveyor-sqlite / torch-sqlite" in ratios) == HAS_TORCHVISION
    # A second run reuses the database.
    again, _ = _bench(tmp_path, "--sqlite", "--loaders", "conveyor-sqlite")
    assert again["sqlite"]["reused"] and not figures["sqlite"]["reused"]


def test_the_memory_comparison_counts_every_process_of_the_tree(tmp_path):
    figures, table = _bench(tmp_path, "--sqlite-memory", "--records-mb", "8", "--loaders",
                            "conveyor-sqlite,torch-sqlite,torch-sqlite@3")
    loaders = figures["loaders"]
    (conveyor_run,) = loaders["conveyor-sqlite"]["rounds"]
    assert conveyor_run["samples"] == IMAGES * EPOCHS, conveyor_run
    assert conveyor_run["most_processes"] == 1  # threads, no worker processes
    # The list of records: 8 MB (its strings and its pointers), measured where it was made.
    assert 6 < conveyor_run["records_pss_mb"] < 12, conveyor_run
    assert conveyor_run["peak_pss_mb"] > conveyor_run["records_pss_mb"]
    for name, workers in (("torch-sqlite", 2), ("torch-sqlite@3", 3)):
        (result,) = loaders[name]["rounds"]
        _check_torch_run(result)
        if HAS_TORCHVISION:  # the process and each of its worker processes were measured
            assert result["most_processes"] == workers + 1, (name, result)
            assert result["peak_pss_mb"] > 0
            assert figures["ratios"][f"{name} / conveyor-sqlite"]["median"] > 0
    assert "\nconveyor-sqlite " in table and "peak PSS MB" in table

