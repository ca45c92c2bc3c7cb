"""conveyor.DataLoader over image folders: coverage, the C++ loader's bytes, zero copy, the CPU
path, arguments, transforms and sources."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

import conveyor
from conftest import CROP, batches_of, prepare_tool


def loader_for(root, workers, **kwargs):
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("shuffle", True)
    kwargs.setdefault("seed", 7)
    train = conveyor.ImageFolder(root, transform=conveyor.RandomResizedCrop(CROP, flip=True))
    return conveyor.DataLoader(train, num_workers=workers, **kwargs)


def run_reference(program, root, out: Path, workers, batch, seed, epochs, shuffle=True):
    subprocess.run([str(program), str(root), str(out), str(workers), str(batch), str(seed),
                    str(epochs), str(CROP), "1" if shuffle else "0"],
                   check=True, timeout=120)
    images = torch.frombuffer(bytearray(out.with_suffix(".images").read_bytes()), dtype=torch.uint8)
    labels = torch.frombuffer(bytearray(out.with_suffix(".labels").read_bytes()), dtype=torch.int64)
    rows = [list(map(int, line.split())) for line in out.with_suffix(".indices").read_text().splitlines()]
    return images, labels, rows


@pytest.mark.parametrize("workers", [1, 2, 4, "auto"])
def test_every_sample_once_with_the_cpp_loaders_bytes(photos, reference_program, tmp_path,
                                                      workers):
    loader = loader_for(photos, workers)
    got = batches_of(loader, epochs=2)
    n = len(loader.dataset)
    for epoch in (0, 1):
        seen = [i for e, idx, _, _ in got if e == epoch for i in idx]
        assert sorted(seen) == list(range(n)), f"epoch {epoch} is not every sample once"
    orders = [[i for e, idx, _, _ in got if e == epoch for i in idx] for epoch in (0, 1)]
    assert orders[0] != orders[1], "each epoch has its own permutation"
    # The same bytes as the C++ loader on the same seed (which runs one worker: the bytes do not
    # depend on the number of workers).
    images, labels, rows = run_reference(reference_program, photos, tmp_path / "ref", 1, 4, 7, 2)
    assert [r[1:] for r in rows] == [idx for _, idx, _, _ in got]
    assert [r[0] for r in rows] == [e for e, _, _, _ in got]
    assert torch.equal(torch.cat([im.reshape(-1) for _, _, im, _ in got]), images)
    assert torch.equal(torch.cat([lab for _, _, _, lab in got]), labels)
    # Labels are the ImageFolder's classes.
    targets = loader.dataset.targets
    for _, idx, _, lab in got:
        assert lab.tolist() == [targets[i] for i in idx]


def test_auto_workers_report_what_they_chose(photos):
    loader = loader_for(photos, "auto")
    batches_of(loader, epochs=1)
    stats = loader.stats()
    assert 1 <= stats["active_workers"] <= loader.num_workers
    first_batch, seconds, workers = stats["active_workers_history"][0]
    assert (first_batch, seconds) == (0, 0.0) and 1 <= workers <= loader.num_workers


def test_batches_are_tensors_of_the_engines_ring_not_copies(photos):
    loader = loader_for(photos, 2, shuffle=False)
    assert loader.mode.startswith("CPU only"), loader.mode
    batch = next(iter(loader))
    images, labels = batch
    assert images.dtype == torch.uint8 and images.shape == (4, 3, CROP, CROP)
    assert labels.dtype == torch.int64 and labels.shape == (4,)
    assert images.is_contiguous() and images.device.type == "cpu"
    del batch, images, labels
    # Dropping each batch recycles its slot: an epoch's batches cycle through the ring's few
    # slots (the same addresses come back), and none is handed out as a copy.
    slots = loader.options["slots"]
    pointers = set()
    for images, _ in loader:
        pointers.add(images.data_ptr())
        del images
    assert len(pointers) <= slots
    assert loader.stats()["copies_to_host"] == 0


def test_cpu_path_says_it_is_the_cpu_path(photos):
    loader = loader_for(photos, 1)
    assert loader.mode.startswith("CPU only (")
    assert "no copy stage" in loader.mode
    assert "CPU only" in repr(loader)
    assert loader.device == torch.device("cpu") and not loader.is_pinned


def test_gpu_decode_where_it_cannot_run_decodes_on_the_cpu_and_says_why(photos):
    plain = [(i.clone(), l.clone()) for i, l in loader_for(photos, 2)]
    for mode in ("auto", "hw-only", 0.5):
        loader = loader_for(photos, 2, gpu_decode=mode)
        got = [(i.clone(), l.clone()) for i, l in loader]
        assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, plain))
        assert len(got) == len(plain)
        split = loader.stats()["gpu_decode"]
        assert not split["active"] and split["gpu_images"] == 0
        assert split["status"].startswith("GPU decode unused: batches go to the CPU"), split
        assert split["status"] in loader.mode
        assert loader.options["gpu_decode"] == str(mode)
    assert loader_for(photos, 2).stats()["gpu_decode"]["status"] == "off"
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP))
    for bad in ("gpu", 1.5, -0.1, True, None):
        with pytest.raises(ValueError, match="gpu_decode|GPU decode takes"):
            conveyor.DataLoader(ds, gpu_decode=bad)


def test_len_counts_batches_and_drop_last(photos):
    assert len(loader_for(photos, 1)) == 7  # 27 samples in batches of 4
    loader = loader_for(photos, 1, drop_last=True)
    assert len(loader) == 6
    assert [b.images.shape[0] for b in loader] == [4] * 6


def test_hwc_layout_is_the_chw_bytes_transposed(photos):
    def first(layout):
        t = conveyor.RandomResizedCrop(CROP, flip=True, layout=layout)
        loader = conveyor.DataLoader(conveyor.ImageFolder(photos, transform=t), batch_size=27,
                                     num_workers=2, seed=3)
        return next(iter(loader)).images.clone()

    chw, hwc = first("CHW"), first("HWC")
    assert hwc.shape == (27, CROP, CROP, 3)
    assert torch.equal(chw.permute(0, 2, 3, 1), hwc)


def test_file_list_and_jpeg_bytes_match_the_folder(photos, tmp_path):
    t = conveyor.ResizeCenterCrop(CROP, resize=40)
    folder = conveyor.ImageFolder(photos, transform=t)
    samples = folder.samples

    def everything(ds):
        return next(iter(conveyor.DataLoader(ds, batch_size=len(ds), num_workers=2))).images.clone()

    expected = everything(folder)
    assert torch.equal(everything(conveyor.FileList(samples, transform=t)), expected)
    # A list file with paths relative to its folder.
    listing = tmp_path / "list.tsv"
    listing.write_text("".join(f"{Path(p).relative_to(photos.parent)}\t{label}\n"
                               for p, label in samples))
    for name in {Path(p).parts[-2] for p, _ in samples}:
        (tmp_path / photos.name).mkdir(exist_ok=True)
        (tmp_path / photos.name / name).symlink_to(photos / name)
    assert torch.equal(everything(conveyor.FileList(listing, transform=t)), expected)
    jpegs = [Path(p).read_bytes() for p, _ in samples]
    labels = [label for _, label in samples]
    assert torch.equal(everything(conveyor.JpegBytes(jpegs, labels, transform=t)), expected)


def test_restart_marker_copies_decode_to_the_same_pixels(photos, tmp_path):
    prepared = tmp_path / "prepared"
    subprocess.run([prepare_tool(), str(photos), str(prepared), "--format", "folder",
                    "--restart", "1"], check=True, capture_output=True, timeout=120)
    t = conveyor.RandomResizedCrop(CROP, flip=True)
    original = conveyor.DataLoader(conveyor.ImageFolder(photos, transform=t), batch_size=27,
                                   num_workers=2, seed=9)
    restart = conveyor.DataLoader(conveyor.ImageFolder(prepared, transform=t), batch_size=27,
                                  num_workers=2, seed=9)
    assert torch.equal(next(iter(original)).images, next(iter(restart)).images)


def test_the_entropy_index_fills_in_epoch_one_and_leaves_every_batch_unchanged(photos, tmp_path):
    """conveyor.JpegEntropyIndex (issue 35): each JPEG gets an entry the first time it is decoded,
    and the later epochs, which start the crop's rows from it, give the bytes of a loader without
    one."""
    def run(index, epochs):
        t = conveyor.RandomResizedCrop(CROP, flip=True, entropy_index=index)
        loader = conveyor.DataLoader(conveyor.ImageFolder(photos, transform=t), batch_size=4,
                                     num_workers=2, shuffle=True, seed=11)
        return batches_of(loader, epochs=epochs)

    index = conveyor.JpegEntropyIndex(budget_mib=1)
    assert (index.files, index.bytes, index.budget_bytes) == (0, 0, 1 << 20)
    indexed = run(index, 1)
    assert index.files == len(conveyor.ImageFolder(photos)), "every photo has its entry"
    # A few percent of a file at most (about 1.3 KB for a 500x375 photo; these are smaller).
    smallest = min(p.stat().st_size for p in photos.rglob("class_*/*"))
    assert 0 < index.bytes / index.files < 0.05 * smallest
    again = run(index, 2)  # epochs 0 and 1 again, each decode from the file's entry
    off = conveyor.JpegEntropyIndex(0)
    plain = run(off, 2)
    assert off.files == 0 and off.bytes == 0
    assert len(again) == len(plain) == 2 * len(indexed)
    for (e1, i1, im1, l1), (e2, i2, im2, l2) in zip(indexed + again, plain[:len(indexed)] + plain):
        assert (e1, i1) == (e2, i2)
        assert torch.equal(im1, im2), f"epoch {e1}: other pixels with the index"
        assert torch.equal(l1, l2)
    # Kept in a file: the next run's index starts with every entry, and gives the same bytes.
    path = tmp_path / "photos.cvyjidx"
    kept = conveyor.JpegEntropyIndex(budget_mib=1, file=path)
    assert kept.file == str(path) and not kept.loaded["file_found"]
    run(kept, 1)
    kept.save()
    reloaded = conveyor.JpegEntropyIndex(budget_mib=1, file=path)
    assert reloaded.loaded["entries_loaded"] == index.files
    assert reloaded.loaded["entries_refused"] == 0 and not reloaded.loaded["file_refused"]
    for (e1, i1, im1, _), (e2, i2, im2, _) in zip(run(reloaded, 2), plain):
        assert (e1, i1) == (e2, i2) and torch.equal(im1, im2)
    path.write_bytes(b"not an index")
    refused = conveyor.JpegEntropyIndex(file=path)
    assert refused.loaded["file_refused"] and str(path) in refused.loaded["refusal"]
    assert refused.files == 0
    with pytest.raises(RuntimeError, match="no-such-dir"):
        conveyor.JpegEntropyIndex(file=tmp_path / "no-such-dir" / "x.cvyjidx").save()
    for bad in (-1, 1.5, True, "64"):
        with pytest.raises(ValueError, match="budget_mib must be an int >= 0"):
            conveyor.JpegEntropyIndex(bad)
    with pytest.raises(ValueError, match="entropy_index must be a conveyor.JpegEntropyIndex"):
        conveyor.RandomResizedCrop(CROP, entropy_index=64)


def with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The JPEG with an EXIF APP1 segment holding only the orientation tag, after SOI."""
    tiff = (b"MM\x00\x2a\x00\x00\x00\x08" + b"\x00\x01" +
            b"\x01\x12\x00\x03\x00\x00\x00\x01" + bytes([0, orientation, 0, 0]) +
            b"\x00\x00\x00\x00")
    payload = b"Exif\x00\x00" + tiff
    segment = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    return jpeg[:2] + segment + jpeg[2:]


