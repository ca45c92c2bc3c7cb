"""Boxes, points and the plan that follow their image (issue 33) from Python.

Boxes and their labels are checked against torchvision v2 run with the same box and flip (its
RandomResizedCrop given the plan's box, RandomHorizontalFlip, then SanitizeBoundingBoxes) on
hundreds of random boxes and plans; points against the plan's formula; the same batches come out
for 1 and 4 workers, from a manifest and from webdataset.ShardWriter shards (jpg + boxes.json +
labels.json + cls); errors name the field and the box, and count as skips under on_error="skip"."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

import conveyor

PIL = pytest.importorskip("PIL.Image")

S = 48


def _jpeg(w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    rgb = np.full((h, w, 3), rng.integers(0, 256, 3), dtype=np.uint8)
    out = io.BytesIO()
    PIL.fromarray(rgb).save(out, "JPEG", quality=80)
    return out.getvalue()


def _boxes(rng, w: int, h: int, n: int) -> np.ndarray:
    """n boxes inside a w x h image: random, some on the edges, some thinner than a pixel."""
    x = np.sort(rng.uniform(0, w, (n, 2)), axis=1)
    y = np.sort(rng.uniform(0, h, (n, 2)), axis=1)
    boxes = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1)
    edge = rng.random(n) < 0.2
    boxes[edge, 0], boxes[edge, 3] = 0, h
    thin = rng.random(n) < 0.1
    boxes[thin, 2] = np.minimum(boxes[thin, 0] + rng.uniform(0, 0.5, thin.sum()), w)
    return boxes.round(2)


def _samples(count: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        w, h = int(rng.integers(16, 160)), int(rng.integers(16, 160))
        n = int(rng.integers(0, 9))
        out.append({"w": w, "h": h, "boxes": _boxes(rng, w, h, n),
                    "labels": np.arange(n, dtype=np.int64) + 100 * i,
                    "points": np.stack([rng.uniform(0, w, 6), rng.uniform(0, h, 6)], 1).round(2)})
    return out


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    samples = _samples(240, 33)
    with open(root / "train.jsonl", "w") as f:
        for i, s in enumerate(samples):
            (root / f"{i}.jpg").write_bytes(_jpeg(s["w"], s["h"], i))
            np.save(root / f"{i}.npy", s["points"])
            f.write(json.dumps({"image": f"{i}.jpg", "boxes": s["boxes"].tolist(),
                                "labels": s["labels"].tolist(),
                                "points": s["points"].tolist()}) + "\n")
    return root, samples


def _fields(keys=("image", "boxes", "labels", "points"), **box_options):
    # The boxes come first: followers are written after their image whatever the order.
    return {"boxes": conveyor.Boxes(keys[1], follows="image", **box_options),
            "image": conveyor.Image(keys[0], transform=conveyor.RandomResizedCrop(S, flip=True)),
            "labels": conveyor.Array(keys[2], shape=(-1,), dtype=torch.int64),
            "points": conveyor.Points(keys[3]),
            "plan": conveyor.Plan()}


def _torchvision(sample, plan_row):
    """torchvision v2's boxes and labels for the sample under the plan's box and flip."""
    tv = pytest.importorskip("torchvision")
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    x, y, w, h, flip, ow, oh = (int(v) for v in plan_row)

    class PlannedCrop(v2.RandomResizedCrop):
        def make_params(self, flat_inputs):
            return dict(top=y, left=x, height=h, width=w)

    del tv
    pipeline = v2.Compose([PlannedCrop((oh, ow)), v2.RandomHorizontalFlip(p=float(flip)),
                           v2.SanitizeBoundingBoxes()])
    out = pipeline({"image": tv_tensors.Image(torch.zeros(3, sample["h"], sample["w"],
                                                          dtype=torch.uint8)),
                    "boxes": tv_tensors.BoundingBoxes(
                        torch.tensor(sample["boxes"], dtype=torch.float32).reshape(-1, 4),
                        format="XYXY", canvas_size=(sample["h"], sample["w"])),
                    "labels": torch.tensor(sample["labels"])})
    return out["boxes"].as_subclass(torch.Tensor), out["labels"]


def _near_the_edge(box: torch.Tensor, min_size: float = 1.0) -> bool:
    return bool(((box[2:] - box[:2]) - min_size).abs().min() < 1e-3)


def test_boxes_match_torchvision_v2_on_the_same_plan(detection):
    root, samples = detection
    data = conveyor.Manifest(root / "train.jsonl", fields=_fields())
    checked = dropped = flipped = 0
    for batch in conveyor.DataLoader(data, batch_size=16, num_workers=2, seed=7):
        boxes, labels, plan = batch["boxes"], batch["labels"], batch["plan"]
        assert boxes.is_nested and boxes.dtype == torch.float32
        assert plan.dtype == torch.int32 and plan.shape[1:] == (1, 7)
        for r, i in enumerate(batch.indices):
            s = samples[i]
            row = plan[r, 0]
            assert int(row[5]) == S and int(row[6]) == S
            want_boxes, want_labels = _torchvision(s, row)
            got_boxes, got_labels = boxes[r], labels[r]
            if not torch.equal(got_labels, want_labels):
                # Only a box on the min_size edge may go either way (float32 against double).
                both = set(got_labels.tolist()) ^ set(want_labels.tolist())
                for label in both:
                    k = int(np.nonzero(s["labels"] == label)[0][0])
                    one, _ = _torchvision({**s, "boxes": s["boxes"][k:k + 1],
                                           "labels": s["labels"][k:k + 1]}, row)
                    assert one.numel() == 0 or _near_the_edge(one[0]), (i, label)
                keep = [j for j, v in enumerate(got_labels.tolist()) if v not in both]
                got_boxes, got_labels = got_boxes[keep], got_labels[keep]
                keep = [j for j, v in enumerate(want_labels.tolist()) if v not in both]
                want_boxes, want_labels = want_boxes[keep], want_labels[keep]
            assert torch.equal(got_labels, want_labels), i
            scale = max(1.0, S / int(row[2]), S / int(row[3]))
            torch.testing.assert_close(got_boxes, want_boxes.reshape(-1, 4), rtol=1e-5,
                                       atol=2e-3 * scale)
            checked += len(s["labels"])
            dropped += len(s["labels"]) - len(got_labels)
            flipped += int(row[4])
    assert checked > 800 and dropped > 100 and 50 < flipped < 190


def _map_points(points: np.ndarray, row) -> np.ndarray:
    """The plan's formula (conveyor.Plan's docstring), apart from the engine."""
    x, y, w, h, flip, ow, oh = (float(v) for v in row)
    px = (points[:, 0] - x) * (ow / w)
    py = (points[:, 1] - y) * (oh / h)
    if flip:
        px = ow - px
    inside = (px >= 0) & (px <= ow) & (py >= 0) & (py <= oh)
    return np.stack([px, py, inside.astype(np.float64)], 1)


def _as_dict(batch):
    out = {}
    for r, i in enumerate(batch.indices):
        out[i] = {k: (v[r].clone() if isinstance(v, torch.Tensor) else v[r])
                  for k, v in batch.items()}
    return out


def test_points_follow_the_plan_and_batches_do_not_depend_on_workers(detection):
    root, samples = detection
    fields = _fields()
    fields["points"] = conveyor.Points("points")  # a JSON list of [x, y] lists
    data = conveyor.Manifest(root / "train.jsonl", fields=fields)
    runs = []
    for workers in (1, 4):
        seen = {}
        for batch in conveyor.DataLoader(data, batch_size=10, num_workers=workers, seed=3,
                                         shuffle=True):
            seen.update(_as_dict(batch))
        runs.append(seen)
    assert sorted(runs[0]) == list(range(len(samples)))
    invisible = 0
    for i, one in runs[0].items():
        other = runs[1][i]
        for k in one:
            assert torch.equal(one[k], other[k]), (i, k)
        want = _map_points(samples[i]["points"], one["plan"][0].tolist())
        got = one["points"]
        assert got.shape == (6, 3)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-3)
        invisible += int((got[:, 2] == 0).sum())
    assert invisible > 100


def test_webdataset_shards_jpg_json_boxes_and_cls(tmp_path, detection):
    webdataset = pytest.importorskip("webdataset")
    root, samples = detection
    samples = samples[:40]
    with webdataset.ShardWriter(str(tmp_path / "det-%06d.tar"), maxcount=16) as sink:
        for i, s in enumerate(samples):
            sink.write({"__key__": f"{i:06d}", "jpg": (root / f"{i}.jpg").read_bytes(),
                        "boxes.json": json.dumps(s["boxes"].tolist()),
                        "labels.json": json.dumps(s["labels"].tolist()),
                        "points.npy": s["points"], "cls": str(i)})
    fields = _fields(("jpg", "boxes.json", "labels.json", "points.npy"))
    fields["cls"] = conveyor.Int("cls")
    runs = []
    for workers in (1, 4):
        data = conveyor.tar_shards(str(tmp_path / "det-{000000..000002}.tar"), fields=fields,
                                   streaming=True, shuffle_buffer=8)
        seen = {}
        for batch in conveyor.DataLoader(data, batch_size=6, num_workers=workers, seed=5):
            for one in _as_dict(batch).values():
                seen[int(one["cls"])] = one
        runs.append(seen)
    assert sorted(runs[0]) == list(range(len(samples)))
    for i, one in runs[0].items():
        for k in one:
            assert torch.equal(one[k], runs[1][i][k]), (i, k)
        s = samples[i]
        want_boxes, want_labels = _torchvision(s, one["plan"][0])
        if torch.equal(one["labels"], want_labels):
            scale = max(1.0, S / int(one["plan"][0][2]), S / int(one["plan"][0][3]))
            torch.testing.assert_close(one["boxes"], want_boxes.reshape(-1, 4), rtol=1e-5,
                                       atol=2e-3 * scale)
        np.testing.assert_allclose(one["points"].numpy(),
                                   _map_points(s["points"], one["plan"][0].tolist()),
                                   rtol=1e-5, atol=1e-3)


def test_min_visibility_drops_boxes_the_view_mostly_cuts(detection):
    root, samples = detection
    plain = conveyor.Manifest(root / "train.jsonl", fields=_fields())
    strict = conveyor.Manifest(root / "train.jsonl", fields=_fields(min_visibility=0.5))
    kept_plain = kept_strict = 0
    for a, b in zip(conveyor.DataLoader(plain, batch_size=40, seed=1),
                    conveyor.DataLoader(strict, batch_size=40, seed=1)):
        assert torch.equal(a["plan"], b["plan"])
        for r, i in enumerate(a.indices):
            row = a["plan"][r, 0].tolist()
            x, y, w, h = row[:4]
            src = samples[i]["boxes"].reshape(-1, 4)
            area = (src[:, 2] - src[:, 0]) * (src[:, 3] - src[:, 1])
            cw = np.clip(src[:, 2], x, x + w) - np.clip(src[:, 0], x, x + w)
            ch = np.clip(src[:, 3], y, y + h) - np.clip(src[:, 1], y, y + h)
            share = np.where(area > 0, cw * ch / np.maximum(area, 1e-12), 0)
            strict_labels = set(b["labels"][r].tolist())
            for k, label in enumerate(samples[i]["labels"].tolist()):
                if label in strict_labels:
                    assert share[k] >= 0.5 - 1e-6 and label in set(a["labels"][r].tolist())
                elif label in set(a["labels"][r].tolist()):
                    assert share[k] < 0.5 + 1e-6
            kept_plain += len(a["labels"][r])
            kept_strict += len(b["labels"][r])
    assert kept_strict < kept_plain


def test_bad_boxes_name_the_field_and_box_or_count_as_skips(tmp_path):
    (tmp_path / "a.jpg").write_bytes(_jpeg(50, 40, 1))
    rows = [{"image": "a.jpg", "boxes": [[1, 1, 10, 10]], "labels": [3]},
            {"image": "a.jpg", "boxes": [[1, 1, 51, 10]], "labels": [3]},
            {"image": "a.jpg", "boxes": [[9, 1, 5, 10]], "labels": [3]},
            {"image": "a.jpg", "boxes": [[1, 1, 5]], "labels": [3]},
            {"image": "a.jpg", "boxes": [[1, 1, 5, 5]], "labels": [3, 4]}]
    with open(tmp_path / "m.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    # The whole image, resized: the first row's box stays in the view.
    fields = {"image": conveyor.Image("image", transform=conveyor.Resize(S)),
              "boxes": conveyor.Boxes("boxes"),
              "labels": conveyor.Array("labels", shape=(-1,), dtype=torch.int64)}
    data = conveyor.Manifest(tmp_path / "m.jsonl", fields=fields)
    messages = [r'field "boxes": box 0 \[1\.0+, 1\.0+, 51\.0+, 10\.0+\] lies outside its image '
                r'\(field "image": 50x40, upright\)',
                r"is not \[x1, y1, x2, y2\] with x1 <= x2",
                r'member "boxes" is a list of lists of 3 numbers, not boxes of 4 numbers',
                r'field "labels" has 2 rows and its boxes \(field "boxes"\) 1']
    for n, (row, message) in enumerate(zip(rows[1:], messages)):
        (tmp_path / f"bad{n}.jsonl").write_text(json.dumps(row) + "\n")
        bad = conveyor.Manifest(tmp_path / f"bad{n}.jsonl", fields=fields)
        with pytest.raises(conveyor.SampleError, match=message):
            list(conveyor.DataLoader(bad, batch_size=1))
    loader = conveyor.DataLoader(data, batch_size=5, on_error="skip")
    batches = list(loader)
    assert loader.stats()["skipped"] == 4
    assert batches[0]["boxes"][0].shape == (1, 4)
    with pytest.raises(ValueError, match="not a field of the source"):
        conveyor.Manifest(tmp_path / "m.jsonl", fields={
            "image": conveyor.Image("image"), "boxes": conveyor.Boxes("boxes")})
    data = conveyor.Manifest(tmp_path / "m.jsonl", fields={
        "image": conveyor.Image("image", transform=conveyor.Resize(S)),
        "boxes": conveyor.Boxes("boxes", paired=())})
    assert next(iter(conveyor.DataLoader(data, batch_size=1)))["boxes"][0].shape == (1, 4)
