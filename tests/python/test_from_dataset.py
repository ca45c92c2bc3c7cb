"""conveyor.from_dataset (issue 36): the user's own map-style dataset returns encoded bytes and
values, and the engine decodes them into named fields. A SQLite table of JPEGs gives the same
pixels as conveyor.ImageFolder over the same files, the same batches for 1 and 4 workers and a
bit-exact state_dict resume; every kind of value reaches its field; a raising __getitem__ is
raised with its traceback and cause, or a counted skip, and KeyboardInterrupt is never skipped;
Ctrl-C, destroying a loader while a worker is inside __getitem__, and interpreter exit with a
live loader end without a hang or a thread left."""

from __future__ import annotations

import signal
import sqlite3
import textwrap
import threading

import numpy as np
import pytest
import torch

import conveyor
from conftest import CROP, python_child

# --- the SQLite example -------------------------------------------------------------------------


class Photos(torch.utils.data.Dataset):
    """The issue's example: JPEG bytes and a label per row of a SQLite table."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.lock = threading.Lock()
        (self.count,) = self.db.execute("SELECT COUNT(*) FROM photos").fetchone()

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict:
        with self.lock:
            jpg, label = self.db.execute("SELECT jpg, label FROM photos WHERE id = ?",
                                         (i,)).fetchone()
        return {"jpg": jpg, "cls": label}


@pytest.fixture(scope="module")
def photo_db(photos, tmp_path_factory):
    """The photos fixture's files in a SQLite table, in ImageFolder's order (id = its index)."""
    path = tmp_path_factory.mktemp("sqlite") / "photos.db"
    folder = conveyor.ImageFolder(photos)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, jpg BLOB, label INTEGER)")
        for i, (file, label) in enumerate(folder.samples):
            with open(file, "rb") as f:
                db.execute("INSERT INTO photos VALUES (?, ?, ?)", (i, f.read(), label))
    return str(path)


def _photo_fields():
    return {"image": conveyor.Image("jpg", transform=conveyor.RandomResizedCrop(CROP, flip=True)),
            "label": conveyor.Int("cls")}


def _epochs(loader, epochs=1):
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append((list(batch.indices), batch["image"].clone(), batch["label"].clone()))
    return out


def test_sqlite_images_are_imagefolders_pixels(photos, photo_db):
    data = conveyor.from_dataset(Photos(photo_db), fields=_photo_fields())
    assert len(data) == 27
    folder = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP, flip=True))
    ours = conveyor.DataLoader(data, batch_size=4, shuffle=True, num_workers=2, seed=11)
    theirs = conveyor.DataLoader(folder, batch_size=4, shuffle=True, num_workers=2, seed=11)
    for _ in range(2):  # two epochs: the crops are functions of (seed, epoch, index)
        got = list(ours)
        want = list(theirs)
        assert len(got) == len(want) == 7
        for g, (images, labels) in zip(got, want):
            assert torch.equal(g["image"], images)
            assert torch.equal(g["label"], labels)
    indices = [i for b in _epochs(ours) for i in b[0]]
    assert sorted(indices) == list(range(27))  # each sample once per epoch


def test_sqlite_batches_are_the_same_for_1_and_4_workers_and_resume_bit_exact(photo_db):
    def loader(workers):
        return conveyor.DataLoader(conveyor.from_dataset(Photos(photo_db), fields=_photo_fields()),
                                   batch_size=4, shuffle=True, num_workers=workers, seed=3)

    one = _epochs(loader(1), epochs=2)
    four = _epochs(loader(4), epochs=2)
    assert len(one) == len(four) == 14
    for a, b in zip(one, four):
        assert a[0] == b[0] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])

    first = loader(2)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    rest = [(list(b.indices), b["image"].clone(), b["label"].clone()) for b in it]
    resumed = loader(4)
    resumed.load_state_dict(state)
    again = _epochs(resumed)
    assert len(again) == len(rest) == 4
    for a, b in zip(rest, again):
        assert a[0] == b[0] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert [b[0] for b in rest] == [b[0] for b in one[3:7]]


# --- every kind of value --------------------------------------------------------------------------


def _values(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {
        "txt": f"caption {i} é",
        "f": i / 4,
        "i": -i,
        "flag": i % 2 == 0,
        "boxes": rng.uniform(0, 64, (i % 3, 4)).astype(np.float32),
        "pix": torch.arange(3 * 5 * 4, dtype=torch.uint8).reshape(3, 5, 4) + i,
        "tags": [i % 10, (i + 3) % 10],
        "meta": {"n": i, "name": f"s{i}", "list": [1, None, True]},
        "npint": np.int16(i * 7),
        "npfloat": np.float32(i + 0.5),
        "t0": torch.tensor(i * 3),
        "strided": np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2].T + i,  # [3, 4], strided
        "raw": bytearray(b"\x00\x01" * (i + 1)),
    }


class Values(torch.utils.data.Dataset):
    def __len__(self):
        return 11

    def __getitem__(self, i):
        return _values(i)


def _value_fields():
    return {
        "txt": conveyor.Text("txt"),
        "f": conveyor.Float("f"),
        "i": conveyor.Int("i"),
        "flag": conveyor.Int("flag"),
        "boxes": conveyor.Array("boxes", shape=(-1, 4), dtype=torch.float32),
        "pix": conveyor.Array("pix", shape=(3, 5, 4), dtype=torch.uint8),
        "hot": conveyor.Array("tags", shape=(10,), multi_hot=True),
        "tags": conveyor.Json("tags"),
        "meta": conveyor.Json("meta"),
        "npint": conveyor.Int("NPINT"),  # keys match names without case
        "npfloat": conveyor.Float("npfloat"),
        "t0": conveyor.Int("t0"),
        "strided": conveyor.Array("strided", shape=(3, 4), dtype=torch.int32),
        "raw": conveyor.Bytes("raw"),
    }


def test_every_kind_of_value_reaches_its_field():
    loader = conveyor.DataLoader(conveyor.from_dataset(Values(), fields=_value_fields()),
                                 batch_size=4, num_workers=2)
    seen = []
    for batch in loader:
        boxes = batch["boxes"].unbind()
        for row, i in enumerate(batch.indices):
            want = _values(i)
            seen.append(i)
            assert batch["txt"][row] == want["txt"]
            assert batch["f"][row].item() == want["f"]
            assert batch["i"][row].item() == want["i"]
            assert batch["flag"][row].item() == int(want["flag"])
            assert torch.equal(boxes[row], torch.from_numpy(want["boxes"]))
            assert torch.equal(batch["pix"][row], want["pix"])
            hot = torch.zeros(10)
            hot[want["tags"]] = 1
            assert torch.equal(batch["hot"][row], hot)
            assert batch["tags"][row] == want["tags"]
            assert batch["meta"][row] == want["meta"]
            assert batch["npint"][row].item() == int(want["npint"])
            assert batch["npfloat"][row].item() == float(want["npfloat"])
            assert batch["t0"][row].item() == i * 3
            assert torch.equal(batch["strided"][row],
                               torch.from_numpy(np.ascontiguousarray(want["strided"])))
            assert batch["raw"][row] == bytes(want["raw"])
    assert sorted(seen) == list(range(11))


def test_a_tuple_dataset_with_names():
    items = [(f"text {i}", i, np.full((2,), i, dtype=np.int64)) for i in range(6)]
    data = conveyor.from_dataset(items, fields={"t": conveyor.Text("txt"),
                                                "c": conveyor.Int("cls"),
                                                "a": conveyor.Array("a", shape=(2,),
                                                                    dtype=torch.int64)},
                                 names=["txt", "cls", "a"])
    batches = list(conveyor.DataLoader(data, batch_size=6, num_workers=1))
    assert len(batches) == 1
    b = batches[0]
    assert b["t"] == [f"text {i}" for i in range(6)]
    assert b["c"].tolist() == list(range(6))
    assert b["a"].tolist() == [[i, i] for i in range(6)]

    without = conveyor.from_dataset(items, fields={"t": conveyor.Text("txt")})
    with pytest.raises(conveyor.SampleError, match="no names= were given"):
        list(conveyor.DataLoader(without, batch_size=2, num_workers=1))
    short = conveyor.from_dataset(items, fields={"t": conveyor.Text("txt")}, names=["txt", "cls"])
    with pytest.raises(conveyor.SampleError, match="of 3 items, not the 2 that names= lists"):
        list(conveyor.DataLoader(short, batch_size=2, num_workers=1))


def test_subset_and_concat_dataset(photo_db):
    base = Photos(photo_db)
    subset = torch.utils.data.Subset(base, [5, 3, 20, 7])
    concat = torch.utils.data.ConcatDataset([subset, base])
    assert len(concat) == 31
    data = conveyor.from_dataset(concat, fields=_photo_fields())
    loader = conveyor.DataLoader(data, batch_size=31, num_workers=2)
    (batch,) = list(loader)
    labels = [base[i]["cls"] for i in [5, 3, 20, 7]] + [base[i]["cls"] for i in range(27)]
    assert batch["label"].tolist() == labels
    # Row 0 is base[5]; row 4 + 5 is base[5] too, at another index: another crop, same label.
    assert batch["image"].shape == (31, 3, CROP, CROP)


def test_refused_datasets():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

    with pytest.raises(ValueError, match="IterableDataset .*Stream.*tar_shards"):
        conveyor.from_dataset(Stream(), fields={"t": conveyor.Text("txt")})
    with pytest.raises(ValueError, match="__getitem__ and __len__"):
        conveyor.from_dataset(object(), fields={"t": conveyor.Text("txt")})
    with pytest.raises(ValueError, match=r"conveyor\.from_dataset\(dataset, fields="):
        conveyor.DataLoader(Values())


# --- errors -------------------------------------------------------------------------------------


class Raising(torch.utils.data.Dataset):
    """Raises `error` at the indices in `bad`; a text member otherwise."""

    def __init__(self, bad, error=ValueError, size=12):
        self.bad, self.error, self.size = set(bad), error, size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        if i in self.bad:
            self.fail(i)
        return {"txt": f"s{i}"}

    def fail(self, i):
        raise self.error(f"row {i} is corrupt")


def test_a_raising_getitem_is_a_sample_error_with_its_traceback_and_cause():
    data = conveyor.from_dataset(Raising({5}), fields={"t": conveyor.Text("txt")})
    loader = conveyor.DataLoader(data, batch_size=4, num_workers=2)
    with pytest.raises(conveyor.SampleError) as caught:
        list(loader)
    error = caught.value
    assert error.index == 5
    assert error.path == "Raising[5]"
    text = str(error)
    assert "sample 5" in text and "ValueError: row 5 is corrupt" in text
    assert "Traceback (most recent call last)" in text and "in fail" in text
    assert isinstance(error.__cause__, ValueError)
    assert str(error.__cause__) == "row 5 is corrupt"
    assert error.__cause__.__traceback__ is not None


def test_a_raising_getitem_is_a_counted_skip():
    data = conveyor.from_dataset(Raising({2, 9}), fields={"t": conveyor.Text("txt")})
    loader = conveyor.DataLoader(data, batch_size=4, num_workers=3, on_error="skip")
    texts = [t for b in loader for t in b["t"]]
    stats = loader.stats()
    assert stats["skipped"] == 2
    assert sorted(s["index"] for s in stats["skipped_samples"]) == [2, 9]
    assert all("ValueError" in s["message"] for s in stats["skipped_samples"])
    good = [f"s{i}" for i in range(12) if i not in (2, 9)]
    assert sorted(set(texts)) == sorted(good)
    assert len(texts) == 12 and all(texts.count(t) <= 2 for t in good)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_keyboard_interrupt_and_system_exit_are_raised_as_themselves(interrupt, on_error):
    data = conveyor.from_dataset(Raising({6}, error=interrupt), fields={"t": conveyor.Text("txt")})
    loader = conveyor.DataLoader(data, batch_size=4, num_workers=2, on_error=on_error)
    with pytest.raises(interrupt, match="row 6 is corrupt"):
        list(loader)
    assert loader.stats()["skipped"] == 0


class Returning(torch.utils.data.Dataset):
    def __init__(self, value):
        self.value = value

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"jpg": self.value, "cls": i} if i == 2 else {"jpg": b"", "cls": i}


@pytest.mark.parametrize("value,type_name", [(None, "NoneType"), (object(), "object"),
                                             (1 + 2j, "complex")])
def test_a_value_of_another_type_names_the_member_and_type(value, type_name):
    data = conveyor.from_dataset(Returning(value), fields={"l": conveyor.Int("cls")})
    with pytest.raises(conveyor.SampleError) as caught:
        list(conveyor.DataLoader(data, batch_size=4, num_workers=1))
    assert caught.value.index == 2
    assert f"member 'jpg' is a {type_name}" in str(caught.value)


def test_a_pil_image_is_refused_with_advice():
    image = pytest.importorskip("PIL.Image").new("RGB", (4, 4))
    data = conveyor.from_dataset(Returning(image), fields={"l": conveyor.Int("cls")})
    with pytest.raises(conveyor.SampleError,
                       match=r"member 'jpg' is a PIL\.Image\.Image: .*encoded bytes"):
        list(conveyor.DataLoader(data, batch_size=4, num_workers=1))


def test_a_str_that_is_not_utf8_is_a_sample_error():
    data = conveyor.from_dataset(Returning("\ud800"), fields={"l": conveyor.Int("cls")})
    with pytest.raises(conveyor.SampleError, match="UnicodeEncodeError.*surrogates"):
        list(conveyor.DataLoader(data, batch_size=4, num_workers=1))


def test_an_int_outside_int64_names_the_member():
    data = conveyor.from_dataset(Returning(2**64), fields={"l": conveyor.Int("cls")})
    with pytest.raises(conveyor.SampleError, match="member 'jpg' is the int 18446744073709551616, "
                                                   "outside int64"):
        list(conveyor.DataLoader(data, batch_size=4, num_workers=1))


# --- the GIL's share ----------------------------------------------------------------------------


def test_stats_report_the_gil(photo_db):
    data = conveyor.from_dataset(Photos(photo_db), fields=_photo_fields())
    loader = conveyor.DataLoader(data, batch_size=4, num_workers=2)
    assert len(_epochs(loader, epochs=2)) == 14
    stats = loader.stats()
    gil = stats["gil"]
    assert gil["calls"] == stats["samples"] == 54
    assert 0 < gil["held_seconds"] <= stats["fill_seconds"]
    assert 0 < gil["share"] <= 1
    assert gil["wait_seconds"] >= 0
    assert "gil" not in conveyor.DataLoader(conveyor.PatternDataset(8, 16)).stats()


class PerThreadHandles(torch.utils.data.Dataset):
    """Opens one "handle" per thread in a threading.local, as a dataset keeps a connection per
    thread; counts the handles opened."""

    def __init__(self, n):
        self.n = n
        self.local = threading.local()
        self.opened = 0
        self.lock = threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not hasattr(self.local, "handle"):
            with self.lock:
                self.opened += 1
            self.local.handle = object()
        return {"cls": i}


def test_a_threading_local_lasts_from_call_to_call_on_each_worker():
    data = PerThreadHandles(120)
    loader = conveyor.DataLoader(conveyor.from_dataset(data, fields={"label": conveyor.Int("cls")}),
                                 batch_size=8, num_workers=3)
    for _ in range(2):
        assert sorted(i for b in loader for i in b["label"].tolist()) == list(range(120))
    loader.close()
    # One per worker thread (3), not one per call (240).
    assert 1 <= data.opened <= 3, data.opened


# --- lifecycle ----------------------------------------------------------------------------------


DESTROY_CHILD = """
import gc, os, sys, threading, time, torch, conveyor