def test_exif_orientation_shows_the_upright_image():
    jpeg = conveyor.make_photo_jpeg(32, 32, seed=2)

    def decode(data, exif):
        t = conveyor.Resize(32, exif_orientation=exif)
        ds = conveyor.JpegBytes([data], [0], transform=t)
        return next(iter(conveyor.DataLoader(ds, batch_size=1, num_workers=1))).images[0].clone()

    stored = decode(jpeg, False)
    assert torch.equal(decode(with_orientation(jpeg, 6), False), stored)  # tag ignored: default
    # 6: the stored pixels are to be turned 90 degrees clockwise; 3: 180 degrees.
    assert torch.equal(decode(with_orientation(jpeg, 6), True), torch.rot90(stored, -1, (1, 2)))
    assert torch.equal(decode(with_orientation(jpeg, 3), True), torch.rot90(stored, 2, (1, 2)))


def test_a_dataset_serves_a_second_loader_while_the_first_lives(photos):
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP, flip=True))
    a = conveyor.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, seed=1)
    b = conveyor.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, seed=1)
    for (ia, _), (ib, _) in zip(a, b):
        assert torch.equal(ia, ib)


def test_normalize_matches_the_formula(photos):
    images = next(iter(loader_for(photos, 1))).images
    x = conveyor.normalize(images)
    mean = torch.tensor(conveyor.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(conveyor.IMAGENET_STD).view(1, 3, 1, 1)
    assert x.dtype == torch.float32
    assert torch.allclose(x, (images.float() / 255 - mean) / std, atol=1e-5)


def test_bad_arguments_are_value_errors_naming_them(photos):
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP))
    for kwargs, name in [(dict(batch_size=0), "batch_size"), (dict(on_error="ignore"), "on_error"),
                         (dict(timeout=-1), "timeout"), (dict(num_workers=-2), "num_workers"),
                         (dict(prefetch_factor=0), "prefetch_factor"),
                         (dict(device="tpu"), "device"),
                         (dict(collate_fn=lambda b: b), "collate_fn"),
                         (dict(shuffle=True, sampler=conveyor.SequentialSampler()), "shuffle")]:
        with pytest.raises(ValueError, match=name):
            conveyor.DataLoader(ds, **kwargs)
    with pytest.raises(ValueError, match="scale"):
        conveyor.RandomResizedCrop(224, scale=(1.0, 0.5))
    with pytest.raises(ValueError, match="layout"):
        conveyor.RandomResizedCrop(224, layout="NCHW")
    with pytest.raises(ValueError, match="transform"):
        conveyor.ImageFolder(photos, transform=lambda image: image)
    with pytest.raises(RuntimeError, match="no_such_folder"):
        conveyor.ImageFolder(photos / "no_such_folder")


