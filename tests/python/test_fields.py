"""Named fields from Python (issue 31): CLIP-style shards written by webdataset's ShardWriter
(jpg, txt, json, cls, npy, boxes.npy) read in both modes, and a manifest with a multi-hot column.
Every value comes back as written, every sample once, the same batches for 1 and 4 workers, and
state_dict resume is bit-exact."""

from __future__ import annotations

import io
import json
import random
import subprocess

import numpy as np
import pytest
import torch

import conveyor
from conftest import CROP, prepare_tool

webdataset = pytest.importorskip("webdataset")

SAMPLES = 37


def _truth(i: int) -> dict:
    rng = random.Random(i)
    return {
        "caption": f"a photo number {i} " + "é" * rng.randrange(5) + "x" * rng.randrange(80),
        "meta": {"url": f"http://example.com/{i}.jpg", "width": rng.randrange(2000),
                 "tags": ["a", "b"][: rng.randrange(3)], "nested": {"k": [i, None, True]}},
        "cls": rng.randrange(1000),
        "soft": np.random.default_rng(i).standard_normal(10).astype(np.float16),
        "boxes": np.random.default_rng(1000 + i).uniform(0, 64, (rng.randrange(4), 4))
        .astype(np.float32),
    }


@pytest.fixture(scope="module")
def clip_shards(tmp_path_factory):
    """4 shards written by webdataset.ShardWriter; keys from %09d as img2dataset writes them."""
    out = tmp_path_factory.mktemp("clip")
    jpegs = conveyor.generate_image_folder(str(out / "src"), classes=1,
                                           images_per_class=SAMPLES, seed=3)
    assert jpegs["images"] == SAMPLES
    files = sorted((out / "src").rglob("*.jpg"))
    with webdataset.ShardWriter(str(out / "clip-%06d.tar"), maxcount=10) as sink:
        for i, path in enumerate(files):
            t = _truth(i)
            soft, boxes = io.BytesIO(), io.BytesIO()
            np.save(soft, t["soft"])
            np.save(boxes, t["boxes"])
            sink.write({"__key__": f"{i:09d}", "jpg": path.read_bytes(),
                        "txt": t["caption"], "json": json.dumps(t["meta"]).encode(),
                        "cls": str(t["cls"]), "npy": soft.getvalue(),
                        "boxes.npy": boxes.getvalue()})
    return out


def _fields():
    return {
        "image": conveyor.Image("jpg;png;jpeg;webp", transform=conveyor.RandomResizedCrop(CROP)),
        "caption": conveyor.Text("txt"),
        "meta": conveyor.Json("json"),
        "label": conveyor.Int("cls"),
        "soft": conveyor.Array("npy", shape=(10,), dtype=torch.float16),
        "boxes": conveyor.Array("boxes.npy", shape=(-1, 4), dtype=torch.float32),
    }


def _epoch(loader):
    """Every batch of an epoch, each row checked against what was written (sample i is key i:
    the shards and the index keep the writer's order), kept as plain values."""
    out = []
    for batch in loader:
        for row, i in enumerate(batch.indices):
            _check_batch_row(batch, row, i)
        out.append(({k: (v if isinstance(v, list) else
                         (v.values().clone(), v.offsets().clone()) if v.is_nested else v.clone())
                     for k, v in batch.items()}, list(batch.indices)))
    return out


def _same(a, b):
    assert len(a) == len(b)
    for (x, ix), (y, iy) in zip(a, b):
        assert ix == iy
        for k in x:
            if isinstance(x[k], tuple):
                assert all(torch.equal(p, q) for p, q in zip(x[k], y[k])), k
            elif isinstance(x[k], torch.Tensor):
                assert torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


def test_streamed_clip_shards_read_as_written(clip_shards):
    ds = conveyor.tar_shards(str(clip_shards / "clip-{000000..000003}.tar"), fields=_fields(),
                             streaming=True, shuffle_buffer=8)
    assert len(ds) == SAMPLES
    seen = []
    for batch in conveyor.DataLoader(ds, batch_size=5, num_workers=2, seed=1):
        # A stream's positions are its shuffled order: each row is checked by its content.
        for row in range(len(batch["caption"])):
            key = int(batch["caption"][row].split()[3])
            _check_batch_row(batch, row, key)
            seen.append(key)
    assert sorted(seen) == list(range(SAMPLES))


