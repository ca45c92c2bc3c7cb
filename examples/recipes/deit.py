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

import argparse
import os
import tempfile
import time

import conveyor

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="an ImageFolder (default: a generated one)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--batches", type=int, default=10, help="batches to run (0: an epoch)")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            root = os.path.join(tmp, "folder")
            conveyor.generate_image_folder(root, classes=10, images_per_class=80)
        loader = make_loader(root, batch_size=args.batch_size, num_workers=args.workers,
                             image_size=args.size, selected_round=0, device=args.device)
        start = time.perf_counter()
        seen = 0
        for step, (images, targets) in enumerate(loader):
            seen += images.shape[0]
            print(f"batch {step}: images {tuple(images.shape)} {images.dtype}, "
                  f"targets {tuple(targets.shape)} (rows sum to "
                  f"{float(targets.sum(1).mean()):.3f})", flush=True)
            if args.batches and step + 1 >= args.batches:
                break
        elapsed = time.perf_counter() - start
        print(f"{seen} images in {elapsed:.2f} s ({seen / elapsed:,.0f} images/s)")


if __name__ == "__main__":
    main()
