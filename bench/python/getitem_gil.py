"""Would running a torch.utils.data.Dataset's Python __getitem__ on Conveyor's C++ worker threads
pay? Such a worker must hold the GIL while the Python code runs, exactly as a Python thread does,
so this measures a torchvision ImageFolder (PIL decode, RandomResizedCrop 224, flip, PILToTensor)
called from 1 and from N threads of one process, against torch's DataLoader with N worker
processes and against conveyor.DataLoader with N threads, on the same files (issue 21).

    PEERS/bin/python bench/python/getitem_gil.py [--data DIR] [--workers 2] [--images 600]
"""

from __future__ import annotations

import argparse
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torchvision
from torchvision.transforms import v2

import conveyor

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=600)
    args = parser.parse_args()
    if not args.data:
        bench = REPO / "build" / "bench" / "conveyor-bench"
        args.data = subprocess.run([str(bench), "--generate-only"], capture_output=True,
                                   text=True, check=True).stdout.split()[-1]
    t = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                    v2.PILToTensor()])
    dataset = torchvision.datasets.ImageFolder(args.data, transform=t)
    n = min(args.images, len(dataset))

    def threads(count: int) -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(count) as pool:
            for _ in pool.map(dataset.__getitem__, range(n), chunksize=8):
                pass
        return n / (time.perf_counter() - start)

    def processes(count: int) -> float:
        subset = torch.utils.data.Subset(dataset, range(n))
        loader = torch.utils.data.DataLoader(subset, batch_size=32, num_workers=count)
        start = time.perf_counter()
        for _ in loader:
            pass
        return n / (time.perf_counter() - start)

    def native(count: int) -> float:
        ds = conveyor.ImageFolder(args.data, transform=conveyor.RandomResizedCrop(224, flip=True))
        loader = conveyor.DataLoader(ds, batch_size=32, num_workers=count)
        start, images = time.perf_counter(), 0
        for images_batch, _ in loader:
            images += images_batch.shape[0]
            if images >= n:
                break
        return images / (time.perf_counter() - start)

    w = args.workers
    one, many = threads(1), threads(w)
    print(f"{n} images, RandomResizedCrop 224 + flip, {w} workers")
    print(f"python __getitem__, 1 thread:            {one:8.1f} images/s")
    print(f"python __getitem__, {w} threads (GIL):     {many:8.1f} images/s  ({many / one:.2f}x)")
    print(f"torch DataLoader, {w} worker processes:    {processes(w):8.1f} images/s")
    print(f"conveyor.DataLoader, {w} C++ threads:      {native(w):8.1f} images/s")


if __name__ == "__main__":
    main()