def test_cuda_without_a_gpu_is_refused_naming_the_device(photos):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the refusal is for machines without one")
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP))
    with pytest.raises(ValueError, match="cuda"):
        conveyor.DataLoader(ds, batch_size=4, device="cuda")


def test_a_torch_dataset_is_refused_saying_what_to_use(photos):
    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i * i

    with pytest.raises(ValueError, match="conveyor.ImageFolder.*torch.utils.data.DataLoader"):
        conveyor.DataLoader(Squares(), batch_size=2)


def test_torch_samplers_are_translated(photos):
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP))
    sampler = torch.utils.data.DistributedSampler(list(range(27)), num_replicas=3, rank=1,
                                                  shuffle=False)
    loader = conveyor.DataLoader(ds, batch_size=4, sampler=sampler)
    assert [i for b in loader for i in b.indices] == list(range(27))[1::3]
    shuffled = torch.utils.data.DistributedSampler(list(range(27)), num_replicas=3, rank=1)
    loader = conveyor.DataLoader(ds, batch_size=4, sampler=shuffled)
    shuffled.set_epoch(7)  # torch's set_epoch is followed
    assert next(iter(loader)).epoch == 7
    with pytest.raises(ValueError, match="sampler"):
        conveyor.DataLoader(ds, sampler=torch.utils.data.RandomSampler(list(range(27))))


