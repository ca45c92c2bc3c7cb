"""sqlite_dataset.py: your own torch.utils.data.Dataset, loaded by Conveyor (issue 36). The dataset
keeps JPEG bytes and labels in SQLite (Python's standard library); its __getitem__ only fetches a
row. conveyor.from_dataset says what each entry is, and the engine's C++ workers decode, crop and
batch it without the GIL.

    python examples/sqlite_dataset.py [--db /tmp/photos.sqlite] [--images 96] [--size 64]
        [--batch 16] [--seed 0]

It writes its own small database first (photo-like JPEGs of various sizes; --db keeps it, else a
temporary file), prints each batch's shapes and the GIL's share of the workers' time, and checks
what the loader promises: 1 and 4 workers give the same batches, and a state_dict taken mid-epoch
resumes with the very same bytes. It exits with status 1 if either check fails.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import threading
from pathlib import Path

import torch

import conveyor


class Photos(torch.utils.data.Dataset):
    """A user's own dataset: table photos(id, jpg, cls) in SQLite. ``ds[i]`` is
    ``{"jpg": the JPEG's bytes, "cls": its label}``. A sqlite3 connection is not to be used from
    two threads at once, so each thread opens its own on first use (Conveyor calls __getitem__
    from its worker threads), kept by thread id under a lock: a threading.local would not last
    from one call to the next (each call has a fresh Python thread state, docs/python.md)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.connections = {}  # thread id -> its connection
        self.lock = threading.Lock()
        with sqlite3.connect(self.path) as db:
            self.count = db.execute("SELECT COUNT(*) FROM photos").fetchone()[0]

    def connection(self) -> sqlite3.Connection:
        db = self.connections.get(threading.get_ident())
        if db is None:
            with self.lock:
                db = self.connections[threading.get_ident()] = sqlite3.connect(
                    f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        return db

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict:
        row = self.connection().execute("SELECT jpg, cls FROM photos WHERE id = ?",
                                        (i,)).fetchone()
        if row is None:
            raise IndexError(f"{self.path}: no photo {i}")
        return {"jpg": row[0], "cls": row[1]}


def write_database(path: Path, images: int, seed: int) -> None:
    """`images` photo-like JPEGs (landscape, portrait and square, 160 to 480 pixels a side) with
    labels 0..9, as rows of table photos."""
    rng = random.Random(seed)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE IF EXISTS photos")
        db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, jpg BLOB NOT NULL, "
                   "cls INTEGER NOT NULL)")
        for i in range(images):
            width, height = rng.choice([(480, 360), (360, 480), (320, 320), (240, 160)])
            db.execute("INSERT INTO photos VALUES (?, ?, ?)",
                       (i, conveyor.make_photo_jpeg(width, height, seed=seed + i), i % 10))


def make_loader(photos: Photos, workers: int, args) -> conveyor.DataLoader:
    data = conveyor.from_dataset(photos, fields={
        "image": conveyor.Image("jpg", transform=conveyor.RandomResizedCrop(args.size, flip=True)),
        "label": conveyor.Int("cls")})
    return conveyor.DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=workers,
                               seed=args.seed)


def take(batches, count=None) -> list:
    """(image, label) copies of the first `count` batches (all without a count)."""
    taken = []
    for batch in batches:
        taken.append((batch["image"].clone(), batch["label"].clone()))
        if count is not None and len(taken) == count:
            break
    return taken


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="write the database here and keep it (default: temporary)")
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--size", type=int, default=64, help="RandomResizedCrop's output size")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        path = Path(args.db) if args.db else Path(work) / "photos.sqlite"
        write_database(path, args.images, args.seed)
        photos = Photos(path)
        print(f"{len(photos)} photos in {path}")

        # One epoch with 4 workers: what a training loop sees.
        loader = make_loader(photos, 4, args)
        four = []
        for step, batch in enumerate(loader):
            images, labels = batch["image"], batch["label"]
            print(f"batch {step}: image {tuple(images.shape)} {images.dtype}, "
                  f"label {tuple(labels.shape)} {labels.dtype}")
            four.append((images.clone(), labels.clone()))
        gil = loader.stats()["gil"]
        print(f"GIL: held {gil['held_seconds'] * 1e3:.1f} ms in {gil['calls']} calls "
              f"({gil['held_seconds'] / len(photos) * 1e6:.0f} us per sample), "
              f"{gil['share']:.1%} of the workers' time")
        loader.close()

        # The same epoch with 1 worker: the batches are a function of (seed, epoch, index).
        with make_loader(photos, 1, args) as one_worker:
            one = take(one_worker)
        identical = same(one, four)
        print(f"1 and 4 workers give identical batches: {'yes' if identical else 'NO'}")

        # Stop mid-epoch, keep the state, and resume in a new loader (another worker count).
        half = len(four) // 2
        with make_loader(photos, 4, args) as first:
            before = take(first, half)
            state = first.state_dict()
        with make_loader(photos, 2, args) as second:
            second.load_state_dict(state)
            after = take(second)
        exact = same(before + after, four)
        print(f"resumed after batch {half - 1} from state_dict, bit-exact: "
              f"{'yes' if exact else 'NO'}")
    return 0 if identical and exact else 1


if __name__ == "__main__":
    sys.exit(main())
