"""torchvision's v2 ImageNet classification recipe as a Conveyor loader.

The augmentation half of torchvision's references/classification (the v2 weights' recipe:
`--auto-augment ta_wide --random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0
--label-smoothing 0.1 --ra-sampler --ra-reps 4`):

    RandomResizedCrop(224, bilinear) + horizontal flip      per sample, in the decode
    TrivialAugmentWide(bilinear), RandomErasing(p=0.1)      per sample, the batch stage
    Normalize(ImageNet mean, std)                           uint8 to float32
    MixUp(0.2) or CutMix(1.0), label smoothing 0.1          per batch: soft targets [B, classes]
    repeated augmentation x4 (RASampler)                    each image 4 times an epoch

Every random choice is a pure function of (seed, epoch, index, repeat) or of the batch's
sequence: the batches are the same for any num_workers and after a state_dict resume.

    python examples/recipes/torchvision_v2.py                 # on a generated folder
    python examples/recipes/torchvision_v2.py --data DIR --workers 8 --batches 100

Label smoothing lives in the targets (MixUpCutMix's label_smoothing), so train with a plain
cross entropy on soft targets: `torch.nn.functional.cross_entropy(logits, targets)`.
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
    """The recipe's training loader over the ImageFolder at ``root``. ``selected_round``:
    RASampler's (torchvision's and DeiT's samplers round an epoch down to a multiple of 256
    images; 0 keeps every image, for small folders)."""
    num_classes = len([d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))])
    train = conveyor.ImageFolder(root, transform=conveyor.RandomResizedCrop(image_size,
                                                                           flip=True))
    transform = aug.Compose([
        aug.TrivialAugmentWide(interpolation="bilinear"),
        aug.RandomErasing(p=0.1),
        aug.Normalize(conveyor.IMAGENET_MEAN, conveyor.IMAGENET_STD),
        aug.MixUpCutMix(mixup_alpha=0.2, cutmix_alpha=1.0, num_classes=num_classes,
                        label_smoothing=0.1),
    ])
    sampler = conveyor.RASampler(num_replicas=num_replicas, rank=rank, num_repeats=4,
                                 selected_round=selected_round)
    return conveyor.DataLoader(train, batch_size=batch_size, sampler=sampler,
                               num_workers=num_workers, seed=seed, drop_last=True,
                               device=device, batch_transform=transform)


def main() -> None:
    recipe_main.run(__doc__, make_loader, recipe_main.describe_soft_targets, selected_round=0)


if __name__ == "__main__":
    main()