def test_a_new_iteration_replaces_the_last_one(photos):
    loader = loader_for(photos, 2)
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="earlier epoch"):
        next(first)
    assert next(second).epoch == 1
    loader.set_epoch(5)
    assert next(iter(loader)).epoch == 5


def test_help_documents_the_loader():
    text = conveyor.DataLoader.__doc__
    for word in ("num_workers", "state_dict", "on_error", "device", "prefetch_factor"):
        assert word in text


def test_record_stream_makes_the_stream_wait_for_the_batchs_own_copy(monkeypatch):
    """Batch.record_stream goes through the batch's copy fence (the C++ CopyFence::use_on), with
    the stream and every field, and never reads the current stream: inside
    ``with torch.cuda.stream(s):`` the current stream is ``s`` itself, so waiting on it would wait
    on nothing. A CPU batch (no fence) is left alone."""
    calls = []

    class Fence:
        def use_on(self, stream, tensors):
            calls.append((stream, tensors))

    def current_stream(*args, **kwargs):
        raise AssertionError("record_stream read torch.cuda.current_stream()")

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    images, labels = torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.arange(2)
    stream = object()  # any stream: the fence is what orders it
    batch = conveyor.Batch._make((images, labels), (None, None), ("image", "label"), [0, 1], 0, 0,
                                 Fence())
    batch.record_stream(stream)
    assert len(calls) == 1
    assert calls[0][0] is stream
    assert len(calls[0][1]) == 2 and all(a is b for a, b in zip(calls[0][1], batch))
    cpu = conveyor.Batch._make((images, labels), (None, None), ("image", "label"), [0, 1], 0, 0,
                               None)
    cpu.record_stream(stream)
    assert len(calls) == 1
