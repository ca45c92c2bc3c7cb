"""The CUDA path: batches on the device, the current stream ordered after each copy, another
stream through Batch.record_stream, normalize on the device. Skipped, with the reason, where no
GPU is usable."""

from __future__ import annotations

import time

import pytest
import torch

import conveyor
from conftest import CROP, requires_cuda

pytestmark = requires_cuda


def loaders(photos, **kwargs):
    t = conveyor.RandomResizedCrop(CROP, flip=True)
    make = lambda device: conveyor.DataLoader(conveyor.ImageFolder(photos, transform=t),  # noqa
                                              batch_size=4, shuffle=True, seed=4, num_workers=2,
                                              device=device, **kwargs)
    return make("cpu"), make("cuda")


def test_batches_arrive_on_the_gpu_with_the_cpu_bytes(photos):
    cpu, cuda = loaders(photos)
    assert "side-stream copies to cuda" in cuda.mode and cuda.is_pinned
    for (ci, cl), (gi, gl) in zip(cpu, cuda):
        assert gi.is_cuda and gl.is_cuda
        assert torch.equal(ci, gi.cpu()) and torch.equal(cl, gl.cpu())


def test_a_side_stream_reads_the_batch_after_record_stream(photos):
    cpu, cuda = loaders(photos, prefetch_factor=1)
    side = torch.cuda.Stream()
    sums = []
    for batch in cuda:
        batch.record_stream(side)
        with torch.cuda.stream(side):
            sums.append(batch.images.sum(dtype=torch.int64))
        del batch  # the allocator keeps the memory until the side stream's work is done
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == [b.images.sum(dtype=torch.int64).item() for b in cpu]


def test_normalize_on_the_gpu_matches_the_cpu(photos):
    cpu, cuda = loaders(photos)
    (ci, _), (gi, _) = next(iter(cpu)), next(iter(cuda))
    assert torch.allclose(conveyor.normalize(gi).cpu(), conveyor.normalize(ci), atol=1e-5)
    assert conveyor.normalize(gi, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_gpu_decode_on_the_hardware_engines_matches_the_cpu_path(photos):
    """GPU decode where nvJPEG's hardware backend runs (A100, H100, H200): the same samples and
    labels as the CPU path, each image within GpuCropDecoder's tolerance (max abs diff 48), and a
    fixed share bit-exact from loader to loader."""
    cpu, _ = loaders(photos)
    probe = loaders(photos, gpu_decode="hw-only")[1]
    split = probe.stats()["gpu_decode"]
    if not split["active"]:
        pytest.skip(split["status"])
    want = [(i.clone(), l.clone()) for i, l in cpu]
    for mode in ("hw-only", 0.5, "auto"):
        first = [(i.cpu(), l.cpu()) for i, l in loaders(photos, gpu_decode=mode)[1]]
        assert len(first) == len(want)
        for (gi, gl), (ci, cl) in zip(first, want):
            assert torch.equal(gl, cl)
            assert (gi.int() - ci.int()).abs().max().item() <= 48
        if mode == 0.5:
            again = [i.cpu() for i, _ in loaders(photos, gpu_decode=mode)[1]]
            assert all(torch.equal(a, b) for (a, _), b in zip(first, again))
    loader = loaders(photos, gpu_decode="auto")[1]
    for _ in loader:
        pass
    split = loader.stats()["gpu_decode"]
    assert split["active"] and "nvJPEG hardware backend on cuda" in split["status"]
    assert split["gpu_images"] + split["cpu_images"] == 27 and split["gpu_images"] > 0


def test_record_stream_waits_for_the_copy_not_for_the_current_stream(photos):
    """A side stream that record_stream ordered waits for the batch's copy only: with the current
    stream busy for about a second, work queued on the side stream finishes at once (waiting on
    the current stream, as the old method did, would hold it for that second). Inside
    ``with torch.cuda.stream(side):`` it still goes through the batch's own fence."""
    _, cuda = loaders(photos, prefetch_factor=1)
    side = torch.cuda.Stream()
    batch = next(iter(cuda))
    torch.cuda.synchronize()  # the batch's copy has finished
    torch.cuda._sleep(2_000_000_000)  # about a second of the current stream's time
    batch.record_stream(side)
    with torch.cuda.stream(side):
        done = torch.cuda.Event()
        done.record(side)
    deadline = time.monotonic() + 0.5
    while not done.query() and time.monotonic() < deadline:
        time.sleep(0.001)
    finished_early = done.query()
    torch.cuda.synchronize()
    assert finished_early, "the side stream waited for the current stream's work"

    used = []

    class Spy:
        def __init__(self, fence):
            self.fence = fence

        def use_on(self, stream, tensors):
            used.append(stream)
            self.fence.use_on(stream, tensors)

    batch._fence = Spy(batch._fence)
    with torch.cuda.stream(side):
        batch.record_stream(side)
        total = batch.images.sum(dtype=torch.int64)
    assert used == [side]
    torch.cuda.synchronize()
    assert total.item() == batch.images.sum(dtype=torch.int64).item()
