"""conveyor.augment from Python (issue 34): the issue's example pipeline (TrivialAugmentWide,
RandomErasing, Normalize, MixUpCutMix), DeiT's and DINOv2's photometric ones, run by
DataLoader(batch_transform=...): soft targets that sum to 1, float images
equal to conveyor.normalize of the plain batch where only Normalize runs, the same batches for
1 and 4 workers and after a state_dict resume, and wrong arguments refused naming the op."""

from __future__ import annotations

import pytest
import torch

import conveyor
from conftest import CROP

aug = conveyor.augment


def recipe():
    return aug.Compose([aug.TrivialAugmentWide(), aug.RandomErasing(p=0.5), aug.Normalize(conveyor.IMAGENET_MEAN,
                                                                conveyor.IMAGENET_STD),
                        aug.MixUpCutMix(mixup_alpha=0.2, cutmix_alpha=1.0, num_classes=3,
                                        label_smoothing=0.1)])


def loader(photos, workers, transform):
    data = conveyor.ImageFolder(str(photos), transform=conveyor.RandomResizedCrop(CROP))
    return conveyor.DataLoader(data, batch_size=4, shuffle=True, num_workers=workers, seed=3,
                               batch_transform=transform)


def batches(dl, epochs=2):
    return [(x.clone(), y.clone()) for _ in range(epochs) for x, y in dl]


def test_the_recipe_gives_float_images_and_soft_targets_summing_to_one(photos):
    dl = loader(photos, 2, recipe())
    assert "MixUpCutMix(mixup_alpha=0.2" in dl.options["batch_transform"]
    got = batches(dl, 1)
    assert len(got) == 7
    for images, targets in got:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, CROP, CROP)
        assert targets.dtype == torch.float32 and targets.shape == (images.shape[0], 3)
        torch.testing.assert_close(targets.sum(1), torch.ones(images.shape[0]))
        assert targets.max() < 1  # smoothed: every class keeps some weight


def test_normalize_alone_equals_conveyor_normalize_of_the_plain_batch(photos):
    plain = batches(loader(photos, 2, None), 1)
    staged = batches(loader(photos, 2, aug.Compose([aug.Normalize()])), 1)
    assert len(plain) == len(staged)
    for (x, y), (nx, ny) in zip(plain, staged):
        assert torch.equal(conveyor.normalize(x), nx)
        assert torch.equal(y, ny)


def test_same_batches_for_one_and_four_workers_and_after_a_resume(photos):
    reference = batches(loader(photos, 1, recipe()))
    four = batches(loader(photos, 4, recipe()))
    assert len(four) == len(reference) == 14
    for (x, y), (rx, ry) in zip(four, reference):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    for k in (0, 3, 7, 9):
        first = loader(photos, 2, recipe())
        taken = 0
        while taken < k:  # k batches, into the second epoch for k > 7
            for _ in first:
                taken += 1
                if taken == k:
                    break
        state = first.state_dict()
        first.close()
        resumed = loader(photos, 4, recipe())
        resumed.load_state_dict(state)
        rest = batches(resumed, 2 if k < 7 else 1)
        assert len(rest) == len(reference) - k, k
        for (x, y), (rx, ry) in zip(rest, reference[k:]):
            assert torch.equal(x, rx) and torch.equal(y, ry), k


def deit_recipe():
    return aug.Compose([aug.RandAugment.timm("rand-m9-mstd0.5-inc1"), aug.RandomErasing(p=0.25),
                        aug.Normalize(),
                        aug.MixUpCutMix(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=3)])


def dino_photometric():
    return aug.Compose([aug.ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8), aug.RandomGrayscale(p=0.2),
                        aug.GaussianBlur(9, (0.1, 2.0), p=0.5), aug.RandomSolarize(128, p=0.2),
                        aug.AutoAugment(), aug.RandAugment(num_ops=2, magnitude=9)])


