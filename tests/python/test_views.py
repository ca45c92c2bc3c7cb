"""conveyor.Views (issue 33): several views of each image from one decode. Each group is a batch
field named after it, in an ImageFolder's batches and in a fields= dataset alike; one group of
one view is the plain transform bit for bit; the views are the same for 1 and 4 workers and after
a state_dict resume; decoding once and decoding each view alone agree as docs/design.md states."""

from __future__ import annotations

import math

import pytest
import torch

import conveyor
from conftest import CROP

LOCAL = 16


def dino(**options):
    return conveyor.Views({
        "global": (2, conveyor.RandomResizedCrop(CROP, scale=(0.32, 1.0), flip=True)),
        "local": (8, conveyor.RandomResizedCrop(LOCAL, scale=(0.05, 0.32), flip=True))},
        **options)


def loader(photos, workers, transform=None):
    data = conveyor.ImageFolder(str(photos), transform=transform or dino())
    return conveyor.DataLoader(data, batch_size=4, shuffle=True, num_workers=workers, seed=3)


def batches(dl, epochs=2):
    return [tuple(t.clone() for t in b) for _ in range(epochs) for b in dl]


def test_each_group_is_a_field_named_after_it(photos):
    dl = loader(photos, 2)
    batch = next(iter(dl))
    assert batch.names == ("global", "local", "label")
    assert batch["global"].shape == (4, 2, 3, CROP, CROP)
    assert batch["local"].shape == (4, 8, 3, LOCAL, LOCAL)
    assert batch["global"].dtype == batch["local"].dtype == torch.uint8
    assert batch["label"].shape == (4,)
    assert batch[2] is batch["label"] or torch.equal(batch[2], batch["label"])
    # Ten different views of each image: no two of a sample's local views are equal.
    local = batch["local"][0]
    assert all(not torch.equal(local[a], local[b]) for a in range(8) for b in range(a))
    hwc = next(iter(loader(photos, 1, dino(layout="HWC"))))
    assert hwc["local"].shape == (4, 8, LOCAL, LOCAL, 3)
    assert dino().output_shape == {"global": (2, 3, CROP, CROP), "local": (8, 3, LOCAL, LOCAL)}


def test_one_group_of_one_view_is_the_plain_transform_bit_for_bit(photos):
    plain = conveyor.RandomResizedCrop(CROP, flip=True)
    one = conveyor.Views({"image": (1, conveyor.RandomResizedCrop(CROP, flip=True))})
    a, b = batches(loader(photos, 2, plain)), batches(loader(photos, 2, one))
    assert len(a) == len(b) == 14
    for (x, y), (vx, vy) in zip(a, b):
        assert vx.shape == (x.shape[0], 1, 3, CROP, CROP)
        assert torch.equal(vx[:, 0], x) and torch.equal(vy, y)


def test_same_views_for_one_and_four_workers_and_after_a_resume(photos):
    reference = batches(loader(photos, 1))
    four = batches(loader(photos, 4))
    assert len(four) == len(reference) == 14
    for got, want in zip(four, reference):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    for k in (3, 9):
        first = loader(photos, 2)
        taken = 0
        while taken < k:  # into the second epoch for k > 7
            for _ in first:
                taken += 1
                if taken == k:
                    break
        state = first.state_dict()
        first.close()
        resumed = loader(photos, 4)
        resumed.load_state_dict(state)
        rest = batches(resumed, 2 if k < 7 else 1)
        assert len(rest) == len(reference) - k, k
        for got, want in zip(rest, reference[k:]):
            assert all(torch.equal(g, w) for g, w in zip(got, want)), k


def test_decoding_once_is_close_to_decoding_each_view_alone(photos):
    once = batches(loader(photos, 2), 1)
    alone = batches(loader(photos, 2, dino(decode_once=False)), 1)
    same = 0
    for got, want in zip(once, alone):
        assert torch.equal(got[2], want[2])
        for g, w in zip(got[:2], want[:2]):
            for view, view_alone in zip(g.flatten(0, 1), w.flatten(0, 1)):
                mse = float(((view.float() - view_alone.float()) ** 2).mean())
                same += int(mse == 0)
                # docs/design.md, "Views": at least 18 dB PSNR at these small sizes.
                assert mse == 0 or 10 * math.log10(255 ** 2 / mse) >= 18
    assert same > 27  # many views decode at the shared scale: the same bytes


def test_a_fields_dataset_gets_the_groups_as_fields(photos, tmp_path):
    files = sorted(photos.rglob("*.jpg"))[:6]
    (tmp_path / "m.csv").write_text("file,cls\n" + "".join(f"{f},{i}\n"
                                                          for i, f in enumerate(files)))
    data = conveyor.Manifest(tmp_path / "m.csv", fields={
        "image": conveyor.Image("file", transform=dino()), "label": conveyor.Int("cls")})
    batch = next(iter(conveyor.DataLoader(data, batch_size=3, seed=3)))
    assert list(batch) == ["global", "local", "label"]
    assert batch["global"].shape == (3, 2, 3, CROP, CROP)
    assert batch["local"].shape == (3, 8, 3, LOCAL, LOCAL)
    assert batch["label"].tolist() == [0, 1, 2]


def test_wrong_groups_are_refused():
    rrc = conveyor.RandomResizedCrop(CROP)
    with pytest.raises(ValueError, match="dict of groups"):
        conveyor.Views({})
    with pytest.raises(ValueError, match="count"):
        conveyor.Views({"a": (0, rrc)})
    with pytest.raises(ValueError, match=r"\(count, transform\)"):
        conveyor.Views({"a": rrc})
    with pytest.raises(ValueError, match="conveyor transform"):
        conveyor.Views({"a": (2, dino())})
