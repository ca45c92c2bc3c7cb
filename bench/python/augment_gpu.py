"""The batch stage on a GPU (issue 34): its time per batch, and a training step with it against
the step without it. Run by `scripts/gpu-check run` (step augment_gpu); skips without CUDA.

    python3 bench/python/augment_gpu.py [--data DIR] [--batch 256] [--size 224] [--steps 20]

1. stage: torchvision's v2 recipe's batch stage (TrivialAugmentWide, RandomErasing(0.1),
   Normalize, MixUpCutMix(0.2, 1.0)) run by conveyor.augment.apply on one uint8 CUDA batch
   [batch, 3, size, size] of photo-like images: ms per batch (CUDA-synchronized, median), and
   the same for Normalize alone; then DINOv2's per-view stage (examples/recipes/dinov2.py) on
   a batch of 32 images' 10 views.
2. step: a small ConvNet's forward, backward and SGD step on batches from
   conveyor.DataLoader(device="cuda") with the recipe as batch_transform, against the same
   loader with Normalize alone: each step's GPU time (CUDA events on the training stream, which
   the stage's kernels on the loader's side stream may slow down), median over --steps after 3
   warm-up steps, and the ratio with / without (the issue's target: <= 1.02).
Prints one line per figure, "augment-gpu: ...", which gpu-check copies into its summary.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

import conveyor

aug = conveyor.augment


def photo_like(n, size, device):
    g = torch.Generator().manual_seed(0)
    coarse = torch.rand(n, 3, 6, 6, generator=g) * 255
    smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear")
    noisy = smooth + torch.randn(n, 3, size, size, generator=g) * 6
    return noisy.clamp(0, 255).to(torch.uint8).to(device)


def recipe(classes):
    return aug.Compose([aug.TrivialAugmentWide(interpolation="bilinear"), aug.RandomErasing(p=0.1),
                        aug.Normalize(), aug.MixUpCutMix(mixup_alpha=0.2, cutmix_alpha=1.0,
                                                         num_classes=classes,
                                                         label_smoothing=0.1)])


def stage_ms(transform, batch, rounds=10):
    """The median ms of ``transform`` on copies of the ``batch`` dict, after 2 warm-up rounds."""
    times = []
    for r in range(rounds + 2):
        fields = {name: t.clone() for name, t in batch.items()}
        torch.cuda.synchronize()
        start = time.perf_counter()
        aug.apply(transform, fields, seed=r, epoch=0, sequence=r)
        torch.cuda.synchronize()
        if r >= 2:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def dinov2_stage(batch, device):
    """DINOv2's per-view stage (examples/recipes/dinov2.py's pipelines) and a batch of its
    views: "global" [batch, 2, 3, 224, 224], "local" [batch, 8, 3, 96, 96], uint8 on device."""
    def photometric(*extra):
        return aug.Compose([aug.ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8), aug.RandomGrayscale(0.2),
                            *extra, aug.Normalize()])

    def blur(p):
        return aug.GaussianBlur(9, (0.1, 2.0), p=p)

    transform = aug.PerField({"global": [photometric(blur(1.0)),
                                         photometric(blur(0.1), aug.RandomSolarize(128, p=0.2))],
                              "local": photometric(blur(0.5))})
    views = {"global": photo_like(batch * 2, 224, device).view(batch, 2, 3, 224, 224),
             "local": photo_like(batch * 8, 96, device).view(batch, 8, 3, 96, 96)}
    return transform, views


def model(classes):
    c = torch.nn
    return c.Sequential(
        c.Conv2d(3, 64, 7, 2, 3), c.BatchNorm2d(64), c.ReLU(), c.MaxPool2d(3, 2, 1),
        c.Conv2d(64, 128, 3, 2, 1), c.BatchNorm2d(128), c.ReLU(),
        c.Conv2d(128, 256, 3, 2, 1), c.BatchNorm2d(256), c.ReLU(),
        c.Conv2d(256, 512, 3, 2, 1), c.BatchNorm2d(512), c.ReLU(),
        c.AdaptiveAvgPool2d(1), c.Flatten(), c.Linear(512, classes)).cuda()


def step_ms(root, classes, transform, args):
    data = conveyor.ImageFolder(root, transform=conveyor.RandomResizedCrop(args.size, flip=True))
    loader = conveyor.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                 num_workers=args.workers, device="cuda", seed=1,
                                 batch_transform=transform)
    net = model(classes)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    times = []
    while len(times) < args.steps + 3:
        for images, targets in loader:
            if targets.dim() == 1:  # Normalize alone: hard labels
                targets = torch.nn.functional.one_hot(targets, classes).float()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = torch.nn.functional.cross_entropy(net(images), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            if len(times) >= args.steps + 3:
                break
    return statistics.median(times[3:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="an ImageFolder (default: a generated one)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("augment-gpu: skipped (no CUDA device)")
        return 0
    images = photo_like(args.batch, args.size, "cuda")
    labels = torch.randint(0, 10, (args.batch,), device="cuda")
    full = stage_ms(recipe(10), {"image": images, "label": labels})
    norm = stage_ms(aug.Normalize(), {"image": images, "label": labels})
    print(f"augment-gpu: stage per batch of {args.batch} at {args.size}: recipe {full:.2f} ms, "
          f"Normalize alone {norm:.2f} ms", flush=True)
    transform, views = dinov2_stage(32, "cuda")
    print(f"augment-gpu: DINOv2's per-view stage per batch of 32 (2 x 224 + 8 x 96 views): "
          f"{stage_ms(transform, views, rounds=3):.1f} ms", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            root = os.path.join(tmp, "folder")
            conveyor.generate_image_folder(root, classes=10, images_per_class=64)
        classes = len([d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))])
        without = step_ms(root, classes, aug.Normalize(), args)
        with_stage = step_ms(root, classes, recipe(classes), args)
    print(f"augment-gpu: training step {with_stage:.2f} ms with the recipe's stage, "
          f"{without:.2f} ms with Normalize alone: ratio {with_stage / without:.3f} "
          f"(target <= 1.02)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