@pytest.mark.parametrize("make", [deit_recipe, dino_photometric])
def test_other_recipes_give_the_same_batches_for_one_and_four_workers(photos, make):
    one = batches(loader(photos, 1, make()), 1)
    four = batches(loader(photos, 4, make()), 1)
    plain = batches(loader(photos, 2, None), 1)
    assert len(one) == len(four) == 7
    for (x, y), (fx, fy) in zip(one, four):
        assert torch.equal(x, fx) and torch.equal(y, fy)
    if make is dino_photometric:  # uint8 out, and most images changed
        changed = sum((x != px).flatten(1).any(1).sum().item() for (x, _), (px, _) in
                      zip(one, plain))
        assert one[0][0].dtype == torch.uint8 and changed >= 20


def test_wrong_arguments_are_refused_naming_the_op(photos):
    with pytest.raises(ValueError, match="ColorJitter's hue must lie in"):
        aug.ColorJitter(hue=0.7)
    with pytest.raises(ValueError, match="timm RandAugment key \"w\""):
        aug.RandAugment.timm("rand-m9-w0")
    with pytest.raises(ValueError, match="interpolation must be"):
        aug.TrivialAugmentWide(interpolation="bicubic")
    with pytest.raises(ValueError, match="RandomErasing needs p in"):
        aug.RandomErasing(p=2)
    with pytest.raises(ValueError, match="MixUp/CutMix need"):
        aug.MixUp(alpha=1.0, num_classes=0)
    with pytest.raises(ValueError, match="batch_transform must be a conveyor.augment op"):
        loader(photos, 1, lambda batch: batch)
    with pytest.raises(ValueError, match=r"batch_transform MixUp\(alpha=1, num_classes=3\) "
                                         r"cannot take this source's fields: .*no field \"target\""):
        loader(photos, 1, aug.MixUp(num_classes=3, label="target"))


def test_per_field_runs_a_pipeline_per_view_group_and_per_view():
    """A dict is PerField: one transform for a group is that transform for each of its views,
    bit for bit; Normalize inside makes the group float [B, V, 3, S, S]; other fields stay."""
    torch.manual_seed(0)
    views = torch.randint(0, 256, (5, 3, 3, 20, 20), dtype=torch.uint8)
    image = torch.randint(0, 256, (5, 3, 20, 20), dtype=torch.uint8)
    pipe = aug.Compose([aug.ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8), aug.RandomGrayscale(0.2),
                        aug.RandomSolarize(128, p=0.5), aug.Normalize()])
    one = aug.apply(aug.PerField({"views": pipe}), {"views": views.clone(),
                                                    "image": image.clone()}, seed=4)
    each = aug.apply(aug.PerField({"views": [pipe, pipe, pipe]}),
                     {"views": views.clone(), "image": image.clone()}, seed=4)
    assert aug.op_of({"views": pipe}).name.startswith('PerField({"views": Compose([')
    assert one["views"].dtype == torch.float32 and one["views"].shape == (5, 3, 3, 20, 20)
    assert torch.equal(one["views"], each["views"])
    assert torch.equal(one["image"], image)
    solarized = aug.apply(aug.PerField({"views": [aug.RandomSolarize(128, p=1.0),
                                                  aug.RandomGrayscale(p=0.0),
                                                  aug.RandomGrayscale(p=0.0)]}),
                          {"views": views.clone()})["views"]
    assert torch.equal(solarized[:, 0], torch.where(views[:, 0] >= 128, 255 - views[:, 0],
                                                    views[:, 0]))
    assert torch.equal(solarized[:, 1:], views[:, 1:])


def test_per_field_refuses_what_it_cannot_run_naming_the_field():
    fields = {"views": torch.zeros((2, 3, 3, 8, 8), dtype=torch.uint8),
              "label": torch.zeros(2, dtype=torch.int64)}
    g = aug.RandomGrayscale(0.5)
    for pipelines, words in [({"views": [g, g]}, "view group of 3 views"),
                             ({"label": g}, '"label"'),
                             ({"views": [g, aug.Normalize(), g]}, "make different images")]:
        with pytest.raises(ValueError, match=words):
            aug.apply(aug.PerField(pipelines), dict(fields))
    with pytest.raises(ValueError, match="PerField"):
        aug.PerField({})
    with pytest.raises(ValueError, match="no transform"):
        aug.PerField({"views": []})