def _check_batch_row(batch, row, key):
    t = _truth(key)
    assert batch["caption"][row] == t["caption"]
    assert batch["meta"][row] == t["meta"]
    assert batch["label"][row].item() == t["cls"]
    assert torch.equal(batch["soft"][row], torch.from_numpy(t["soft"]))
    assert torch.equal(batch["boxes"][row], torch.from_numpy(t["boxes"]))


def test_indexed_clip_shards_at_random_same_for_any_workers_and_resume(clip_shards):
    subprocess.run([prepare_tool(), "--index-only",
                    str(clip_shards / "clip-{000000..000003}.tar")], check=True)
    pattern = str(clip_shards / "clip-{000000..000003}.tar")
    ds = conveyor.tar_shards(pattern, fields=_fields())
    assert len(ds) == SAMPLES
    one = _epoch(conveyor.DataLoader(ds, batch_size=6, shuffle=True, num_workers=1, seed=4))
    four = _epoch(conveyor.DataLoader(conveyor.tar_shards(pattern, fields=_fields()),
                                      batch_size=6, shuffle=True, num_workers=4, seed=4))
    _same(one, four)
    indices = [i for _, b in one for i in b]
    assert sorted(indices) == list(range(SAMPLES))
    loader = conveyor.DataLoader(ds, batch_size=6, shuffle=True, num_workers=2, seed=4)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    loader.close()
    resumed = conveyor.DataLoader(conveyor.tar_shards(pattern, fields=_fields()), batch_size=6,
                                  shuffle=True, num_workers=3, seed=4)
    resumed.load_state_dict(state)
    _same(one[2:], _epoch(resumed))


def test_manifest_with_a_multi_hot_column(tmp_path):
    conveyor.generate_image_folder(str(tmp_path / "img"), classes=1, images_per_class=11, seed=2)
    files = sorted((tmp_path / "img").rglob("*.jpg"))
    rows = []
    with open(tmp_path / "train.jsonl", "w") as f:
        for i, p in enumerate(files):
            labels = sorted(random.Random(i).sample(range(20), i % 4))
            rows.append(labels)
            f.write(json.dumps({"path": str(p.relative_to(tmp_path)), "labels": labels,
                                "caption": f"row {i}"}) + "\n")
    ds = conveyor.Manifest(tmp_path / "train.jsonl", fields={
        "image": conveyor.Image("path", transform=conveyor.RandomResizedCrop(CROP)),
        "labels": conveyor.Array("labels", shape=(20,), dtype=torch.float32, multi_hot=True),
        "caption": conveyor.Text("caption")})
    assert len(ds) == 11
    seen = set()
    for batch in conveyor.DataLoader(ds, batch_size=4, num_workers=2):
        for row, i in enumerate(batch.indices):
            expected = torch.zeros(20)
            expected[rows[i]] = 1
            assert torch.equal(batch["labels"][row], expected)
            assert batch["caption"][row] == f"row {i}"
            seen.add(i)
    assert seen == set(range(11))


def test_a_missing_field_is_raised_or_skipped(clip_shards, tmp_path):
    with open(tmp_path / "m.jsonl", "w") as f:
        for i in range(6):
            row = {"n": i}
            if i != 4:
                row["caption"] = f"c{i}"
            f.write(json.dumps(row) + "\n")
    fields = {"n": conveyor.Int("n"), "caption": conveyor.Text("caption")}
    with pytest.raises(conveyor.SampleError) as raised:
        for _ in conveyor.DataLoader(conveyor.Manifest(tmp_path / "m.jsonl", fields=fields),
                                     batch_size=3):
            pass
    assert "line 5" in str(raised.value) and 'field "caption"' in str(raised.value)
    loader = conveyor.DataLoader(conveyor.Manifest(tmp_path / "m.jsonl", fields=fields),
                                 batch_size=3, on_error="skip")
    ns = [n for b in loader for n in b["n"].tolist()]
    assert 4 not in ns and len(ns) == 6
    assert loader.stats()["skipped"] == 1


def test_datasets_without_fields_still_yield_images_and_labels(clip_shards):
    ds = conveyor.tar_shards(str(clip_shards / "clip-{000000..000003}.tar"),
                             transform=conveyor.RandomResizedCrop(CROP), streaming=True)
    images, labels = next(iter(conveyor.DataLoader(ds, batch_size=4)))
    assert images.shape == (4, 3, CROP, CROP) and labels.dtype == torch.int64
