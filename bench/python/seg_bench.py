"""Segmentation loading (issue 32's masks): image + mask pairs through Conveyor against PyTorch's
DataLoader, the same geometry on all (RandomResizedCrop --crop + horizontal flip applied to the
image, bilinear, and to its mask, nearest), 2 workers each, batch 64, uint8 tensors out.

    python bench/python/seg_bench.py [--data DIR] [--pairs 500] [--workers 2] [--rounds 3]
        [--epochs 2] [--crop 224] [--loaders conveyor,torch-pil,torchvision-v2]

The data (written once into DIR, default ~/.cache/conveyor/datasets/seg-500x375): `--pairs`
photo-like JPEGs of about 500x375 (conveyor.generate_image_folder) and beside each a palette PNG mask
of the same size (21 classes in blobs, VOC-like), listed in train.csv (columns image, mask).

- conveyor: conveyor.Manifest(train.csv, fields={"image": Image("image", RandomResizedCrop(224)),
  "mask": Mask("mask")}) in conveyor.DataLoader(num_workers=2);
- torch-pil: a map-style Dataset that opens both with PIL (convert("RGB") for the image, the
  palette indices kept for the mask), draws torchvision's RandomResizedCrop box with Python's
  random (torchvision-free: the same rules as get_params), crops and resizes the image BILINEAR and
  the mask NEAREST with PIL, flips both with p=0.5, and returns uint8 tensors ([3,224,224] and
  [224,224]) to torch's DataLoader with 2 worker processes;
- torchvision-v2: the same Dataset written as torchvision v2's users write it: torchvision.io's
  decode_image (the image read as RGB, the mask UNCHANGED: palette indices), wrapped as
  tv_tensors.Image and tv_tensors.Mask, and one v2.Compose([RandomResizedCrop(crop, antialias=True),
  RandomHorizontalFlip()]) called on the pair, so the mask takes the image's box and flip with
  nearest resampling (torchvision's paired transforms).

Rounds interleave the loaders; each figure is the median pairs/s over the rounds, and each ratio
is the median of per-round ratios (conveyor / the peer).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import conveyor

CROP = 224
BATCH = 64


def write_data(root: Path, pairs: int) -> Path:
    manifest = root / "train.csv"
    if manifest.exists():
        return manifest
    conveyor.generate_image_folder(str(root / "img"), classes=1, images_per_class=pairs, seed=5)
    files = sorted((root / "img").rglob("*.jpg"))
    rng = np.random.default_rng(0)
    rows = []
    for i, path in enumerate(files):
        with Image.open(path) as image:
            width, height = image.size
        yy, xx = np.mgrid[0:height, 0:width]
        mask = np.zeros((height, width), np.uint8)
        for _ in range(6):  # blobs of classes 1..20 on background 0, 255 on their borders
            cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(30, 120)
            d = np.hypot(xx - cx, yy - cy)
            mask[d < r] = rng.integers(1, 21)
            mask[(d >= r) & (d < r + 3)] = 255
        img = Image.fromarray(mask, mode="P")
        img.putpalette([(c * 53) % 256 for c in range(768)])
        out = root / f"{i:05d}.png"
        img.save(out)
        rows.append({"image": str(path), "mask": str(out)})
    with open(manifest, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["image", "mask"])
        writer.writeheader()
        writer.writerows(rows)
    return manifest


def crop_box(width, height, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params, with `rng` (random.Random)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    w, h = width, height
    if in_ratio < ratio[0]:
        h = int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        w = int(round(h * ratio[1]))
    return (width - w) // 2, (height - h) // 2, w, h


class PilPairs(torch.utils.data.Dataset):
    def __init__(self, manifest: Path, crop: int):
        self.crop = crop
        with open(manifest) as f:
            self.rows = list(csv.DictReader(f))
        self.rng = random.Random()

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        image = Image.open(row["image"]).convert("RGB")
        mask = Image.open(row["mask"])
        mask.load()  # palette indices, never converted
        x, y, w, h = crop_box(image.width, image.height, self.rng)
        box = (x, y, x + w, y + h)
        image = image.resize((self.crop, self.crop), Image.BILINEAR, box=box)
        mask = mask.resize((self.crop, self.crop), Image.NEAREST, box=box)
        if self.rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
            mask = mask.transpose(Image.FLIP_LEFT_RIGHT)
        return (torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1),
                torch.from_numpy(np.asarray(mask).copy()))


class TorchvisionPairs(torch.utils.data.Dataset):
    """The pair through torchvision v2's paired transforms (tv_tensors.Image + tv_tensors.Mask)."""

    def __init__(self, manifest: Path, crop: int):
        from torchvision.transforms import v2

        with open(manifest) as f:
            self.rows = list(csv.DictReader(f))
        self.transform = v2.Compose([v2.RandomResizedCrop(crop, antialias=True),
                                     v2.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        from torchvision import io, tv_tensors

        row = self.rows[i]
        image = io.decode_image(io.read_file(row["image"]), mode=io.ImageReadMode.RGB)
        mask = io.decode_image(io.read_file(row["mask"]), mode=io.ImageReadMode.UNCHANGED)
        image, mask = self.transform(tv_tensors.Image(image), tv_tensors.Mask(mask[0]))
        return image.as_subclass(torch.Tensor), mask.as_subclass(torch.Tensor)


def run_conveyor(manifest, workers, epochs, crop):
    data = conveyor.Manifest(manifest, fields={
        "image": conveyor.Image("image", transform=conveyor.RandomResizedCrop(crop, flip=True)),
        "mask": conveyor.Mask("mask", follows="image")})
    loader = conveyor.DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=workers, seed=0)
    pairs, start = 0, time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            assert batch["mask"].shape[1:] == (crop, crop)
            pairs += batch["image"].shape[0]
    return pairs / (time.perf_counter() - start)


def run_torch(dataset, workers, epochs, crop):
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True,
                                         num_workers=workers, persistent_workers=True)
    pairs, start = 0, time.perf_counter()
    for _ in range(epochs):
        for images, masks in loader:
            assert images.shape[1:] == (3, crop, crop) and masks.shape[1:] == (crop, crop)
            assert masks.dtype == torch.uint8
            pairs += images.shape[0]
    return pairs / (time.perf_counter() - start)


