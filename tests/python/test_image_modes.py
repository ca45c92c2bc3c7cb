"""Image modes and dtypes (issue 32) from Python: PNG files written by Pillow (RGBA, LA, 16-bit
gray, palette with tRNS, RGB, L) through conveyor.DataLoader as
conveyor.Image(mode=..., dtype=...), checked against Pillow's convert() and the box that
conveyor.Plan reports: exactly where the box is the whole image (no resize), and within the
bilinear filters' difference where it is resized; the RGB channels of "RGBA" are the "RGB" rows,
and uint16 is uint8 times 257 for 8-bit files."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import torch

import conveyor

PIL = pytest.importorskip("PIL.Image")

# Pillow's convert() of the palette file with its tRNS chunk warns; the conversion is the point.
pytestmark = pytest.mark.filterwarnings("ignore:Palette images with Transparency")

S = 24


def _files(w: int, h: int, seed: int):
    """name -> (PNG bytes, the Pillow image as written)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    # Smooth ramps with a little noise, so that two bilinear filters agree closely.
    across = xx / max(w - 1, 1)
    down = yy / max(h - 1, 1)
    noise = rng.integers(0, 12, (h, w))

    def byte(v):
        return np.clip(v * 243 + noise, 0, 255).astype(np.uint8)

    rgb = np.stack([byte(across), byte(down), byte((across + down) / 2)], -1)
    alpha = byte(1 - (across + down) / 2)
    images = {
        "rgba": PIL.fromarray(np.dstack([rgb, alpha]), "RGBA"),
        "la": PIL.fromarray(np.dstack([rgb[..., 0], alpha]), "LA"),
        "gray16": PIL.fromarray(np.clip(across * 60000 + noise * 300, 0, 65535).astype(np.uint16)),
        "rgb": PIL.fromarray(rgb, "RGB"),
        "l": PIL.fromarray(rgb[..., 1], "L"),
    }
    palette = PIL.fromarray(byte((across + down) / 2), "P")
    palette.putpalette([v for i in range(256) for v in (i, 255 - i, i // 2)])
    images["palette_trns"] = palette
    out = {}
    for name, img in images.items():
        buf = io.BytesIO()
        if name == "palette_trns":
            img.save(buf, "PNG", transparency=bytes(255 - i for i in range(256)))
        else:
            img.save(buf, "PNG")
        out[name] = (buf.getvalue(), PIL.open(io.BytesIO(buf.getvalue())))
    assert out["gray16"][1].mode == "I;16"
    assert "transparency" in out["palette_trns"][1].info
    return out


def _expected(img, mode: str, dtype: torch.dtype) -> np.ndarray:
    """What conveyor states for the whole image, H x W x C: Pillow's convert(mode), except a
    16-bit file's samples (kept in uint16; rounded to 8 bits, not clipped, in uint8)."""
    if img.mode == "I;16":
        v = np.array(img).astype(np.int64)
        if dtype == torch.uint8:
            v = (v * 255 + 32767) // 65535
        full = 65535 if dtype == torch.uint16 else 255
        planes = {"L": [v], "RGB": [v, v, v], "RGBA": [v, v, v, np.full_like(v, full)]}[mode]
        return np.stack(planes, -1)
    v = np.array(img.convert(mode)).astype(np.int64)
    if v.ndim == 2:
        v = v[..., None]
    return v * 257 if dtype == torch.uint16 else v


def _manifest(tmp_path, w: int, h: int):
    files = _files(w, h, seed=w * 1000 + h)
    names = sorted(files)
    for name in names:
        (tmp_path / f"{name}.png").write_bytes(files[name][0])
    with open(tmp_path / "m.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "label"])
        for i, name in enumerate(names):
            writer.writerow([f"{name}.png", i])
    return tmp_path / "m.csv", [files[n][1] for n in names], names


def _batches(path, transform, mode, dtype, **kwargs):
    data = conveyor.Manifest(path, fields={
        "image": conveyor.Image("image", transform=transform, mode=mode, dtype=dtype),
        "plan": conveyor.Plan("image"), "label": conveyor.Int("label")})
    return list(conveyor.DataLoader(data, batch_size=3, num_workers=2, seed=5, **kwargs))


MODES = [("RGB", 3), ("RGBA", 4), ("L", 1)]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16])
@pytest.mark.parametrize("mode,channels", MODES)
def test_whole_image_boxes_are_pillows_convert_exactly(tmp_path, mode, channels, dtype):
    path, images, names = _manifest(tmp_path, S, S)
    # A square image of the output size, a crop of all of it: no resize, flipped or not.
    transform = conveyor.RandomResizedCrop(S, scale=(1, 1), ratio=(1, 1), flip=True)
    flips = 0
    for epoch_seed in range(3):
        data = conveyor.Manifest(path, fields={
            "image": conveyor.Image("image", transform=transform, mode=mode, dtype=dtype),
            "plan": conveyor.Plan("image"), "label": conveyor.Int("label")})
        for batch in conveyor.DataLoader(data, batch_size=3, num_workers=2, seed=epoch_seed):
            image = batch["image"]
            assert image.dtype == dtype and image.shape[1:] == (channels, S, S)
            for r in range(image.shape[0]):
                x, y, w, h, flip, out_w, out_h = batch["plan"][r, 0].tolist()
                assert (x, y, w, h, out_w, out_h) == (0, 0, S, S, S, S)
                i = int(batch["label"][r])
                want = _expected(images[i], mode, dtype)
                if flip:
                    want = want[:, ::-1]
                flips += flip
                got = image[r].permute(1, 2, 0).numpy().astype(np.int64)
                assert np.array_equal(got, want), (names[i], mode, dtype)
    assert flips > 0


def test_resized_boxes_follow_pillow_and_the_rgb_rows(tmp_path):
    path, images, names = _manifest(tmp_path, 61, 47)
    transform = conveyor.RandomResizedCrop(S, flip=True, layout="HWC")
    rows = {(mode, dtype): _batches(path, transform, mode, dtype)
            for mode, _ in MODES for dtype in (torch.uint8, torch.uint16)}
    rgb = rows[("RGB", torch.uint8)]
    worst = []
    for (mode, dtype), batches in rows.items():
        channels = dict(MODES)[mode]
        for b, (got_batch, rgb_batch) in enumerate(zip(batches, rgb)):
            image = got_batch["image"]
            assert image.shape[1:] == (S, S, channels) and image.dtype == dtype
            assert torch.equal(got_batch["plan"], rgb_batch["plan"])  # the same geometry
            if mode == "RGBA" and dtype == torch.uint8:
                assert torch.equal(image[..., :3], rgb_batch["image"])
            if dtype == torch.uint16:
                narrow = rows[(mode, torch.uint8)][b]["image"]
                for r in range(image.shape[0]):
                    i = int(got_batch["label"][r])
                    if names[i] != "gray16":  # 8-bit files: v * 257 exactly
                        assert torch.equal(image[r].to(torch.int32),
                                           narrow[r].to(torch.int32) * 257)
            for r in range(image.shape[0]):
                x, y, w, h, flip, _, _ = got_batch["plan"][r, 0].tolist()
                i = int(got_batch["label"][r])
                want = _expected(images[i], mode, dtype)[y:y + h, x:x + w].astype(np.float64)
                # Pillow's bilinear resize of the box, plane by plane, against libyuv's.
                scale = 65535.0 if dtype == torch.uint16 else 255.0
                planes = [np.array(PIL.fromarray((want[..., c] / scale).astype(np.float32), "F")
                                   .resize((S, S), PIL.BILINEAR)) * scale
                          for c in range(channels)]
                want = np.stack(planes, -1)
                if flip:
                    want = want[:, ::-1]
                got = image[r].numpy().astype(np.float64)
                error = np.abs(got - want).mean() / scale * 255
                worst.append(error)
                assert error < 4, (names[i], mode, dtype, error)
    assert len(worst) == 6 * 6 and max(worst) > 0
    print(f"mean absolute difference from Pillow's bilinear resize, in 8-bit units: "
          f"largest {max(worst):.2f}")


def test_alpha_is_the_files_and_opaque_without_one(tmp_path):
    path, images, names = _manifest(tmp_path, S, S)
    transform = conveyor.RandomResizedCrop(S, scale=(1, 1), ratio=(1, 1))
    for batch in _batches(path, transform, "RGBA", torch.uint8):
        for r in range(batch["image"].shape[0]):
            alpha = batch["image"][r, 3]
            name = names[int(batch["label"][r])]
            if name in ("rgb", "l", "gray16"):
                assert (alpha == 255).all(), name
            else:
                assert alpha.min() < 100 and alpha.max() > 200, name


def test_mode_and_dtype_are_checked_and_views_refused(tmp_path):
    with pytest.raises(ValueError, match="'RGB', 'RGBA' or 'L'"):
        conveyor.Image("png", mode="rgba")
    with pytest.raises(ValueError, match="torch.uint8 or torch.uint16"):
        conveyor.Image("png", dtype=torch.int32)
    image = conveyor.Image("png", mode="L", dtype=torch.uint16)
    assert "mode='L'" in repr(image) and "uint16" in repr(image)
    path, _, _ = _manifest(tmp_path, S, S)
    views = conveyor.Views({"global": (2, conveyor.RandomResizedCrop(16))})
    with pytest.raises(ValueError, match=r'field "picture".*views.*"RGBA"'):
        conveyor.Manifest(path, fields={
            "picture": conveyor.Image("image", transform=views, mode="RGBA")})