def threads():
    return len(os.listdir("/proc/self/task"))

class Blocking(torch.utils.data.Dataset):
    # __getitem__(0) sets `entered`, then waits on `release`.
    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()
    def __len__(self):
        return 8
    def __getitem__(self, i):
        if i == 0:
            self.entered.set()
            self.release.wait(60)
        return {"txt": f"s{i}"}

before = threads()
data = Blocking()
loader = conveyor.DataLoader(conveyor.from_dataset(data, fields={"t": conveyor.Text("txt")}),
                             batch_size=2, num_workers=3)
it = iter(loader)
assert data.entered.wait(20), "no worker entered __getitem__"
# Another Python thread must get the GIL while the loader is destroyed: it releases the worker,
# which needs the GIL to return from __getitem__.
timer = threading.Timer(0.2, data.release.set)
timer.start()
started = time.monotonic()
del it, loader
gc.collect()
print("destroyed", round(time.monotonic() - started, 3), flush=True)
timer.join()
deadline = time.monotonic() + 20
while threads() > before and time.monotonic() < deadline:
    time.sleep(0.01)
print("threads", before, threads(), flush=True)
"""


def test_destroying_the_loader_while_a_worker_is_inside_getitem():
    # In a child process: a loader that held the GIL while joining its workers would deadlock,
    # and the child's deadline turns that into a failure rather than a hung test run.
    child = python_child(DESTROY_CHILD, deadline=60)
    try:
        out, err = child.communicate(timeout=60)
        lines = out.splitlines()
        assert len(lines) == 2 and lines[0].startswith("destroyed"), (out, err)
        assert float(lines[0].split()[1]) < 20
        _, before, after = lines[1].split()
        assert int(after) <= int(before), (out, err)
        assert child.returncode == 0, err
    finally:
        child.kill()
        child.wait()


CHILD_DATASET = """
import sys, time, torch, conveyor
class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        time.sleep(0.005)
        return {"txt": "x" * (i % 7), "cls": i}
data = conveyor.from_dataset(Slow(), fields={"t": conveyor.Text("txt"), "c": conveyor.Int("cls")})
loader = conveyor.DataLoader(data, batch_size=8, num_workers=4)
"""


def test_ctrl_c_during_an_epoch_raises_keyboard_interrupt():
    code = CHILD_DATASET + textwrap.dedent("""
        for n, batch in enumerate(loader):
            if n == 0:
                print("first", flush=True)
    """)
    child = python_child(code, deadline=60)
    try:
        assert child.stdout.readline().strip() == "first", child.stderr.read()
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=30) != 0
        assert "KeyboardInterrupt" in child.stderr.read()
    finally:
        child.kill()
        child.wait()


def test_interpreter_exit_with_a_live_loader_mid_epoch():
    code = CHILD_DATASET + textwrap.dedent("""
        it = iter(loader)
        next(it)
        print("exiting", flush=True)
    """)
    child = python_child(code, deadline=60)
    try:
        assert child.stdout.readline().strip() == "exiting", child.stderr.read()
        assert child.wait(timeout=30) == 0, child.stderr.read()
    finally:
        child.kill()
        child.wait()
