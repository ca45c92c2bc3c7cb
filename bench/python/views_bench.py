"""Multi-crop loading (issue 33's views): DINOv2's geometry (2 x 224 at area 0.32-1 and 8 x 96 at
0.05-0.32, each with a flip) and SimCLR's (2 x 224 at 0.08-1, flip) through Conveyor decoding
each image once for all its views, against Conveyor decoding each view on its own
(Views(decode_once=False)), and against PyTorch's DataLoader running torchvision v2's
RandomResizedCrop + RandomHorizontalFlip per view on PIL images (2 worker processes).

    python bench/python/views_bench.py [--data DIR] [--images 500] [--workers 2] [--rounds 3]
        [--recipe dino|simclr] [--compare-alone]

The data: `--images` photo-like JPEGs of about 500x375 (conveyor.generate_image_folder, written
once into DIR, default ~/.cache/conveyor/datasets/views-500x375). Every loader gives uint8
tensors per group, [B, count, 3, S, S], batch 64. Rounds interleave the loaders; each figure is
the median samples/s over the rounds, each ratio the median of per-round ratios.
`--compare-alone` prints instead how far views decoded once are from the same views decoded
alone: the share of identical views, and the max abs difference and PSNR of the others.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

import torch

import conveyor

BATCH = 64
RECIPES = {
    "dino": {"global": (2, 224, (0.32, 1.0)), "local": (8, 96, (0.05, 0.32))},
    "simclr": {"view": (2, 224, (0.08, 1.0))},
}


def views(recipe, decode_once=True):
    return conveyor.Views({name: (count, conveyor.RandomResizedCrop(size, scale=scale, flip=True))
                           for name, (count, size, scale) in RECIPES[recipe].items()},
                          decode_once=decode_once)


def run_conveyor(root, recipe, workers, decode_once):
    data = conveyor.ImageFolder(str(root), transform=views(recipe, decode_once))
    loader = conveyor.DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=workers, seed=0)
    samples, start = 0, time.perf_counter()
    for batch in loader:
        samples += batch["label"].shape[0]
    return samples / (time.perf_counter() - start)


class TorchvisionViews(torch.utils.data.Dataset):
    """torchvision v2 on PIL: each view RandomResizedCrop + RandomHorizontalFlip, then
    PILToTensor, stacked per group, as DINO's DataAugmentationDINO does its crops."""

    def __init__(self, root, recipe):
        from torchvision import datasets
        from torchvision.transforms import v2
        self.folder = datasets.ImageFolder(str(root))
        self.groups = {name: (count, v2.Compose([
            v2.RandomResizedCrop(size, scale=scale, antialias=True),
            v2.RandomHorizontalFlip(), v2.PILToTensor()]))
            for name, (count, size, scale) in RECIPES[recipe].items()}

    def __len__(self):
        return len(self.folder)

    def __getitem__(self, i):
        image, label = self.folder[i]  # PIL RGB
        out = {name: torch.stack([t(image) for _ in range(count)])
               for name, (count, t) in self.groups.items()}
        out["label"] = label
        return out


def run_torch(root, recipe, workers):
    loader = torch.utils.data.DataLoader(TorchvisionViews(root, recipe), batch_size=BATCH,
                                         shuffle=True, num_workers=workers)
    samples, start = 0, time.perf_counter()
    for batch in loader:
        samples += batch["label"].shape[0]
    return samples / (time.perf_counter() - start)


def compare_alone(root, recipe):
    def batches(decode_once):
        data = conveyor.ImageFolder(str(root), transform=views(recipe, decode_once))
        return [{k: v.clone() for k, v in zip(b.names, b)}
                for b in conveyor.DataLoader(data, batch_size=BATCH, num_workers=2, seed=0)]
    identical = total = 0
    worst, psnrs = 0, []
    for once, alone in zip(batches(True), batches(False)):
        for name in RECIPES[recipe]:
            for a, b in zip(once[name].flatten(0, 1), alone[name].flatten(0, 1)):
                total += 1
                diff = (a.int() - b.int())
                if diff.abs().max() == 0:
                    identical += 1
                    continue
                worst = max(worst, int(diff.abs().max()))
                mse = float((diff.float() ** 2).mean())
                psnrs.append(10 * math.log10(255 ** 2 / mse))
    print(f"{recipe}: {total} views, {identical} identical to their own decode "
          f"({100 * identical / total:.1f}%); the others: max abs diff {worst}, PSNR median "
          f"{statistics.median(psnrs):.1f} dB, min {min(psnrs):.1f} dB" if psnrs else
          f"{recipe}: {total} views, all identical to their own decode")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path,
                        default=Path.home() / ".cache/conveyor/datasets/views-500x375")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="dino")
    parser.add_argument("--compare-alone", action="store_true")
    parser.add_argument("--skip-torch", action="store_true")
    args = parser.parse_args()
    conveyor.generate_image_folder(str(args.data), classes=1, images_per_class=args.images, seed=5)
    if args.compare_alone:
        compare_alone(args.data, args.recipe)
        return
    torch.set_num_threads(1)
    runs = {"once": lambda: run_conveyor(args.data, args.recipe, args.workers, True),
            "alone": lambda: run_conveyor(args.data, args.recipe, args.workers, False)}
    if not args.skip_torch:
        runs["torch"] = lambda: run_torch(args.data, args.recipe, args.workers)
    rates = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, run in runs.items():
            rates[name].append(run())
        print(f"round {r}: " + ", ".join(f"{n} {v[-1]:.1f}/s" for n, v in rates.items()),
              flush=True)
    summary = ", ".join(f"{n} {statistics.median(v):.1f} samples/s" for n, v in rates.items())
    ratios = ", ".join(
        f"once/{n} {statistics.median(a / b for a, b in zip(rates['once'], v)):.2f}x"
        for n, v in rates.items() if n != "once")
    print(f"{args.recipe}: {summary}; {ratios} ({args.workers} workers, {args.images} images "
          f"of about 500x375, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
