"""The user's own dataset for bench.py --sqlite and --sqlite-memory (issue 36): photo-like JPEGs
stored as BLOBs in a SQLite database (Python's standard library) beside an ImageFolder of the same
files, and the torch.utils.data.Dataset a user would write to read them back.

    SqlitePhotos(db)[i]          -> {"jpg": bytes, "cls": int}     (conveyor.from_dataset reads it)
    PilDecoded(SqlitePhotos(db)) -> (uint8 [3, 224, 224], int)      (torch's DataLoader reads it)

SqlitePhotos(db, records_mb=500) also holds a list of about 500 MB of small str objects, as a
"list of dicts" dataset does, and each __getitem__ reads its share of them (see Records).
"""

from __future__ import annotations

import io
import os
import sqlite3
import threading
import time
from pathlib import Path

import torch


def cache_dir() -> Path:
    """Where the benchmarks keep generated datasets (as bench/cache_dir.h): $CONVEYOR_CACHE, else
    $XDG_CACHE_HOME/conveyor, else ~/.cache/conveyor."""
    if os.environ.get("CONVEYOR_CACHE"):
        return Path(os.environ["CONVEYOR_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "conveyor"
    return Path.home() / ".cache" / "conveyor"


def mixed_photos(images: int) -> Path:
    """conveyor-bench's mixed photo-like dataset of about `images` JPEGs (10 classes, mostly
    500x375 with portrait and other sizes, a few percent gray, CMYK, YCCK, progressive and 4:4:4:
    held-out-like files), generated once into the folder `conveyor-bench --dataset mixed` uses."""
    import conveyor

    per_class = max(1, (images + 9) // 10)
    root = cache_dir() / "datasets" / f"photos-mixed-v1-10x{per_class}"
    conveyor.generate_image_folder(str(root), classes=10, images_per_class=per_class, mixed=True)
    return root


def folder_samples(folder: Path) -> list:
    """(path, label) of an ImageFolder's JPEGs in ImageFolder's order: classes are the sorted
    sub-folders, files sorted by name within each."""
    classes = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    samples = [(f, label) for label, c in enumerate(classes) for f in sorted(c.iterdir())
               if f.suffix.lower() in (".jpg", ".jpeg")]
    if not samples:
        raise ValueError(f"no JPEG files in the class folders of {folder}")
    return samples


def write_database(folder: Path, db: Path) -> dict:
    """The ImageFolder `folder` as table photos(id, jpg BLOB, cls) in `db`, ids 0..N-1 in
    ImageFolder's order. Written once: a database whose stamp (the folder, its file count and
    bytes) matches is reused; otherwise it is written beside and renamed into place. Returns
    {"db", "images", "bytes", "reused", "seconds"}."""
    samples = folder_samples(folder)
    total = sum(path.stat().st_size for path, _ in samples)
    stamp = (str(Path(folder).resolve()), len(samples), total)
    if db.exists():
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
                found = c.execute("SELECT folder, images, bytes FROM stamp").fetchone()
            if found == stamp:
                return {"db": str(db), "images": len(samples), "bytes": total, "reused": True,
                        "seconds": 0.0}
        except sqlite3.Error:
            pass  # not ours, or cut short: written again
    start = time.perf_counter()
    db.parent.mkdir(parents=True, exist_ok=True)
    partial = db.with_name(db.name + f".partial-{os.getpid()}")
    partial.unlink(missing_ok=True)
    c = sqlite3.connect(partial)
    try:
        c.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, jpg BLOB NOT NULL, "
                  "cls INTEGER NOT NULL)")
        c.executemany("INSERT INTO photos VALUES (?, ?, ?)",
                      ((i, path.read_bytes(), label) for i, (path, label) in enumerate(samples)))
        c.execute("CREATE TABLE stamp (folder TEXT, images INTEGER, bytes INTEGER)")
        c.execute("INSERT INTO stamp VALUES (?, ?, ?)", stamp)
        c.commit()
    finally:
        c.close()
    os.replace(partial, db)
    return {"db": str(db), "images": len(samples), "bytes": total, "reused": False,
            "seconds": time.perf_counter() - start}


# Bytes per record: a 20-character str is a 69-byte object in a 80-byte pymalloc block, and the
# list holds an 8-byte pointer to it.
RECORD_BYTES = 88


class Records:
    """About `mb` MB of distinct 20-character str objects in one list, made in order (so that
    consecutive records share memory pages), as a dataset that keeps a list of its samples'
    metadata in memory does. Sample i of a dataset of `samples` reads records i, i + samples,
    i + 2 * samples, ...: one epoch reads every record once, as an epoch over a list of that many
    records would, but in `samples` reads. Reading a record writes its reference count, so a
    forked worker that reads it copies its page: with records interleaved this way, each of W
    workers, reading a random 1/W of the samples, copies nearly every page (PyTorch #13246)."""

    def __init__(self, mb: int) -> None:
        self.items = [f"record-{k:013d}" for k in range(mb * 2**20 // RECORD_BYTES)]

    def __len__(self) -> int:
        return len(self.items)

    def read(self, sample: int, samples: int) -> int:
        """Reads sample `sample`'s records; returns their total length."""
        return sum(map(len, self.items[sample::samples]))


class SqlitePhotos(torch.utils.data.Dataset):
    """A user's own map-style Dataset over write_database's table: ``ds[i]`` is
    ``{"jpg": the JPEG's bytes, "cls": its label}``. Each thread (in each process) opens its own
    read-only connection on first use, since a sqlite3 connection is not to be used from two
    threads at once. The connections are kept by thread id under a lock, not in a
    threading.local: conveyor.from_dataset calls __getitem__ with a fresh Python thread state each
    time (docs/python.md), so a threading.local would open a connection per sample.
    ``records_mb`` > 0 also holds Records of that size, and each read reads its share."""

    def __init__(self, db, records_mb: int = 0) -> None:
        self.db = str(db)
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True) as c:
            self.count = c.execute("SELECT COUNT(*) FROM photos").fetchone()[0]
        self.records = Records(records_mb) if records_mb > 0 else None
        self._connections = {}  # (process id, thread id) -> its connection
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.count

    def _connection(self) -> sqlite3.Connection:
        key = (os.getpid(), threading.get_ident())  # a forked worker opens its own too
        connection = self._connections.get(key)
        if connection is None:
            with self._lock:
                connection = self._connections[key] = sqlite3.connect(
                    f"file:{self.db}?mode=ro", uri=True, check_same_thread=False)
        return connection

    @property
    def connections_opened(self) -> int:
        """Connections this process opened."""
        return sum(pid == os.getpid() for pid, _ in self._connections)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.count:
            raise IndexError(f"{self.db}: sample {i} of {self.count}")
        row = self._connection().execute("SELECT jpg, cls FROM photos WHERE id = ?",
                                         (i,)).fetchone()
        if self.records is not None:
            self.records.read(i, self.count)
        return {"jpg": row[0], "cls": row[1]}

    def __getstate__(self) -> dict:  # a spawned worker opens its own connections
        state = dict(self.__dict__)
        del state["_connections"], state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._connections = {}
        self._lock = threading.Lock()


class PilDecoded(torch.utils.data.Dataset):
    """What a PyTorch user writes over SqlitePhotos without Conveyor: PIL decodes the bytes
    (``Image.open(BytesIO).convert("RGB")``), torchvision v2 transforms, ``(tensor, label)``."""

    def __init__(self, photos: SqlitePhotos, crop: int) -> None:
        from torchvision.transforms import v2

        self.photos = photos
        self.transform = v2.Compose([v2.RandomResizedCrop(crop, antialias=True),
                                     v2.RandomHorizontalFlip(), v2.PILToTensor()])

    def __len__(self) -> int:
        return len(self.photos)

    def __getitem__(self, i: int):
        from PIL import Image

        row = self.photos[i]
        image = Image.open(io.BytesIO(row["jpg"])).convert("RGB")
        return self.transform(image), row["cls"]
