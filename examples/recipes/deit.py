"""DeiT's ImageNet training augmentation (timm's create_transform and Mixup, DeiT's RASampler)
as a Conveyor loader.

DeiT's main.py defaults: `--aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0
--smoothing 0.1 --repeated-aug` (3 repeats); colour jitter is not applied when an auto-augment
policy is (timm's create_transform):

    RandomResizedCrop(224, bilinear) + horizontal flip      per sample, in the decode
    RandAugment.timm("rand-m9-mstd0.5-inc1")                per sample, the batch stage
    Normalize(ImageNet mean, std)                           uint8 to float32
    RandomErasing(p=0.25) after Normalize                   per sample (value 0: timm's
                                                            "const" mode; DeiT's "pixel" mode
                                                            fills normal noise, not offered)
    MixUp(0.8) or CutMix(1.0), switch 0.5, smoothing 0.1    per batch: soft targets
    repeated augmentation x3 (RASampler)                    each image 3 times an epoch

    python examples/recipes/deit.py                 # on a generated folder
    python examples/recipes/deit.py --data DIR --workers 8 --batches 100
"""
from __future__ import annotations

import os
import sys

import conveyor

if (here := os.path.dirname(os.path.abspath(__file__))) not in sys.path:
    sys.path.insert(0, here)  # recipe_main.py beside this file, also when loaded by path
import recipe_main  # noqa: E402

aug = conveyor.augment


def make_loader(root: str, *, batch_size: int = 256, num_workers=None, seed: int = 0,
                image_size: int = 224, num_replicas: int = 1, rank: int = 0,
                selected_round: int = 256, device=None) -> conveyor.DataLoader:
    """The recipe's training loader over the ImageFolder at ``root`` (``selected_round`` as
    DeiT's RASampler: 256; 0 keeps every image, for small folders)."""
    num_classes = len([d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))])
    train = conveyor.ImageFolder(root, transform=conveyor.RandomResizedCrop(image_size,
                                                                           flip=True))
    transform = aug.Compose([
        aug.RandAugment.timm("rand-m9-mstd0.5-inc1"),
        aug.Normalize(conveyor.IMAGENET_MEAN, conveyor.IMAGENET_STD),
        aug.RandomErasing(p=0.25),
        aug.MixUpCutMix(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5,
                        num_classes=num_classes, label_smoothing=0.1),
    ])
    sampler = conveyor.RASampler(num_replicas=num_replicas, rank=rank, num_repeats=3,
                                 selected_round=selected_round)
    return conveyor.DataLoader(train, batch_size=batch_size, sampler=sampler,
                               num_workers=num_workers, seed=seed, drop_last=True,
                               device=device, batch_transform=transform)


def main() -> None:
    recipe_main.run(__doc__, make_loader, recipe_main.describe_soft_targets, selected_round=0)


if __name__ == "__main__":
    main()
