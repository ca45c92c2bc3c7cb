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

import os
import sys

import conveyor

if (here := os.path.dirname(os.path.abspath(__file__))) not in sys.path:
    sys.path.insert(0, here)  # recipe_main.py beside this file, also when loaded by path
import recipe_main  # noqa: E402

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


def describe(batch) -> tuple[int, str]:
    """A batch's image count and the shapes of its views."""
    return batch["global"].shape[0], (f"global {tuple(batch['global'].shape)}, "
                                      f"local {tuple(batch['local'].shape)} "
                                      f"{batch['local'].dtype}")


def main() -> None:
    recipe_main.run(__doc__, make_loader, describe, batch_size=64, batches=5, classes=4,
                    images_per_class=40, views=10)


if __name__ == "__main__":
    main()
