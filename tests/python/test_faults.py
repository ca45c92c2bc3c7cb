"""Faults and Python's own rules: corrupt files, dead and silent servers, timeouts, Ctrl-C in a
wait, del mid-epoch, many loaders, forked children, interpreter exit."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import conveyor
from conftest import CROP, python_child, rss_bytes, shard_pattern, thread_count


@pytest.fixture
def corrupt_folder(photos, tmp_path) -> Path:
    root = tmp_path / "folder"
    shutil.copytree(photos, root)
    victim = sorted(root.glob("*/*"))[10]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 3])  # truncated: libjpeg-turbo reports it
    return root


def test_corrupt_file_under_raise_is_a_sample_error_naming_it(corrupt_folder):
    ds = conveyor.ImageFolder(corrupt_folder, transform=conveyor.RandomResizedCrop(CROP))
    victim = sorted(str(p) for p in corrupt_folder.glob("*/*"))[10]
    loader = conveyor.DataLoader(ds, batch_size=4, num_workers=2)
    with pytest.raises(conveyor.SampleError) as caught:
        for _ in loader:
            pass
    assert caught.value.index == 10
    assert caught.value.path == victim
    assert victim in str(caught.value) and caught.value.reason
    assert isinstance(caught.value, RuntimeError)


def test_corrupt_file_under_skip_is_replaced_and_counted(corrupt_folder):
    ds = conveyor.ImageFolder(corrupt_folder, transform=conveyor.RandomResizedCrop(CROP))
    loader = conveyor.DataLoader(ds, batch_size=4, num_workers=2, on_error="skip")
    rows = [i for batch in loader for i in batch.indices]
    assert len(rows) == 27 and 10 not in rows
    stats = loader.stats()
    assert stats["skipped"] == 1 and stats["skipped_samples"][0]["index"] == 10


def shards_over(server, shards, **kwargs):
    url = server.url(shard_pattern(shards))
    return conveyor.tar_shards(url, conveyor.RandomResizedCrop(CROP, flip=True),
                               index=str(shards / "photos.index.json"), **kwargs)


def test_http_shards_from_nginx_have_the_folders_bytes(photos, shards, nginx):
    t = conveyor.RandomResizedCrop(CROP, flip=True)

    def epoch(ds):
        loader = conveyor.DataLoader(ds, batch_size=4, shuffle=True, seed=2, num_workers=2)
        return [(b.indices, b.images.clone(), b.labels.clone()) for b in loader]

    folder = epoch(conveyor.ImageFolder(photos, transform=t))
    remote = conveyor.tar_shards(nginx.url(shard_pattern(shards)), t)
    assert remote.describe(0).startswith("http://127.0.0.1:")
    over_http = epoch(remote)
    local = epoch(conveyor.tar_shards(str(shards / shard_pattern(shards)), t))
    for a, b, c in zip(folder, over_http, local):
        assert a[0] == b[0] == c[0]
        assert torch.equal(a[1], b[1]) and torch.equal(a[1], c[1]) and torch.equal(a[2], b[2])
    # Streaming over HTTP: every sample once per epoch, in the stream's own order.
    streamed = conveyor.tar_shards(nginx.url(shard_pattern(shards)), t, streaming=True)
    loader = conveyor.DataLoader(streamed, batch_size=4, num_workers=2, seed=2)
    labels = sorted(label for b in loader for label in b.labels.tolist())
    assert labels == sorted(label for _, label in conveyor.ImageFolder(photos, t).samples)


def test_a_dead_server_is_a_sample_error_naming_the_url(shards, nginx):
    ds = shards_over(nginx, shards, retries=1, backoff=(0.01, 0.02), request_timeout=2.0)
    loader = conveyor.DataLoader(ds, batch_size=4, num_workers=2, timeout=60)
    nginx.stop()
    with pytest.raises(conveyor.SampleError) as caught:
        next(iter(loader))
    assert f"127.0.0.1:{nginx.port}" in str(caught.value)
    assert caught.value.index in range(4)


def test_a_silent_server_hits_the_loaders_timeout(shards, silent_server):
    ds = shards_over(silent_server, shards, retries=0, request_timeout=3.0)
    loader = conveyor.DataLoader(ds, batch_size=4, num_workers=1, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no batch arrived within 500 ms"):
        next(iter(loader))
    assert time.monotonic() - start < 2.5  # the loader's deadline, before the request's 3 s
    del loader


CTRL_C_CHILD = textwrap.dedent("""
    import sys, time, conveyor
    shards, url, index = sys.argv[1:4]
    # A worker inside a request to the silent server holds the loader's close until the
    # request's deadline: keep it short.
    ds = conveyor.tar_shards(url, conveyor.RandomResizedCrop(32), index=index, retries=0,
                             request_timeout=4.0)
    loader = conveyor.DataLoader(ds, batch_size=4, num_workers=1)
    it = iter(loader)
    print("waiting", flush=True)
    try:
        next(it)
        print("batch", flush=True)
    except KeyboardInterrupt:
        print("interrupted", time.monotonic(), flush=True)
        del it, loader
        print("closed", flush=True)
