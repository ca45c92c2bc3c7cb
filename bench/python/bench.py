"""The Python loaders benchmark (issue 21): Conveyor from Python against conveyor-bench (the same
engine from C++) and against the Python loaders a PyTorch user would pick instead, on the same
files and cores: RandomResizedCrop 224 + horizontal flip, uint8, batch 256.

    bench/python/setup-peers                      # once: the peers' venv (prints its path)
    PEERS/bin/python bench/python/bench.py [--data DIR] [--workers 2] [--rounds 3] [--epochs 2]
        [--loaders conveyor,conveyor-bench,torch-pil,torch-decode-jpeg,dali-cpu,spdl,ffcv]
        [--device cpu|cuda] [--json FILE]

(scripts/run --python does both.) Each loader runs in a process of its own, in turn, and the
rounds interleave them, so a machine whose speed drifts affects every loader alike; a loader's
figure is its median over the rounds, and each ratio is the median of the per-round ratios
(Conveyor from Python / the other). Timing starts once a loader is built (its worker processes or
threads may still be starting) and ends after `--epochs` epochs; FFCV's .beton is written first and
timed on its own, and its numba compilation is taken out by one untimed epoch. A loader that fails
reports its error and the table says so. The default data is conveyor-bench's photo-like dataset
(1,500 JPEGs, about 500x375, in ~/.cache/conveyor/datasets/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CROP = 224
BATCH = 256
ALL = ["conveyor", "conveyor-bench", "torch-pil", "torch-decode-jpeg", "dali-cpu", "spdl", "ffcv"]


# ------------------------------------------------------------------------------------------------
# One loader, in this process: each returns (images, seconds) for `epochs` epochs.

def timed_epochs(make_iter, epochs, count):
    images = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in make_iter():
            images += count(batch)
    return images, time.perf_counter() - start


def run_conveyor(data, workers, epochs, device):
    import torch

    import conveyor

    train = conveyor.ImageFolder(data, transform=conveyor.RandomResizedCrop(CROP, flip=True))
    loader = conveyor.DataLoader(train, batch_size=BATCH, shuffle=True, num_workers=workers,
                                 seed=0, device=device)
    result = timed_epochs(lambda: loader, epochs, lambda b: b[0].shape[0])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return result + ({"mode": loader.mode},)


def torch_loader(dataset, workers):
    import torch

    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True,
                                       num_workers=workers, persistent_workers=workers > 0,
                                       prefetch_factor=2 if workers > 0 else None)


def run_torch_pil(data, workers, epochs, device):
    import torchvision
    from torchvision.transforms import v2

    t = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip(),
                    v2.PILToTensor()])
    loader = torch_loader(torchvision.datasets.ImageFolder(data, transform=t), workers)
    return timed_epochs(lambda: loader, epochs, lambda b: b[0].shape[0])


class DecodeJpegFolder:
    """torchvision.io.decode_jpeg on the file's bytes, then the v2 transforms on the tensor."""

    def __init__(self, root):
        import torchvision
        from torchvision.transforms import v2

        self.samples = torchvision.datasets.ImageFolder(root).samples
        self.transform = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True),
                                     v2.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        import torchvision

        path, label = self.samples[i]
        image = torchvision.io.decode_jpeg(torchvision.io.read_file(path))
        return self.transform(image), label


def run_torch_decode_jpeg(data, workers, epochs, device):
    loader = torch_loader(DecodeJpegFolder(data), workers)
    return timed_epochs(lambda: loader, epochs, lambda b: b[0].shape[0])


def run_dali_cpu(data, workers, epochs, device):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=BATCH, num_threads=workers, device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=data, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=CROP, resize_y=CROP)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip())
        return images, labels

    p = pipe()
    p.build()
    loader = DALIGenericIterator(p, ["images", "labels"], reader_name="Reader",
                                 last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)
    return timed_epochs(lambda: loader, epochs, lambda b: b[0]["images"].shape[0])


