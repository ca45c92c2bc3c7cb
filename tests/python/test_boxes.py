"""Boxes, points and the plan that follow their image (issue 33) from Python.

Boxes and their labels are checked against torchvision v2 run with the same box and flip (its
RandomResizedCrop given the plan's box, RandomHorizontalFlip, then SanitizeBoundingBoxes) on
hundreds of random boxes and plans; points against the plan's formula; the same batches come out
for 1 and 4 workers, from a manifest and from webdataset.ShardWriter shards (jpg + boxes.json +
labels.json + cls); errors name the field and the box, and count as skips under on_error="skip".
Of an image with conveyor.Views, boxes, labels, points and plans follow each view of the group
they name, as B*V jagged rows (sample major, view minor), each view checked as above."""

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


def _check_against_torchvision(sample, row, got_boxes, got_labels, where):
    """The engine's boxes and labels of one view (plan row `row`) are torchvision v2's; returns
    the boxes it dropped."""
    s = sample
    want_boxes, want_labels = _torchvision(s, row)
    if not torch.equal(got_labels, want_labels):
        # Only a box on the min_size edge may go either way (float32 against double).
        both = set(got_labels.tolist()) ^ set(want_labels.tolist())
        for label in both:
            k = int(np.nonzero(s["labels"] == label)[0][0])
            one, _ = _torchvision({**s, "boxes": s["boxes"][k:k + 1],
                                   "labels": s["labels"][k:k + 1]}, row)
            assert one.numel() == 0 or _near_the_edge(one[0]), (where, label)
        keep = [j for j, v in enumerate(got_labels.tolist()) if v not in both]
        got_boxes, got_labels = got_boxes[keep], got_labels[keep]
        keep = [j for j, v in enumerate(want_labels.tolist()) if v not in both]
        want_boxes, want_labels = want_boxes[keep], want_labels[keep]
    assert torch.equal(got_labels, want_labels), where
    scale = max(1.0, int(row[5]) / int(row[2]), int(row[6]) / int(row[3]))
    torch.testing.assert_close(got_boxes.reshape(-1, 4), want_boxes.reshape(-1, 4), rtol=1e-5,
                               atol=2e-3 * scale)
    return len(s["labels"]) - len(got_labels)


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
            dropped += _check_against_torchvision(s, row, boxes[r], labels[r], i)
            checked += len(s["labels"])
            flipped += int(row[4])
    assert checked > 800 and dropped > 100 and 50 < flipped < 190


# DINOv2's geometry at a test's sizes: 2 global views and 4 local ones.
LOCAL = 16


def _views_fields():
    views = conveyor.Views({
        "global": (2, conveyor.RandomResizedCrop(S, scale=(0.32, 1.0), flip=True)),
        "local": (4, conveyor.RandomResizedCrop(LOCAL, scale=(0.05, 0.32), flip=True))})
    return {"boxes": conveyor.Boxes("boxes", follows="local"),
            "image": conveyor.Image("image", transform=views),
            "labels": conveyor.Array("labels", shape=(-1,), dtype=torch.int64),
            "points": conveyor.Points("points", follows="global"),
            "plan": conveyor.Plan(follows="local"),
            "gplan": conveyor.Plan(follows="global")}


def _per_view_epoch(data, workers, state=None, stop=None):
    """The batches of one epoch as dicts of CPU tensors (nested ones as lists of rows)."""
    loader = conveyor.DataLoader(data, batch_size=8, num_workers=workers, seed=3, shuffle=True)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for batch in loader:
        out.append({k: (list(v.unbind()) if v.is_nested else v.clone()) for k, v in batch.items()})
        out[-1]["indices"] = list(batch.indices)
        if stop is not None and len(out) == stop:
            return out, loader.state_dict()
    return out, None


def _same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], list) and x[k] and isinstance(x[k][0], torch.Tensor):
                assert len(x[k]) == len(y[k]) and all(torch.equal(p, q)
                                                      for p, q in zip(x[k], y[k])), k
            elif isinstance(x[k], torch.Tensor):
                assert torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


def test_boxes_points_and_plans_follow_each_view_of_their_group(detection):
    """Each local view's boxes and labels are torchvision v2's under that view's box and flip;
    each global view's points are the plan's formula; rows are sample major, view minor."""
    root, samples = detection
    data = conveyor.Manifest(root / "train.jsonl", fields=_views_fields())
    checked = dropped = flipped = 0
    for batch in conveyor.DataLoader(data, batch_size=16, num_workers=2, seed=7):
        b = len(batch.indices)
        assert list(batch) == ["boxes", "boxes_per_view", "global", "local", "labels", "points",
                               "points_per_view", "plan", "gplan"]
        boxes, labels, plan = batch["boxes"], batch["labels"], batch["plan"]
        assert boxes.is_nested and boxes.size(0) == labels.size(0) == b * 4
        assert batch["points"].size(0) == b * 2
        assert batch["boxes_per_view"].shape == (b, 4)
        assert batch["points_per_view"].shape == (b, 2)
        assert plan.shape == (b, 4, 7) and batch["gplan"].shape == (b, 2, 7)
        assert batch["global"].shape == (b, 2, 3, S, S)
        for r, i in enumerate(batch.indices):
            s = samples[i]
            for v in range(4):
                row = plan[r, v]
                assert int(row[5]) == LOCAL and int(row[6]) == LOCAL
                assert int(batch["boxes_per_view"][r, v]) == boxes[r * 4 + v].size(0)
                dropped += _check_against_torchvision(s, row, boxes[r * 4 + v],
                                                      labels[r * 4 + v], (i, v))
                checked += len(s["labels"])
                flipped += int(row[4])
            for v in range(2):
                want = _map_points(s["points"], batch["gplan"][r, v].tolist())
                np.testing.assert_allclose(batch["points"][r * 2 + v].numpy(), want, rtol=1e-5,
                                           atol=1e-3)
            # The views differ: a sample's local plans are not one view's repeated.
            assert len({tuple(plan[r, v].tolist()) for v in range(4)}) > 1
    assert checked > 3000 and dropped > 1000 and 200 < flipped < 760


def test_views_followers_same_for_one_and_four_workers_and_after_a_resume(detection):
    root, _ = detection
    data = conveyor.Manifest(root / "train.jsonl", fields=_views_fields())
    reference, _ = _per_view_epoch(data, 1)
    four, _ = _per_view_epoch(data, 4)
    _same_batches(four, reference)
    first, state = _per_view_epoch(data, 2, stop=7)
    _same_batches(first, reference[:7])
    rest, _ = _per_view_epoch(data, 4, state=state)
    _same_batches(rest, reference[7:])


def test_a_follower_of_an_image_with_views_names_a_group(detection):
    root, _ = detection
    fields = _views_fields()
    fields["boxes"] = conveyor.Boxes("boxes", follows="image")
    with pytest.raises(ValueError, match='follows "image", an image with views: it follows one '
                                         'group of them, named in `follows`: "global", "local"'):
        conveyor.DataLoader(conveyor.Manifest(root / "train.jsonl", fields=fields),
                            batch_size=4)


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
