"""Shared fixtures of the Python tests: small generated datasets, the C++ reference program, a
real nginx on loopback (as tests/nginx_server.h starts it), and helpers for processes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import conveyor

REPO = Path(__file__).resolve().parents[2]
# Crops small enough for fast tests; the engine's decode path is the same at any size.
CROP = 32


@pytest.fixture(scope="session")
def photos(tmp_path_factory) -> Path:
    """An ImageFolder of 3 classes x 9 photo-like JPEGs (27 images: batches of 4 leave 3)."""
    root = tmp_path_factory.mktemp("photos") / "folder"
    info = conveyor.generate_image_folder(str(root), classes=3, images_per_class=9, seed=5)
    assert info["images"] == 27
    return root


@pytest.fixture(scope="session")
def reference_program() -> Path:
    """The C++ loader's output, for the same-bytes tests (built beside the extension)."""
    path = Path(os.environ.get("CONVEYOR_PY_REFERENCE",
                               REPO / "build-py" / "wheel" / "python" / "conveyor-py-reference"))
    if not path.exists():
        pytest.fail(f"{path} is missing: install the package with `python -m pip install "
                    f"--no-build-isolation .` (it builds the reference program too), or set "
                    f"CONVEYOR_PY_REFERENCE")
    return path


def prepare_tool() -> str:
    """conveyor-prepare, installed beside the environment's python by the package."""
    candidate = Path(sys.executable).parent / "conveyor-prepare"
    found = str(candidate) if candidate.exists() else shutil.which("conveyor-prepare")
    if not found:
        pytest.fail("conveyor-prepare is not installed beside python (pip install . installs it)")
    return found


@pytest.fixture(scope="session")
def shards(photos, tmp_path_factory) -> Path:
    """The photos as indexed WebDataset shards: DIR/photos-000000.tar .. + photos.index.json."""
    out = tmp_path_factory.mktemp("shards")
    subprocess.run([prepare_tool(), str(photos), str(out / "photos"), "--format", "wds",
                    "--shard-size", "400000"], check=True, capture_output=True, timeout=120)
    assert len(list(out.glob("photos-*.tar"))) >= 3
    return out


def shard_pattern(folder) -> str:
    tars = sorted(Path(folder).glob("photos-*.tar"))
    digits = len(tars[0].stem.split("-")[-1])
    return f"photos-{{{0:0{digits}d}..{len(tars) - 1:0{digits}d}}}.tar"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """Debian's nginx serving `root` on loopback: one process (master_process off), never a
    service; stop() is one SIGKILL, so clients then meet a refused connection."""

    def __init__(self, root: Path, work: Path) -> None:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(binary).exists():
            pytest.fail("nginx is missing (scripts/setup installs nginx-light)")
        self.port = free_port()
        work.mkdir(parents=True, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""
        temp = "".join(f"  {k}_temp_path {work}/{k};\n"
                       for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (work / "nginx.conf").write_text(
            f"daemon off;\nmaster_process off;\nworker_processes 1;\n{user}"
            f"error_log {work}/error.log warn;\npid {work}/nginx.pid;\n"
            f"events {{ worker_connections 256; }}\n"
            f"http {{\n  access_log off;\n  sendfile on;\n  keepalive_requests 100000;\n{temp}"
            f"  types {{ }} default_type application/octet-stream;\n"
            f"  server {{ listen 127.0.0.1:{self.port}; root {root}; }}\n}}\n")
        self.process = subprocess.Popen([binary, "-p", f"{work}/", "-c", str(work / "nginx.conf")])
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("nginx did not start: " +
                                       (work / "error.log").read_text(errors="replace"))
                time.sleep(0.01)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def nginx(shards, tmp_path):
    server = Nginx(shards, tmp_path / "nginx")
    yield server
    server.stop()


class SilentServer:
    """Accepts connections on loopback and never answers: a server that hangs."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def batches_of(loader, epochs: int = 1):
    """Every batch of `epochs` epochs as (epoch, indices, image bytes, labels), copied."""
    out = []
    for _ in range(epochs):
        for batch in loader:
            images, labels = batch
            out.append((batch.epoch, list(batch.indices), images.clone(), labels.clone()))
    return out


# A child started by a shell without job control (`cmd &`, nohup, some CI runners) inherits
# SIGINT ignored, and Python then installs no KeyboardInterrupt handler: put back what a terminal
# user's Python has, so that the Ctrl-C tests test the loader and not the parent's shell.
CHILD_PRELUDE = "import signal as _signal; _signal.signal(_signal.SIGINT, _signal.default_int_handler)\n"


def python_child(code: str, *args: str, deadline: float = 120.0, **kwargs) -> subprocess.Popen:
    """A Python process running `code` with this environment's conveyor. It is killed after
    `deadline` seconds, so that a test reading its output fails rather than hangs."""
    child = subprocess.Popen([sys.executable, "-c", CHILD_PRELUDE + code, *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    watchdog = threading.Timer(deadline, child.kill)
    watchdog.daemon = True
    watchdog.start()
    return child


requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and conveyor.cuda_available()),
    reason="no usable CUDA device here (torch.cuda.is_available() is False): the CUDA path "
           "(device='cuda') needs a GPU machine")

SIGINT = signal.SIGINT