def run_spdl(data, workers, epochs, device):
    import random

    import spdl.io
    import torch
    import torchvision
    from spdl.pipeline import PipelineBuilder

    samples = torchvision.datasets.ImageFolder(data).samples
    rng = random.Random(0)

    def load(sample):
        path, label = sample
        packets = spdl.io.demux_image(path)
        w, h = packets.width, packets.height
        # torchvision's RandomResizedCrop box, cropped and scaled by FFmpeg's filters.
        top, left, ch, cw = torchvision.transforms.RandomResizedCrop.get_params(
            torch.empty(1, h, w), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        flip = ",hflip" if rng.random() < 0.5 else ""
        frames = spdl.io.decode_packets(
            packets, filter_desc=f"crop={cw}:{ch}:{left}:{top},scale={CROP}:{CROP}{flip},"
                                 f"format=rgb24")
        return spdl.io.to_torch(spdl.io.convert_frames(frames)), label

    def collate(items):
        images = torch.stack([i.reshape(CROP, CROP, 3) for i, _ in items]).permute(0, 3, 1, 2)
        return images, torch.tensor([label for _, label in items])

    def epoch():
        order = samples[:]
        rng.shuffle(order)
        pipeline = (PipelineBuilder().add_source(order).pipe(load, concurrency=workers)
                    .aggregate(BATCH).pipe(collate).add_sink(2).build(num_threads=workers))
        with pipeline.auto_stop():
            yield from pipeline

    return timed_epochs(epoch, epochs, lambda b: b[0].shape[0])


def write_beton(data, path, workers):
    import torchvision
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    dataset = torchvision.datasets.ImageFolder(data)
    writer = DatasetWriter(str(path), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                                       "label": IntField()}, num_workers=workers)
    start = time.perf_counter()
    writer.from_indexed_dataset(dataset)
    return time.perf_counter() - start


def run_ffcv(data, workers, epochs, device, beton):
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    loader = Loader(beton, batch_size=BATCH, num_workers=workers, order=OrderOption.RANDOM,
                    drop_last=False, seed=0,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((CROP, CROP)),
                                         RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
                               "label": [IntDecoder(), ToTensor(), Squeeze()]})
    compile_start = time.perf_counter()
    for _ in loader:  # numba compiles the pipeline in the first epoch: not timed
        pass
    compile_seconds = time.perf_counter() - compile_start
    return timed_epochs(lambda: loader, epochs, lambda b: b[0].shape[0]) + (
        {"first_epoch_seconds": compile_seconds},)


RUNS = {"conveyor": run_conveyor, "torch-pil": run_torch_pil,
        "torch-decode-jpeg": run_torch_decode_jpeg, "dali-cpu": run_dali_cpu, "spdl": run_spdl,
        "ffcv": run_ffcv}


def child(args):
    """--run NAME: one loader's epochs in this process; prints one JSON line."""
    extra = {}
    try:
        fn = RUNS[args.run]
        call = (args.data, args.workers, args.epochs, args.device)
        if args.run == "ffcv":
            call += (args.beton,)
        out = fn(*call)
        images, seconds = out[0], out[1]
        if len(out) > 2:
            extra = out[2]
        print(json.dumps({"images": images, "seconds": seconds, **extra}), flush=True)
    except Exception as error:  # reported, not fatal: the table says which loader failed
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)


# ------------------------------------------------------------------------------------------------
# The orchestrator.

