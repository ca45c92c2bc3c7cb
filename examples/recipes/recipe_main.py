"""What the recipes in this folder share: their command line, a generated folder when no --data
is given, and the timed loop that prints each batch. Each recipe keeps its own ``make_loader``
and says how a batch of its is printed."""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any, Callable

import conveyor


def describe_soft_targets(batch: Any) -> tuple[int, str]:
    """A classification batch (images, soft targets [B, classes]): its image count and a line
    that shows its shapes and that the targets' rows sum to 1."""
    images, targets = batch
    return images.shape[0], (f"images {tuple(images.shape)} {images.dtype}, "
                              f"targets {tuple(targets.shape)} (rows sum to "
                              f"{float(targets.sum(1).mean()):.3f})")


def run(doc: str, make_loader: Callable[..., conveyor.DataLoader],
        describe: Callable[[Any], tuple[int, str]], *, batch_size: int = 256,
        batches: int = 10, classes: int = 10, images_per_class: int = 80, views: int = 1,
        **loader_options: Any) -> None:
    """A recipe's ``main()``. Reads the command line (``--data``, ``--batch-size``, ``--size``,
    ``--workers``, ``--batches``, ``--device``; ``batch_size`` and ``batches`` are the defaults,
    the description is ``doc``'s first paragraph), builds ``make_loader(root, ...)`` (with
    ``loader_options``) over ``--data`` or, without it, over a generated folder of ``classes``
    x ``images_per_class`` images, and runs it for ``--batches`` batches (0: an epoch). Each
    batch prints the line ``describe(batch)`` gives and counts the images it gives; the last line
    says images per second (and the views seen, where each image gives ``views`` of them)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--data", help="an ImageFolder (default: a generated one)")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--batches", type=int, default=batches,
                        help="batches to run (0: an epoch)")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            root = os.path.join(tmp, "folder")
            conveyor.generate_image_folder(root, classes=classes,
                                           images_per_class=images_per_class)
        loader = make_loader(root, batch_size=args.batch_size, num_workers=args.workers,
                             image_size=args.size, device=args.device, **loader_options)
        start = time.perf_counter()
        seen = 0
        for step, batch in enumerate(loader):
            count, text = describe(batch)
            seen += count
            print(f"batch {step}: {text}", flush=True)
            if args.batches and step + 1 >= args.batches:
                break
        elapsed = time.perf_counter() - start
        if views == 1:
            print(f"{seen} images in {elapsed:.2f} s ({seen / elapsed:,.0f} images/s)")
        else:
            print(f"{seen} images ({seen * views} views) in {elapsed:.2f} s "
                  f"({seen / elapsed:,.1f} images/s)")
