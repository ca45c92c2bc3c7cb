"""The augmentation ops' CPU cost and torchvision's classification recipe (issue 34).

    PY=/path/to/venv/bin/python   # with conveyor installed, and torchvision for --recipe
    $PY bench/python/augment_bench.py --ops [--batch 256 --size 224 --rounds 3] [--only TEXT]
    $PY bench/python/augment_bench.py --recipe [--data DIR] [--workers 2] [--rounds 3]

Run with OMP_NUM_THREADS=1 on a shared machine: the ops make many small ATen calls per image, and
two OpenMP threads per call on oversubscribed cores spin (measured 100x slower for ColorJitter
with hue under a load average of 15 on 2 cores).

--ops: each op alone on one uint8 batch [batch, 3, size, size] of photo-like images, run by
conveyor.augment.apply (what a CPU loader's worker runs), the median of --rounds; beside it the
same op from torchvision.transforms.v2 on each image of the batch in a loop (its transform
object per image, as a dataset's __getitem__ would), when torchvision is installed.

--recipe: torchvision's v2 classification recipe, RandomResizedCrop 224 + flip +
TrivialAugmentWide + RandomErasing(0.1), then MixUp(0.2)/CutMix(1.0) on the batch (labels made
soft targets), batches of 256, --epochs over --data (default: the photos of conveyor-bench,
~/.cache/conveyor/datasets/photos-v1-10x150):
  - conveyor: ImageFolder(RandomResizedCrop(224, flip=True)), DataLoader(num_workers=--workers,
    batch_transform=Compose([TrivialAugmentWide(), RandomErasing(0.1), MixUpCutMix(0.2, 1.0)]));
  - torch: torchvision ImageFolder on PIL with v2.Compose([RandomResizedCrop(224), flip,
    TrivialAugmentWide(), PILToTensor(), RandomErasing(0.1)]) in torch's DataLoader with
    --workers worker processes, then v2.RandomChoice([MixUp(0.2), CutMix(1.0)]) on each batch
    in the loop (on the batch made float: its MixUp refuses uint8).
Rounds interleave the two; the ratio is the median of the per-round ratios.

--dinov2: DINOv2's multi-crop recipe (2 global views at 224, 8 local at 96, each view's colour
jitter, grayscale, blur and solarize as dinov2/data/augmentations.py), batches of 64, --epochs
over --data:
  - conveyor: examples/recipes/dinov2.py's make_loader (views decoded once, the per-view
    pipelines as batch_transform={"global": [...], "local": ...}), --workers threads;
  - torch: DINOv2's DataAugmentationDINO written with torchvision v2 on PIL (bicubic crops, as
    DINOv2's) in torchvision's ImageFolder and torch's DataLoader with --workers processes.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path

import torch

import conveyor

aug = conveyor.augment
DEFAULT_DATA = Path.home() / ".cache/conveyor/datasets/photos-v1-10x150"


def photo_like(n, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 6, 6, generator=g) * 255
    smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear")
    return (smooth + torch.randn(n, 3, size, size, generator=g) * 6).clamp(0, 255).to(torch.uint8)


def ops_table(args):
    try:
        from torchvision.transforms import v2
    except ImportError:
        v2 = None
    ops = [
        ("ColorJitter(0.4, 0.4, 0.2, 0.1)", aug.ColorJitter(0.4, 0.4, 0.2, 0.1),
         lambda: v2.ColorJitter(0.4, 0.4, 0.2, 0.1)),
        ("ColorJitter(0.4, 0.4, 0.2) (no hue)", aug.ColorJitter(0.4, 0.4, 0.2),
         lambda: v2.ColorJitter(0.4, 0.4, 0.2)),
        ("RandomGrayscale(p=1)", aug.RandomGrayscale(p=1.0), lambda: v2.RandomGrayscale(p=1.0)),
        ("GaussianBlur(23, (0.1, 2))", aug.GaussianBlur(23, (0.1, 2.0)),
         lambda: v2.GaussianBlur(23, (0.1, 2.0))),
        ("GaussianBlur(9, (0.1, 2)) (DINOv2's)", aug.GaussianBlur(9, (0.1, 2.0)),
         lambda: v2.GaussianBlur(9, (0.1, 2.0))),
        ("RandomSolarize(128, p=1)", aug.RandomSolarize(128, p=1.0),
         lambda: v2.RandomSolarize(128, p=1.0)),
        ("TrivialAugmentWide()", aug.TrivialAugmentWide(), lambda: v2.TrivialAugmentWide()),
        ("RandAugment(2, 9)", aug.RandAugment(2, 9), lambda: v2.RandAugment(2, 9)),
        ("RandAugment.timm(rand-m9-mstd0.5-inc1)", aug.RandAugment.timm("rand-m9-mstd0.5-inc1"),
         None),
        ("AutoAugment(IMAGENET)", aug.AutoAugment(), lambda: v2.AutoAugment()),
        ("RandomErasing(p=1)", aug.RandomErasing(p=1.0), lambda: v2.RandomErasing(p=1.0)),
        ("MixUpCutMix(0.8, 1.0)", aug.MixUpCutMix(num_classes=1000), None),
        ("MixUp(0.8) (uint8 batch)", aug.MixUp(alpha=0.8, num_classes=1000), None),
        ("CutMix(1.0) (uint8 batch)", aug.CutMix(alpha=1.0, num_classes=1000), None),
        ("Normalize (uint8 to float32)", aug.Normalize(), None),
    ]
    images = photo_like(args.batch, args.size)
    labels = torch.randint(0, 1000, (args.batch,))
    print(f"per op, batch {args.batch} x 3 x {args.size} x {args.size} uint8, "
          f"{torch.get_num_threads()} ATen threads, median of {args.rounds}")
    print("| op | Conveyor ms/batch | torchvision v2 per image, ms/batch | torchvision / Conveyor |")
    print("|---|---|---|---|")
    for name, op, tv in ops:
        if args.only and args.only not in name:
            continue
        times = []
        for r in range(args.rounds):
            fields = {"image": images.clone(), "label": labels.clone()}
            start = time.perf_counter()
            aug.apply(op, fields, seed=r, epoch=0)
            times.append(time.perf_counter() - start)
        ours = statistics.median(times) * 1000
        theirs = ""
        ratio = ""
        if v2 is not None and tv is not None:
            t = tv()
            tv_times = []
            for r in range(args.rounds):
                torch.manual_seed(r)
                start = time.perf_counter()
                for i in range(args.batch):
                    t(images[i])
                tv_times.append(time.perf_counter() - start)
            theirs_ms = statistics.median(tv_times) * 1000
            theirs = f"{theirs_ms:,.0f}"
            ratio = f"{theirs_ms / ours:.2f}x"
        print(f"| {name} | {ours:,.0f} | {theirs} | {ratio} |", flush=True)


def run_conveyor(data, workers, epochs):
    train = conveyor.ImageFolder(str(data), transform=conveyor.RandomResizedCrop(224, flip=True))
    recipe = aug.Compose([aug.TrivialAugmentWide(), aug.RandomErasing(p=0.1),
                          aug.MixUpCutMix(mixup_alpha=0.2, cutmix_alpha=1.0,
                                          num_classes=len(os.listdir(data)),
                                          label_smoothing=0.0)])
    loader = conveyor.DataLoader(train, batch_size=256, shuffle=True, num_workers=workers,
                                 seed=0, batch_transform=recipe)
    n = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for images, targets in loader:
            n += images.shape[0]
    return n / (time.perf_counter() - start)


def run_torch(data, workers, epochs):
    import torchvision
    from torchvision.transforms import v2

    t = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                    v2.TrivialAugmentWide(), v2.PILToTensor(), v2.RandomErasing(p=0.1)])
    dataset = torchvision.datasets.ImageFolder(str(data), transform=t)
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=len(dataset.classes)),
                           v2.CutMix(alpha=1.0, num_classes=len(dataset.classes))])
    loader = torch.utils.data.DataLoader(dataset, batch_size=256, shuffle=True,
                                         num_workers=workers, persistent_workers=True,
                                         prefetch_factor=2)
    n = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for images, labels in loader:
            images, targets = mix(images.float(), labels)  # its MixUp takes float images
            n += images.shape[0]
    return n / (time.perf_counter() - start)


def rounds(args, run_ours, run_theirs, what=""):
    """--rounds of the two loaders in turn on --data; prints each round and the medians."""
    data = Path(args.data) if args.data else DEFAULT_DATA
    rows = []
    for r in range(args.rounds):
        c = run_ours(data, args.workers, args.epochs)
        t = run_theirs(data, args.workers, args.epochs)
        rows.append((c, t))
        print(f"round {r + 1}: conveyor {c:,.1f} images/s, torch {t:,.1f} images/s, "
              f"ratio {c / t:.2f}x{what}", flush=True)
    print(f"median: conveyor {statistics.median(c for c, _ in rows):,.1f}, torch "
          f"{statistics.median(t for _, t in rows):,.1f} images/s, ratio "
          f"{statistics.median(c / t for c, t in rows):.2f}x")


def recipe(args):
    rounds(args, run_conveyor, run_torch)


def dinov2_loader(data, workers):
    spec = importlib.util.spec_from_file_location(
        "dinov2", Path(__file__).resolve().parents[2] / "examples" / "recipes" / "dinov2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_loader(str(data), batch_size=64, num_workers=workers)


def run_conveyor_dinov2(data, workers, epochs):
    loader = dinov2_loader(data, workers)
    n = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            n += batch["global"].shape[0]
    return n / (time.perf_counter() - start)


class DinoAugmentation:
    """DINOv2's DataAugmentationDINO (global crops scale 0.32-1, local 0.05-0.32, 8 local crops),
    with torchvision v2 on PIL images."""

    def __init__(self):
        from torchvision.transforms import InterpolationMode, v2

        def crop(size, scale):
            return v2.Compose([v2.RandomResizedCrop(size, scale=scale,
                                                    interpolation=InterpolationMode.BICUBIC),
                               v2.RandomHorizontalFlip(p=0.5)])

        def blur(p):
            return v2.RandomApply([v2.GaussianBlur(9, sigma=(0.1, 2.0))], p=p)

        colour = v2.Compose([v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                             v2.RandomGrayscale(p=0.2)])
        normalize = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                                v2.Normalize(conveyor.IMAGENET_MEAN, conveyor.IMAGENET_STD)])
        self.global_crop = crop(224, (0.32, 1.0))
        self.local_crop = crop(96, (0.05, 0.32))
        self.global_0 = v2.Compose([colour, blur(1.0), normalize])
        self.global_1 = v2.Compose([colour, blur(0.1), v2.RandomSolarize(128, p=0.2), normalize])
        self.local = v2.Compose([colour, blur(0.5), normalize])

    def __call__(self, image):
        return {"global": torch.stack([self.global_0(self.global_crop(image)),
                                       self.global_1(self.global_crop(image))]),
                "local": torch.stack([self.local(self.local_crop(image)) for _ in range(8)])}


def run_torch_dinov2(data, workers, epochs):
    import torchvision

    dataset = torchvision.datasets.ImageFolder(str(data), transform=DinoAugmentation())
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True,
                                         num_workers=workers, persistent_workers=True,
                                         prefetch_factor=2, drop_last=True)
    n = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for views, labels in loader:
            n += views["global"].shape[0]
    return n / (time.perf_counter() - start)


def dinov2(args):
    rounds(args, run_conveyor_dinov2, run_torch_dinov2, " (10 views an image)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", action="store_true")
    parser.add_argument("--recipe", action="store_true")
    parser.add_argument("--dinov2", action="store_true")
    parser.add_argument("--only", help="--ops: only the ops whose name contains this text")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    if args.ops:
        ops_table(args)
    if args.recipe:
        recipe(args)
    if args.dinov2:
        dinov2(args)


if __name__ == "__main__":
    main()