def run_one(name, args, beton):
    if name == "conveyor-bench":
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [args.conveyor_bench, "--data", args.data, "--workers", str(args.workers),
                   "--epochs", str(args.epochs), "--rounds", "1", "--batch-size", str(BATCH),
                   "--crop", str(CROP), "--device", args.device, "--json", out.name]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                return {"error": done.stderr.strip().splitlines()[-1:]}
            figures = json.loads(Path(out.name).read_text())
            return {"images_per_s": figures["images_per_s"]}
    cmd = [sys.executable, __file__, "--run", name, "--data", args.data, "--workers",
           str(args.workers), "--epochs", str(args.epochs), "--device", args.device,
           "--beton", str(beton)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    result = json.loads(lines[-1])
    if "images" in result:
        result["images_per_s"] = result["images"] / result["seconds"]
    return result


def default_data(conveyor_bench):
    done = subprocess.run([conveyor_bench, "--generate-only"], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip().splitlines()[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="an ImageFolder (default: conveyor-bench's dataset)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--loaders", default=",".join(ALL))
    parser.add_argument("--conveyor-bench", default=str(REPO / "build" / "bench" / "conveyor-bench"))
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--beton", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return child(args)
    if not args.data:
        args.data = default_data(args.conveyor_bench)
    loaders = [name for name in args.loaders.split(",") if name]
    for name in loaders:
        if name not in ALL:
            parser.error(f"unknown loader {name!r} (known: {', '.join(ALL)})")
    if "conveyor" not in loaders:
        loaders.insert(0, "conveyor")
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}",
              "load_before": os.getloadavg(), "data": args.data, "workers": args.workers,
              "epochs": args.epochs, "rounds": args.rounds, "device": args.device}
    with tempfile.TemporaryDirectory() as work:
        beton = Path(work) / "data.beton"
        if "ffcv" in loaders:
            print("ffcv: writing the .beton ...", file=sys.stderr, flush=True)
            done = subprocess.run(
                [sys.executable, "-c",
                 "import sys; sys.path.insert(0, sys.argv[1]); import bench; "
                 "print(bench.write_beton(sys.argv[2], sys.argv[3], int(sys.argv[4])))",
                 str(Path(__file__).parent), args.data, str(beton), str(args.workers)],
                capture_output=True, text=True)
            if done.returncode == 0:
                report["ffcv_beton_seconds"] = float(done.stdout.strip().splitlines()[-1])
                report["ffcv_beton_bytes"] = beton.stat().st_size
            else:
                report["ffcv_beton_error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
        rounds = {name: [] for name in loaders}
        for r in range(args.rounds):
            for name in loaders:
                load = os.getloadavg()[0]
                result = run_one(name, args, beton)
                result["load_1min_before"] = load
                rounds[name].append(result)
                shown = (f"{result['images_per_s']:.1f} images/s" if "images_per_s" in result
                         else f"failed: {result.get('error')}")
                print(f"round {r + 1}/{args.rounds}  {name:18s} {shown}  (load {load:.2f})",
                      file=sys.stderr, flush=True)
    report["load_after"] = os.getloadavg()
    summary = {}
    main_rates = [x.get("images_per_s") for x in rounds["conveyor"]]
    for name in loaders:
        rates = [x.get("images_per_s") for x in rounds[name]]
        entry = {"rounds": rounds[name]}
        good = [v for v in rates if v]
        if good:
            entry["images_per_s"] = statistics.median(good)
        ratios = [m / v for m, v in zip(main_rates, rates) if m and v]
        if ratios and name != "conveyor":
            entry["conveyor_python_over_this"] = statistics.median(ratios)
        errors = [x["error"] for x in rounds[name] if "error" in x]
        if errors:
            entry["error"] = errors[0]
        summary[name] = entry
    report["loaders"] = summary
    print(f"\n{report['date']}  {report['machine']}  load {report['load_before'][0]:.2f}  "
          f"workers {args.workers}  batch {BATCH}  crop {CROP}  epochs {args.epochs}  "
          f"rounds {args.rounds}  device {args.device}")
    print(f"{'loader':20s} {'images/s':>10s} {'Conveyor (Python) / it':>24s}")
    for name, entry in summary.items():
        rate = f"{entry['images_per_s']:.1f}" if "images_per_s" in entry else "failed"
        ratio = entry.get("conveyor_python_over_this")
        shown = f"{ratio:.2f}x" if ratio else ("" if name == "conveyor" else "n/a")
        print(f"{name:20s} {rate:>10s} {shown:>24s}" +
              (f"   ({entry['error']})" if "error" in entry else ""))
    if "ffcv_beton_seconds" in report:
        print(f"ffcv .beton written in {report['ffcv_beton_seconds']:.1f} s "
              f"({report['ffcv_beton_bytes'] / 2**20:.0f} MiB), not in its images/s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