""")


def test_ctrl_c_in_a_wait_raises_keyboard_interrupt_quickly(shards, silent_server):
    child = python_child(CTRL_C_CHILD, str(shards), silent_server.url(shard_pattern(shards)),
                         str(shards / "photos.index.json"))
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # inside the wait by now
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        line = child.stdout.readline().split()
        assert line and line[0] == "interrupted", child.stderr.read()
        latency = float(line[1]) - sent
        assert latency < 0.5, f"KeyboardInterrupt came {latency * 1000:.0f} ms after SIGINT"
        assert child.stdout.readline().strip() == "closed"
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()


def test_ctrl_c_while_iterating_stops_the_loop_and_the_process_exits(photos):
    code = textwrap.dedent("""
        import sys, conveyor
        ds = conveyor.ImageFolder(sys.argv[1], transform=conveyor.RandomResizedCrop(32))
        loader = conveyor.DataLoader(ds, batch_size=1, num_workers=1)
        print("iterating", flush=True)
        try:
            while True:
                for batch in loader:
                    pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """)
    child = python_child(code, str(photos))
    try:
        assert child.stdout.readline().strip() == "iterating"
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == "interrupted", child.stderr.read()
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()


def test_del_mid_epoch_leaves_no_thread(photos):
    gc.collect()
    before = thread_count()
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP))
    loader = conveyor.DataLoader(ds, batch_size=2, num_workers=4)
    assert thread_count() >= before + 4
    for batch in loader:
        break
    kept = batch.images  # a batch outlives its loader
    del loader, batch
    gc.collect()
    assert thread_count() == before
    assert kept.sum() > 0


def test_many_loaders_made_and_dropped_keep_rss_and_threads_flat(photos):
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP))

    def cycle(times):
        for _ in range(times):
            loader = conveyor.DataLoader(ds, batch_size=4, num_workers=3, shuffle=True)
            for _ in zip(range(2), loader):
                pass
            del loader

    cycle(20)  # warm: allocator pools, the decoders' first buffers
    gc.collect()
    threads, rss = thread_count(), rss_bytes()
    cycle(100)
    gc.collect()
    assert thread_count() == threads
    grown = rss_bytes() - rss
    assert grown < 16 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over 100 loaders"


def test_a_loader_used_in_a_forked_child_fails_clearly(photos):
    ds = conveyor.ImageFolder(photos, transform=conveyor.RandomResizedCrop(CROP))
    loader = conveyor.DataLoader(ds, batch_size=4, num_workers=2)
    next(iter(loader))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: must fail at once, not hang, and exit cleanly after dropping it
        status = 1
        try:
            try:
                next(iter(loader))
            except RuntimeError as error:
                os.write(write, str(error).encode()[:4000])
                status = 0
            del loader
        finally:
            os._exit(status)
    os.close(write)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.02)
    message = os.read(read, 4000).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0, message
    assert "forked" in message and "process" in message
    assert next(iter(loader)).images.shape[0] == 4  # the parent's loader still works


def test_interpreter_exit_with_live_loaders_is_clean(photos):
    code = textwrap.dedent("""
        import sys, conveyor
        ds = conveyor.ImageFolder(sys.argv[1], transform=conveyor.RandomResizedCrop(32))
        loaders = [conveyor.DataLoader(ds, batch_size=2, num_workers=2) for _ in range(3)]
        its = [iter(l) for l in loaders]
        batches = [next(it) for it in its]
        print("exiting", flush=True)
    """)
    child = python_child(code, str(photos))
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.strip() == "exiting"
