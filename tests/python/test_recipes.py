"""examples/recipes (issue 34): torchvision's v2 recipe and DeiT's, each with repeated
augmentation (RASampler), give the same batches for 1 and 4 workers and after a state_dict
resume; a sample's repeats get different crops and draws; the drawn parameters are readable
(record_augment_params) and match what the batch shows."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import conveyor
from conftest import CROP, REPO

aug = conveyor.augment


def recipe(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "recipes" /
                                                  f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECIPES = ["torchvision_v2", "deit"]


def make(photos, name, workers, **kwargs):
    return recipe(name).make_loader(str(photos), batch_size=4, num_workers=workers, seed=11,
                                    image_size=CROP, selected_round=0, **kwargs)


def run(loader, epochs=2):
    return [(b.epoch, list(b.indices), list(b.repeats), b[0].clone(), b[1].clone())
            for _ in range(epochs) for b in loader]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[:3] == y[:3]
        assert torch.equal(x[3], y[3]) and torch.equal(x[4], y[4])


@pytest.mark.parametrize("name", RECIPES)
def test_the_recipe_is_the_same_for_one_and_four_workers_and_after_a_resume(photos, name):
    whole = run(make(photos, name, 1))
    assert len(whole) == 12  # 27 draws an epoch (RASampler keeps the dataset's length), by 4
    for _, indices, repeats, images, targets in whole:
        assert images.dtype == torch.float32 and images.shape == (4, 3, CROP, CROP)
        assert targets.shape == (4, 3)
        assert torch.allclose(targets.sum(1), torch.ones(4))
    same(run(make(photos, name, 4)), whole)
    for k in (1, 4):
        first = make(photos, name, 2)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = first.state_dict()
        resumed = make(photos, name, 4)
        resumed.load_state_dict(state)
        same(run(resumed), whole[k:])


@pytest.mark.parametrize("name, repeats", [("torchvision_v2", 4), ("deit", 3)])
def test_each_sample_is_drawn_k_times_each_time_differently(photos, name, repeats):
    rows = {}
    loader = recipe(name).make_loader(str(photos), batch_size=4, num_workers=2, seed=11,
                                      image_size=CROP, selected_round=0)
    for b in loader:
        for r, (index, repeat) in enumerate(zip(b.indices, b.repeats)):
            rows.setdefault(index, {})[repeat] = b[0][r].clone()
    whole = [d for d in rows.values() if len(d) == repeats]
    assert len(whole) >= 24 // repeats, "all but the last sample taken get every repeat"
    for draws in whole:
        assert sorted(draws) == list(range(repeats))
        for a in range(repeats):
            for b in range(a + 1, repeats):
                assert not torch.equal(draws[a], draws[b])


def test_repeat_zero_is_the_unrepeated_crop(photos):
    crop = conveyor.RandomResizedCrop(CROP, flip=True)
    plain = conveyor.DataLoader(conveyor.ImageFolder(str(photos), transform=crop),
                                batch_size=27, seed=5)
    (images, _), = [(x.clone(), y) for x, y in plain]
    ra = conveyor.DataLoader(conveyor.ImageFolder(str(photos), transform=crop), batch_size=27,
                             seed=5, sampler=conveyor.RASampler(num_repeats=2, selected_round=0))
    b = next(iter(ra))
    for r, (index, repeat) in enumerate(zip(b.indices, b.repeats)):
        assert torch.equal(b[0][r], images[index]) == (repeat == 0)


def test_the_sampler_is_refused_with_a_clear_error_for_bad_arguments():
    with pytest.raises(ValueError, match="num_repeats"):
        conveyor.RASampler(num_repeats=0)
    with pytest.raises(ValueError, match="rank"):
        conveyor.RASampler(num_replicas=2, rank=2)
    assert "num_repeats=3" in repr(conveyor.RASampler())


def soft(labels, classes, smoothing):
    off = smoothing / classes
    return torch.nn.functional.one_hot(labels, classes).float() * (1 - smoothing) + off


def test_the_drawn_parameters_are_recorded_and_match_the_batch(photos):
    data = conveyor.ImageFolder(str(photos), transform=conveyor.RandomResizedCrop(CROP))
    transform = aug.Compose([aug.TrivialAugmentWide(), aug.RandomErasing(p=0.5),
                             aug.MixUpCutMix(mixup_alpha=0.2, cutmix_alpha=1.0, num_classes=3,
                                             label_smoothing=0.1)])
    plain = conveyor.DataLoader(data, batch_size=9, seed=2, num_workers=2)
    labels = [y.clone() for _, y in plain]
    loader = conveyor.DataLoader(data, batch_size=9, seed=2, num_workers=2,
                                 batch_transform=transform, record_augment_params=True)
    kinds = set()
    for b, y in zip(loader, labels):
        params = b.augment_params
        assert len(params["rows"]) == 9
        for row in params["rows"]:
            trivial = [p for p in row if p[0] == "TrivialAugmentWide"]
            assert len(trivial) <= 1  # one op a sample (none recorded for Identity? it is one)
            for op, name, value in row:
                kinds.add((op, name))
        (mix, lam), = [(op, v) for op, name, v in params["batch"] if name == "lambda"]
        want = soft(y, 3, 0.1) * lam + soft(y.flip(0), 3, 0.1) * (1 - lam)
        assert torch.allclose(b[1], want, atol=1e-6), mix
    assert ("RandomErasing", "x0") in kinds
    assert any(op == "TrivialAugmentWide" for op, _ in kinds)
    off = conveyor.DataLoader(data, batch_size=9, seed=2, batch_transform=transform)
    assert next(iter(off)).augment_params is None


def test_apply_records_the_erased_box(photos):
    images = torch.full((4, 3, 16, 16), 200, dtype=torch.uint8)
    out, params = aug.apply(aug.RandomErasing(p=1.0), {"image": images}, seed=1, record=True)
    for r, row in enumerate(params["rows"]):
        box = {name: int(v) for op, name, v in row if op == "RandomErasing"}
        if not box:
            continue
        erased = out["image"][r] == 0
        assert erased[:, box["y0"]:box["y1"], box["x0"]:box["x1"]].all()
        assert int(erased.sum()) == 3 * (box["y1"] - box["y0"]) * (box["x1"] - box["x0"])
    _, again = aug.apply(aug.RandomErasing(p=1.0), {"image": images.clone()}, seed=1,
                         repeats=[1, 1, 1, 1], record=True)
    assert again != params, "another repeat draws other boxes"


def dinov2(photos, workers, **kwargs):
    return recipe("dinov2").make_loader(str(photos), batch_size=4, num_workers=workers, seed=3,
                                        image_size=CROP, local_size=16, local_crops=3, **kwargs)


def views_run(loader, epochs=2):
    return [(b.epoch, list(b.indices), b["global"].clone(), b["local"].clone(), b["label"].clone())
            for _ in range(epochs) for b in loader]


def test_dinov2_is_the_same_for_one_and_four_workers_and_after_a_resume(photos):
    whole = views_run(dinov2(photos, 1))
    assert len(whole) == 12  # 27 images by 4, drop_last, 2 epochs
    for _, _, global_views, local_views, _ in whole:
        assert global_views.dtype == torch.float32 and global_views.shape == (4, 2, 3, CROP, CROP)
        assert local_views.dtype == torch.float32 and local_views.shape == (4, 3, 3, 16, 16)
    four = views_run(dinov2(photos, 4))
    for x, y in zip(four, whole, strict=True):
        assert x[:2] == y[:2]
        assert all(torch.equal(a, b) for a, b in zip(x[2:], y[2:]))
    first = dinov2(photos, 2)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    resumed = dinov2(photos, 4)
    resumed.load_state_dict(state)
    for x, y in zip(views_run(resumed), whole[2:], strict=True):
        assert x[:2] == y[:2]
        assert all(torch.equal(a, b) for a, b in zip(x[2:], y[2:]))


def test_dinov2_gives_each_view_its_own_recipe(photos):
    """Global view 0 is always blurred and never solarized, view 1 blurred at 0.1 and
    solarized at 0.2, the local views blurred at 0.5 (what record_augment_params recorded)."""
    counts = {}
    loader = dinov2(photos, 2, record_augment_params=True)
    for _ in range(12):
        for b in loader:
            fields = b.augment_params["fields"]
            assert set(fields) == {"global", "local"}
            for name, views in (("global", 2), ("local", 3)):
                rows = fields[name]["rows"]
                assert len(rows) == 4 and all(len(row) == views for row in rows)
                for row in rows:
                    for v, draws in enumerate(row):
                        ops = {op for op, _, _ in draws}
                        key = (name, 0 if name == "local" else v)
                        seen = counts.setdefault(key, {"n": 0, "GaussianBlur": 0,
                                                       "RandomSolarize": 0, "ColorJitter": 0})
                        seen["n"] += 1
                        for op in ("GaussianBlur", "RandomSolarize", "ColorJitter"):
                            seen[op] += op in ops
    rate = {key: {op: count / seen["n"] for op, count in seen.items()}
            for key, seen in counts.items()}
    assert rate[("global", 0)]["GaussianBlur"] == 1.0
    assert rate[("global", 0)]["RandomSolarize"] == 0.0
    assert 0.02 < rate[("global", 1)]["GaussianBlur"] < 0.2          # 0.1 of 288
    assert 0.12 < rate[("global", 1)]["RandomSolarize"] < 0.3        # 0.2 of 288
    assert 0.4 < rate[("local", 0)]["GaussianBlur"] < 0.6            # 0.5 of 864
    assert rate[("local", 0)]["RandomSolarize"] == 0.0
    for key in rate:
        assert 0.7 < rate[key]["ColorJitter"] < 0.9, key              # 0.8
