"""torchvision's GPU JPEG decode as a reference for Conveyor's GPU decode (issue 24): what a PyTorch
user writes to decode on the GPU, timed on an ImageFolder of JPEGs.

usage: python3 torchvision_gpu_decode.py DATA [--batch 256] [--crop 224] [--epochs 2] [--rounds 3]

Each epoch reads every file (torchvision.io.read_file, from the page cache after the first
round), decodes each batch with torchvision.io.decode_jpeg(list, device="cuda") (nvJPEG's batched
decode: whole images, no region of interest), then crops each image with
v2.RandomResizedCrop(crop) and v2.RandomHorizontalFlip() on the GPU and stacks the batch, as
Conveyor's batches are. It prints one line per round and a last line
`torchvision-gpu-decode: MEDIAN images/s (N images, ROUNDS rounds)`, which scripts/gpu-check
puts beside conveyor-bench --gpu-decode's figure. It needs torch and torchvision with CUDA, and
nothing of Conveyor's.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torchvision
from torchvision.transforms import v2


def files_of(root):
    out = []
    for folder, _, names in os.walk(root):
        out += [os.path.join(folder, n) for n in names if n.lower().endswith((".jpg", ".jpeg"))]
    return sorted(out)


def epoch(paths, batch, transform):
    done = 0
    for start in range(0, len(paths), batch):
        data = [torchvision.io.read_file(p) for p in paths[start:start + batch]]
        images = torchvision.io.decode_jpeg(data, device="cuda")
        out = torch.stack([transform(image) for image in images])
        done += out.shape[0]
    torch.cuda.synchronize()
    return done


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torchvision-gpu-decode: no CUDA device")
    paths = files_of(args.data)
    if not paths:
        sys.exit(f"torchvision-gpu-decode: no JPEG files under {args.data}")
    transform = v2.Compose([v2.RandomResizedCrop(args.crop, antialias=True),
                            v2.RandomHorizontalFlip()])
    epoch(paths[:args.batch], args.batch, transform)  # CUDA context, nvJPEG handles
    rates = []
    for r in range(args.rounds):
        t0 = time.perf_counter()
        images = sum(epoch(paths, args.batch, transform) for _ in range(args.epochs))
        rates.append(images / (time.perf_counter() - t0))
        print(f"round {r + 1}: {rates[-1]:.1f} images/s", flush=True)
    print(f"torchvision-gpu-decode: {statistics.median(rates):.1f} images/s "
          f"({len(paths) * args.epochs} images, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