LOADERS = {
    "conveyor": run_conveyor,
    "torch-pil": lambda m, w, e, c: run_torch(PilPairs(m, c), w, e, c),
    "torchvision-v2": lambda m, w, e, c: run_torch(TorchvisionPairs(m, c), w, e, c),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path,
                        default=Path.home() / ".cache/conveyor/datasets/seg-500x375")
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--crop", type=int, default=CROP, help="the output size (issue 32: 512)")
    parser.add_argument("--loaders", default="conveyor,torch-pil,torchvision-v2",
                        help=f"comma-separated, conveyor first: {','.join(LOADERS)}")
    args = parser.parse_args()
    names = args.loaders.split(",")
    unknown = [n for n in names if n not in LOADERS]
    if unknown or names[0] != "conveyor":
        parser.error(f"--loaders: conveyor first, then any of {', '.join(LOADERS)}; got {unknown}")
    args.data.mkdir(parents=True, exist_ok=True)
    manifest = write_data(args.data, args.pairs)
    torch.set_num_threads(1)
    rates = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names:
            rates[name].append(LOADERS[name](manifest, args.workers, args.epochs, args.crop))
        print(f"round {r}: " + ", ".join(f"{n} {rates[n][-1]:.0f} pairs/s" for n in names),
              flush=True)
    summary = [f"conveyor {statistics.median(rates['conveyor']):.0f} pairs/s"]
    for name in names[1:]:
        ratio = statistics.median(c / t for c, t in zip(rates["conveyor"], rates[name]))
        summary.append(f"{name} {statistics.median(rates[name]):.0f} pairs/s (ratio {ratio:.2f}x)")
    print(", ".join(summary) + f" ({args.workers} workers, {args.pairs} pairs of 500x375, crop "
          f"{args.crop}, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
