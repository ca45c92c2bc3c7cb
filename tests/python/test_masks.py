"""Segmentation masks that follow their image (issues 32 and 33) from Python: masks written by
Pillow (modes "P", "L" and "I;16") beside JPEG images, from a manifest's columns and from
webdataset shards (jpg + seg.png). A 16-bit mask whose value is its pixel's position (x + W*y)
tells, for every output pixel, which source pixel it shows; the test checks that these form a
nearest-neighbour resize of one box (by pixel centres), mirrored or not, that the palette and gray
masks show the same pixels by their own formulas (palette indices, never colours), and that the
image shows that box too (a ramp image, within JPEG and bilinear rounding)."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import torch

import conveyor

PIL = pytest.importorskip("PIL.Image")

S = 40
SIZES = [(250, 180), (180, 250), (97, 61), (64, 64)]


def _ramp_jpeg(w: int, h: int) -> bytes:
    x = np.linspace(0, 255, w)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h)[:, None].repeat(w, 1)
    rgb = np.stack([x, y, np.full((h, w), 128.0)], -1).round().astype(np.uint8)
    out = io.BytesIO()
    PIL.fromarray(rgb).save(out, "JPEG", quality=98, subsampling=0)
    return out.getvalue()


def _png(array: np.ndarray, mode: str) -> bytes:
    img = PIL.fromarray(array, mode=mode) if mode != "I;16" else PIL.fromarray(array)
    if mode == "P":
        img.putpalette([(i * 37) % 256 for i in range(768)])
    assert img.mode == mode
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


def _masks(w: int, h: int):
    yy, xx = np.mgrid[0:h, 0:w]
    return {"pos": _png((xx + w * yy).astype(np.uint16), "I;16"),
            "pal": _png(((xx * 7 + yy * 3) % 256).astype(np.uint8), "P"),
            "gray": _png(((xx * 5 + yy * 11) % 256).astype(np.uint8), "L")}


def _nearest_box(src: np.ndarray, size: int) -> tuple:
    """The (start, length, flipped) of the box whose nearest-by-centres resize to `size` gives
    the source coordinates `src`; fails when no box does."""
    flipped = bool(size > 1 and src[0] > src[-1])
    seq = src[::-1] if flipped else src
    i = np.arange(size)
    for length in range(1, max(d for wh in SIZES for d in wh) + 1):
        start = int(seq[0]) - (length // (2 * size))
        if np.array_equal(start + ((2 * i + 1) * length) // (2 * size), seq):
            return start, length, flipped
    raise AssertionError(f"no box resizes to {src.tolist()}")


def _check_sample(image, pos, pal, gray, w, h):
    pos = pos.numpy().astype(np.int64)
    sx, sy = pos % w, pos // w
    assert (sy < h).all()
    # Separable: each column one source column, each row one source row.
    assert (sx == sx[0:1, :]).all() and (sy == sy[:, 0:1]).all()
    x0, bw, flip = _nearest_box(sx[0], S)
    y0, bh, vflip = _nearest_box(sy[:, 0], S)
    assert not vflip
    assert 0 <= x0 and x0 + bw <= w and 0 <= y0 and y0 + bh <= h
    assert np.array_equal(pal.numpy(), (sx * 7 + sy * 3) % 256)
    assert np.array_equal(gray.numpy(), (sx * 5 + sy * 11) % 256)
    # The image shows the same box: its red channel is the ramp over x, green over y.
    red = image[0].numpy().astype(np.float64)
    green = image[1].numpy().astype(np.float64)
    want_red = 255.0 * sx / max(w - 1, 1)
    want_green = 255.0 * sy / max(h - 1, 1)
    step_x, step_y = 255.0 * bw / S / max(w - 1, 1), 255.0 * bh / S / max(h - 1, 1)
    assert np.abs(red - want_red).mean() < 3 + step_x, (red[0, :5], want_red[0, :5])
    assert np.abs(green - want_green).mean() < 3 + step_y
    return flip


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seg")
    rows = []
    for i in range(24):
        w, h = SIZES[i % len(SIZES)]
        (root / f"{i}.jpg").write_bytes(_ramp_jpeg(w, h))
        for name, data in _masks(w, h).items():
            (root / f"{i}.{name}.png").write_bytes(data)
        rows.append({"image": f"{i}.jpg", "pos": f"{i}.pos.png", "pal": f"{i}.pal.png",
                     "gray": f"{i}.gray.png", "w": w, "h": h})
    with open(root / "train.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return root, rows


def _fields(keys=("pos", "pal", "gray")):
    # The masks come first: a follower is written after its image whatever the order.
    return {"pos": conveyor.Mask(keys[0], follows="image", dtype=torch.int32),
            "pal": conveyor.Mask(keys[1]),
            "gray": conveyor.Mask(keys[2], follows="image"),
            "image": conveyor.Image("image", transform=conveyor.RandomResizedCrop(S, flip=True))}


def test_manifest_masks_follow_the_image_pixel_for_pixel(pairs):
    root, rows = pairs
    data = conveyor.Manifest(root / "train.csv", fields=_fields())
    flips = 0
    batches = []
    for batch in conveyor.DataLoader(data, batch_size=5, num_workers=2, seed=4):
        assert batch["pal"].dtype == torch.uint8 and batch["pos"].dtype == torch.int32
        assert batch["pal"].shape[1:] == (S, S)
        for r, i in enumerate(batch.indices):
            flips += _check_sample(batch["image"][r], batch["pos"][r], batch["pal"][r],
                                   batch["gray"][r], rows[i]["w"], rows[i]["h"])
        batches.append({k: v.clone() for k, v in batch.items()})
    assert 0 < flips < len(rows)
    # The same batches with 1 worker: masks are a pure function of (seed, epoch, index).
    again = list(conveyor.DataLoader(data, batch_size=5, num_workers=1, seed=4))
    for a, b in zip(batches, again):
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_shard_masks_jpg_and_seg_png(tmp_path):
    webdataset = pytest.importorskip("webdataset")
    w, h = 120, 90
    with webdataset.ShardWriter(str(tmp_path / "seg-%06d.tar"), maxcount=8) as sink:
        for i in range(20):
            m = _masks(w, h)
            sink.write({"__key__": f"{i:06d}", "jpg": _ramp_jpeg(w, h), "seg.png": m["pos"],
                        "pal.png": m["pal"], "gray.png": m["gray"], "cls": str(i)})
    fields = _fields(("seg.png", "pal.png", "gray.png"))
    fields["image"] = conveyor.Image("jpg", transform=conveyor.RandomResizedCrop(S, flip=True))
    fields["label"] = conveyor.Int("cls")
    data = conveyor.tar_shards(str(tmp_path / "seg-{000000..000002}.tar"), fields=fields,
                               streaming=True, shuffle_buffer=4)
    seen = []
    for batch in conveyor.DataLoader(data, batch_size=4, num_workers=2, seed=2):
        for r in range(len(batch["label"])):
            _check_sample(batch["image"][r], batch["pos"][r], batch["pal"][r], batch["gray"][r],
                          w, h)
            seen.append(int(batch["label"][r]))
    assert sorted(seen) == list(range(20))


def test_a_mask_of_another_size_names_the_field_and_both_sizes(tmp_path):
    (tmp_path / "a.jpg").write_bytes(_ramp_jpeg(50, 40))
    (tmp_path / "a.png").write_bytes(_masks(50, 41)["pal"])
    (tmp_path / "b.png").write_bytes(_masks(50, 40)["pos"])
    (tmp_path / "m.csv").write_text("image,mask,wide\na.jpg,a.png,b.png\n")
    data = conveyor.Manifest(tmp_path / "m.csv", fields={
        "image": conveyor.Image("image", transform=conveyor.RandomResizedCrop(S, flip=True)),
        "mask": conveyor.Mask("mask")})
    with pytest.raises(conveyor.SampleError, match=r'field "mask": the mask is 50x41 and its '
                       r'image \(field "image"\) is 50x40'):
        next(iter(conveyor.DataLoader(data, batch_size=1)))
    data = conveyor.Manifest(tmp_path / "m.csv", fields={
        "image": conveyor.Image("image", transform=conveyor.RandomResizedCrop(S, flip=True)),
        "mask": conveyor.Mask("wide")})
    with pytest.raises(conveyor.SampleError, match="a 16-bit mask needs dtype int16 or int32"):
        next(iter(conveyor.DataLoader(data, batch_size=1)))
    with pytest.raises(ValueError, match="dtype"):
        conveyor.Mask("png", dtype=torch.float32)
    with pytest.raises(Exception, match="not an image field"):
        conveyor.Manifest(tmp_path / "m.csv", fields={"label": conveyor.Int("image"),
                                                      "mask": conveyor.Mask("mask",
                                                                            follows="label")})


def test_masks_follow_each_view_of_their_group(pairs):
    """Of an image with conveyor.Views, a mask names a group and follows each of its views: the
    position mask shows, in every view, the nearest source pixel (by centres) of that view's box
    in the group's plan, mirrored with it."""
    root, rows = pairs
    local = 16
    views = conveyor.Views({
        "global": (2, conveyor.RandomResizedCrop(S, scale=(0.32, 1.0), flip=True)),
        "local": (6, conveyor.RandomResizedCrop(local, scale=(0.05, 0.32), flip=True))})
    data = conveyor.Manifest(root / "train.csv", fields={
        "gpos": conveyor.Mask("pos", follows="global", dtype=torch.int32),
        "lpal": conveyor.Mask("pal", follows="local"),
        "image": conveyor.Image("image", transform=views),
        "gplan": conveyor.Plan(follows="global"),
        "lplan": conveyor.Plan(follows="local")})
    flips = 0
    for batch in conveyor.DataLoader(data, batch_size=5, num_workers=2, seed=4):
        b = len(batch.indices)
        assert batch["gpos"].shape == (b, 2, S, S) and batch["lpal"].shape == (b, 6, local, local)
        for r, i in enumerate(batch.indices):
            w = rows[i]["w"]
            for mask, plan, size in ((batch["gpos"][r], batch["gplan"][r], S),
                                     (batch["lpal"][r], batch["lplan"][r], local)):
                for v in range(plan.shape[0]):
                    x, y, bw, bh, flip, ow, oh = plan[v].tolist()
                    assert ow == oh == size
                    k = np.arange(size)
                    sx = x + ((2 * k + 1) * bw) // (2 * size)
                    sy = y + ((2 * k + 1) * bh) // (2 * size)
                    if flip:
                        sx = sx[::-1]
                    yy, xx = np.meshgrid(sy, sx, indexing="ij")
                    want = xx + w * yy if size == S else (xx * 7 + yy * 3) % 256
                    assert np.array_equal(mask[v].numpy(), want), (i, v)
                    flips += flip
    assert 20 < flips < 24 * 8 - 20
