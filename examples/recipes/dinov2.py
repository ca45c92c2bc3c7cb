"""DINOv2's multi-crop augmentation (dinov2/data/augmentations.py, DataAugmentationDINO) as a
Conveyor loader: 2 global views and 8 local views of each image, each view with its own
photometric recipe.

    views (per sample, in the decode: one decode for all 10 views)
      global: 2 x RandomResizedCrop(224, scale=(0.32, 1.0)) + horizontal flip
      local:  8 x RandomResizedCrop(96, scale=(0.05, 0.32)) + horizontal flip
    photometric (per view, the batch stage), "colour" being
      RandomApply([ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8) then RandomGrayscale(p=0.2):
      global view 0: colour, GaussianBlur(9, (0.1, 2.0)) p=1.0, Normalize
      global view 1: colour, GaussianBlur p=0.1, RandomSolarize(128) p=0.2, Normalize
      local views:   colour, GaussianBlur p=0.5, Normalize

batch["global"] is float32 [B, 2, 3, 224, 224], batch["local"] float32 [B, 8, 3, 96, 96]. Every
random choice is a pure function of (seed, epoch, index, view): the batches are the same for any
num_workers and after a state_dict resume. What differs from DINOv2's code: the crops are
resized with libyuv's bilinear filter, not PIL's bicubic; each view's streams are Conveyor's,
not torch's global RNG.

    python examples/recipes/dinov2.py                 # on a generated folder
    python examples/recipes/dinov2.py --data DIR --workers 8 --batches 100
"""
from __future__ import annotations

import argparse
import tempfile
import time

import conveyor

aug = conveyor.augment


def photometric(*extra: aug.BatchTransform) -> aug.Compose:
    """DINOv2's colour jittering, then ``extra``, then Normalize."""
    return aug.Compose([
        aug.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, p=0.8),
        aug.RandomGrayscale(p=0.2),
        *extra,
        aug.Normalize(conveyor.IMAGENET_MEAN, conveyor.IMAGENET_STD),
    ])


def blur(p: float) -> aug.GaussianBlur:
    """DINOv2's GaussianBlur(p): RandomApply([GaussianBlur(9, sigma=(0.1, 2.0))], p)."""
    return aug.GaussianBlur(9, (0.1, 2.0), p=p)


def make_loader(root: str, *, batch_size: int = 64, num_workers=None, seed: int = 0,
                image_size: int = 224, local_size=None, local_crops: int = 8,
                device=None, **loader_options) -> conveyor.DataLoader:
    """The recipe's training loader over the ImageFolder at ``root``; ``local_size`` defaults
    to ``image_size * 96 // 224`` (96 at 224)."""
    local_size = local_size or max(1, image_size * 96 // 224)
    views = conveyor.Views({
        "global": (2, conveyor.RandomResizedCrop(image_size, scale=(0.32, 1.0), flip=True)),
        "local": (local_crops, conveyor.RandomResizedCrop(local_size, scale=(0.05, 0.32),
                                                          flip=True)),
    })
    transform = {
        "global": [photometric(blur(1.0)),
                   photometric(blur(0.1), aug.RandomSolarize(128, p=0.2))],
        "local": photometric(blur(0.5)),
    }
    return conveyor.DataLoader(conveyor.ImageFolder(root, transform=views),
                               batch_size=batch_size, shuffle=True, num_workers=num_workers,
                               seed=seed, drop_last=True, device=device,
                               batch_transform=transform, **loader_options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="an ImageFolder (default: a generated one)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--batches", type=int, default=5, help="batches to run (0: an epoch)")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            root = f"{tmp}/folder"
            conveyor.generate_image_folder(root, classes=4, images_per_class=40)
        loader = make_loader(root, batch_size=args.batch_size, num_workers=args.workers,
                             image_size=args.size, device=args.device)
        start = time.perf_counter()
        seen = 0
        for step, batch in enumerate(loader):
            seen += batch["global"].shape[0]
            print(f"batch {step}: global {tuple(batch['global'].shape)}, "
                  f"local {tuple(batch['local'].shape)} {batch['local'].dtype}", flush=True)
            if args.batches and step + 1 >= args.batches:
                break
        elapsed = time.perf_counter() - start
        print(f"{seen} images ({seen * 10} views) in {elapsed:.2f} s "
              f"({seen / elapsed:,.1f} images/s)")


if __name__ == "__main__":
    main()
