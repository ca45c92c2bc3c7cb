"""The Python loaders benchmark (issue 21): Conveyor from Python against conveyor-bench (the same
engine from C++) and against the Python loaders a PyTorch user would pick instead, on the same
files and cores: RandomResizedCrop 224 + horizontal flip, uint8, batch 256.

    bench/python/setup-peers                      # once: the peers' venv (prints its path)
    PEERS/bin/python bench/python/bench.py [--data DIR] [--workers 2] [--rounds 3] [--epochs 2]
        [--loaders conveyor,conveyor-bench,torch-pil,torch-decode-jpeg,dali-cpu,spdl,ffcv]
        [--device cpu|cuda] [--json FILE]

`--format png|webp|mixed` (issue 32) runs on the --data JPEGs re-encoded once by Pillow (PNG; lossy
WebP at quality 80; mixed: a third each of JPEG, PNG and WebP), written beside them; its torch
peers are `torch-pil` (torchvision v2's transforms on PIL, the issue's reference) and
`torch-pil-plain`, PyTorch's DataLoader with PIL's decode and the same RandomResizedCrop 224 + flip
done with PIL, without torchvision:

    python bench/python/bench.py --format webp --loaders conveyor,torch-pil-plain

(scripts/run --python does both.) Each loader runs in a process of its own, in turn, and the
rounds interleave them, so a machine whose speed drifts affects every loader alike; a loader's
figure is its median over the rounds, and each ratio is the median of the per-round ratios
(Conveyor from Python / the other). Timing starts once a loader is built (its worker processes or
threads may still be starting) and ends after `--epochs` epochs; FFCV's .beton is written first and
timed on its own, and its numba compilation is taken out by one untimed epoch. A loader that fails
reports its error and the table says so. The default data is conveyor-bench's photo-like dataset
(1,500 JPEGs, about 500x375, in ~/.cache/conveyor/datasets/).

`--clip` compares instead on CLIP-style WebDataset shards (issue 31), written first with
webdataset.ShardWriter from the --data images: per sample a `jpg`, a `txt` caption of about 100
bytes and a `json` of about 1 kB, as img2dataset writes them (keys `%09d`), then indexed with
`conveyor-prepare --index-only` for the random-access runs:

    PEERS/bin/python bench/python/bench.py --clip [--data DIR] [--clip-samples 1500]
        [--loaders conveyor-fields,conveyor-image,conveyor-fields-indexed,conveyor-image-indexed,
                   webdataset] [--workers 2] [--rounds 3] [--epochs 2] [--json FILE]

- conveyor-fields: `conveyor.tar_shards(..., fields={"image": Image("jpg", RandomResizedCrop 224
  + flip), "caption": Text("txt"), "meta": Json("json")}, streaming=True)`, 2 workers;
- conveyor-image: the same with the image field alone (what the caption and JSON cost);
- conveyor-fields-indexed, conveyor-image-indexed: the same through the index, shuffled;
- webdataset: webdataset 1.0's `WebDataset(shards).shuffle(1000).decode("pil")
  .to_tuple("jpg", "txt", "json").map_tuple(v2 RandomResizedCrop 224 + flip + PILToTensor, ...)`
  in torch's DataLoader with 2 worker processes, batched as Conveyor's: stacked images, captions a
  list of str, JSON a list of parsed values.

Every run reads the same samples for `--epochs` epochs; the clock starts after the first
`--workers` batches (worker start-up and first reads) and the samples counted are those after
them, the same count for every loader. The ratios are medians of per-round ratios:
conveyor-fields / webdataset (and the indexed run / webdataset), conveyor-fields /
conveyor-image (and indexed / indexed). Each run's samples are counted: a loader that reads a
sample twice or misses one fails. Conveyor's runs also say where the time goes, from its stats:
the workers' fill time and the loop's time outside waits (Python's: the batch's dict, its str
and parsed JSON), per sample, over the whole run.

`--sqlite` compares on the user's own dataset (issue 36): the photos (--data, else the mixed
photo-like dataset of --sqlite-images, 1,500: held-out-like files of various sizes, a few percent
gray, CMYK, progressive) written once as BLOBs with a label column into a SQLite database beside
the folder (Python's sqlite3; bench/python/sqlite_photos.py), read back by a
torch.utils.data.Dataset with one connection per thread:

    PEERS/bin/python bench/python/bench.py --sqlite [--data DIR | --sqlite-images 1500]
        [--loaders conveyor-sqlite,conveyor-sqlite@1,conveyor-folder,torch-sqlite]
        [--workers 2] [--rounds 3] [--epochs 2] [--batch-size 256] [--json FILE]

- conveyor-sqlite: `conveyor.from_dataset(SqlitePhotos(db), fields={"image": Image("jpg",
  RandomResizedCrop 224 + flip), "label": Int("cls")})` in conveyor.DataLoader, --workers
  threads; NAME@W runs it with W workers (conveyor-sqlite@1: the scaling's base);
- conveyor-folder: conveyor.ImageFolder over the same files (the target: >= 0.9x of it);
- torch-sqlite: PyTorch's DataLoader over the same Dataset decoding with PIL
  (`Image.open(BytesIO).convert("RGB")`) and torchvision v2 RandomResizedCrop 224 + flip +
  PILToTensor, --workers processes (the target: >= 2.5x of it); skipped, with the reason, where
  torchvision is missing.
Every run reads every sample once an epoch (checked) and is timed after its first --workers
batches, the same samples for every loader; the ratios are medians of per-round ratios, and the
conveyor-sqlite runs give the GIL held per sample and its share of the workers' time
(stats()["gil"]).

`--sqlite-memory` measures instead the peak PSS of each run's process tree (the process and its
worker processes: /proc/PID/smaps_rollup's Pss summed, polled every 0.1 s) while the same Dataset
holds a list of --records-mb (500) MB of small str objects and each sample reads its share of
them, as a shuffled epoch over a "list of dicts" would (PyTorch's forked workers copy each page
they read: its reference counts are written). Loaders conveyor-sqlite (--workers), torch-sqlite
and torch-sqlite@8; 1 round unless --rounds:

    PEERS/bin/python bench/python/bench.py --sqlite-memory [--records-mb 500] [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
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
ALL = ["conveyor", "conveyor-bench", "torch-pil", "torch-decode-jpeg", "dali-cpu", "spdl", "ffcv",
       "torch-pil-plain"]


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
        # ImageReadMode.RGB: a gray JPEG (ImageNet holds some) comes out 3-channel, as PIL's
        # convert("RGB") gives, or the DataLoader's collate fails on mixed channel counts.
        image = torchvision.io.decode_jpeg(torchvision.io.read_file(path),
                                           mode=torchvision.io.ImageReadMode.RGB)
        return self.transform(image), label


class PilFolder:
    """An ImageFolder read without torchvision: PIL's decode (`convert("RGB")`, any format),
    RandomResizedCrop's box drawn by torchvision's rule (scale 0.08-1, ratio 3/4-4/3, 10 tries,
    then the centre), cut and resized to CROP x CROP by PIL's bilinear filter, a flip with
    probability 1/2, and a uint8 CHW tensor: the torch peer of --format png/webp."""

    EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")

    def __init__(self, root):
        classes = sorted(d.name for d in Path(root).iterdir() if d.is_dir())
        self.samples = [(str(p), label) for label, name in enumerate(classes)
                        for p in sorted((Path(root) / name).iterdir())
                        if p.suffix.lower() in self.EXTENSIONS]

    def __len__(self):
        return len(self.samples)

    @staticmethod
    def crop_box(width, height):
        area = width * height
        for _ in range(10):
            target = area * random.uniform(0.08, 1.0)
            aspect = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                left, top = random.randint(0, width - w), random.randint(0, height - h)
                return left, top, left + w, top + h
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        return left, top, left + side, top + side

    def __getitem__(self, i):
        import torch
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as opened:
            image = opened.convert("RGB")
        image = image.resize((CROP, CROP), Image.BILINEAR, box=self.crop_box(*image.size))
        if random.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        return pixels.view(CROP, CROP, 3).permute(2, 0, 1), label


def run_torch_pil_plain(data, workers, epochs, device):
    loader = torch_loader(PilFolder(data), workers)
    return timed_epochs(lambda: loader, epochs, lambda b: b[0].shape[0])


def converted_data(data, fmt):
    """The --data folder with every image re-encoded by Pillow as `fmt` (png: Pillow's default
    compression; webp: lossy, quality 80; mixed: a third of the files each as the JPEG itself, PNG
    and WebP, by place in path order), written once beside it (DATA-png, DATA-webp,
    DATA-mixed)."""
    from PIL import Image

    out = Path(str(data).rstrip("/") + "-" + fmt)
    done = out / ".complete"
    if done.exists():
        return str(out)
    print(f"writing {out} ...", file=sys.stderr, flush=True)
    count = 0
    for path in sorted(Path(data).rglob("*")):
        if path.suffix.lower() not in (".jpg", ".jpeg"):
            continue
        kind = fmt
        if fmt == "mixed":  # a third each, by the file's place in path order
            kind = ("jpeg", "png", "webp")[count % 3]
        count += 1
        target = out / path.relative_to(data).with_suffix("." + kind)
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "jpeg":
            shutil.copyfile(path, target)
            continue
        with Image.open(path) as image:
            rgb = image.convert("RGB")
        if kind == "webp":
            rgb.save(target, "WEBP", quality=80)
        else:
            rgb.save(target, "PNG")
    done.write_text("")
    return str(out)


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


RUNS = {"conveyor": run_conveyor, "torch-pil": run_torch_pil, "torch-pil-plain": run_torch_pil_plain,
        "torch-decode-jpeg": run_torch_decode_jpeg, "dali-cpu": run_dali_cpu, "spdl": run_spdl,
        "ffcv": run_ffcv}


# ------------------------------------------------------------------------------------------------
# The CLIP-style comparison (--clip): shards of jpg + txt + json.

CLIP_ALL = ["conveyor-fields", "conveyor-image", "conveyor-fields-indexed",
            "conveyor-image-indexed", "webdataset"]
# (numerator, denominator) of each reported ratio, the headline first.
CLIP_RATIOS = [("conveyor-fields", "webdataset"), ("conveyor-fields-indexed", "webdataset"),
               ("conveyor-fields", "conveyor-image"),
               ("conveyor-fields-indexed", "conveyor-image-indexed")]
CLIP_WORDS = ("a photo of the old red wooden house by the lake at sunset with mountains in the "
              "background two dogs playing on green grass close up portrait of a smiling woman "
              "wearing blue jacket vintage car parked on cobblestone street in Paris café "
              "aerial view city skyline night lights abstract painting colorful shapes texture "
              "bowl of fresh fruit on kitchen table").split()


def clip_caption(rng):
    """About 100 bytes of UTF-8 text (at least 96), as issue 31 describes CLIP's captions."""
    words = []
    while len(" ".join(words).encode()) < 96:
        words.append(rng.choice(CLIP_WORDS))
    return " ".join(words)


def clip_meta(rng, key, caption):
    """About 1 kB of JSON, the fields img2dataset writes beside each image (EXIF as a string)."""
    r = rng.randint
    exif = {"Image Make": rng.choice(["Canon", "NIKON CORPORATION", "SONY", "Apple"]),
            "Image Model": f"Model {r(1, 999)}", "Image Orientation": "Horizontal",
            "Image XResolution": "72", "Image YResolution": "72",
            "Image Software": f"Adobe Photoshop Lightroom Classic {r(7, 13)}.{r(0, 5)} (Windows)",
            "EXIF ExposureTime": f"1/{r(30, 4000)}", "EXIF FNumber": f"{r(14, 220) / 10}",
            "EXIF ExposureProgram": "Aperture priority",
            "EXIF ISOSpeedRatings": str(rng.choice([100, 200, 400, 800, 1600])),
            "EXIF DateTimeOriginal": f"20{r(10, 24)}:0{r(1, 9)}:1{r(0, 9)} "
                                     f"1{r(0, 9)}:2{r(0, 9)}:3{r(0, 9)}",
            "EXIF FocalLength": str(r(18, 200)),
            "EXIF LensModel": f"EF{r(10, 100)}-{r(100, 400)}mm f/4L IS USM"}
    return {"url": f"https://images.example.com/photos/{rng.getrandbits(64):016x}/"
                   f"{'-'.join(caption.split()[:6])}.jpg",
            "key": key, "caption": caption, "status": "success", "error_message": None,
            "width": 256, "height": 256, "original_width": r(300, 4000),
            "original_height": r(300, 3000), "exif": json.dumps(exif),
            "sha256": f"{rng.getrandbits(256):064x}", "similarity": round(rng.random(), 6),
            "punsafe": round(rng.random() / 10, 6), "pwatermark": round(rng.random() / 2, 6),
            "LICENSE": "?", "NSFW": "UNLIKELY", "language": "en"}


def write_clip_shards(images, out, samples, per_shard=100, seed=0):
    """`samples` CLIP-style samples (the JPEG files of the folder `images`, in turn) into
    out/clip-NNNNNN.tar with webdataset.ShardWriter; returns their brace pattern and the mean
    sizes of the members."""
    import webdataset as wds

    files = sorted(p for p in Path(images).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        raise ValueError(f"no JPEG files under {images}")
    rng = random.Random(seed)
    sizes = {"jpg": 0, "txt": 0, "json": 0}
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "clip-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(samples):
            key = f"{i:09d}"
            caption = clip_caption(rng)
            sample = {"__key__": key, "jpg": files[i % len(files)].read_bytes(),
                      "txt": caption.encode(),
                      "json": json.dumps(clip_meta(rng, key, caption)).encode()}
            for ext in sizes:
                sizes[ext] += len(sample[ext])
            sink.write(sample)
    last = (samples - 1) // per_shard
    pattern = str(out / f"clip-{{000000..{last:06d}}}.tar")
    return pattern, {ext: total / samples for ext, total in sizes.items()}


def timed_after_warmup(loader, epochs, count, warmup, check):
    """Iterates `loader` for `epochs` epochs; returns (samples, samples timed, seconds), the clock
    started after the first `warmup` batches (of which the first goes through `check`)."""
    samples = timed = batches = 0
    start = None
    for _ in range(epochs):
        for batch in loader:
            if not batches:
                check(batch)
            n = count(batch)
            samples += n
            batches += 1
            if start is not None:
                timed += n
            elif batches >= warmup:
                start = time.perf_counter()
    if start is None or not timed:
        raise ValueError(f"{samples} samples in {batches} batches: too few to time after "
                         f"{warmup} warm-up batches")
    return samples, timed, time.perf_counter() - start


def check_clip_batch(images, captions, metas):
    """What a CLIP training loop is handed: uint8 [B, 3, 224, 224] images, a str per caption, a
    parsed JSON object per sample."""
    import torch

    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, CROP, CROP):
        raise ValueError(f"images are {images.dtype} {tuple(images.shape)}")
    if captions is not None and not all(isinstance(c, str) for c in captions):
        raise ValueError(f"captions are not str: {type(captions[0]).__name__}")
    if metas is not None and not all(isinstance(m, dict) for m in metas):
        raise ValueError(f"JSON values are not dicts: {type(metas[0]).__name__}")


def clip_fields(image_only):
    import conveyor

    fields = {"image": conveyor.Image("jpg",
                                      transform=conveyor.RandomResizedCrop(CROP, flip=True))}
    if not image_only:
        fields["caption"] = conveyor.Text("txt")
        fields["meta"] = conveyor.Json("json")
    return fields


def run_clip_conveyor(args):
    import conveyor

    indexed = args.run.endswith("-indexed")
    fields = clip_fields(image_only=args.run.startswith("conveyor-image"))
    if indexed:  # named: a missing index is an error, not a silent fall-back to streaming
        shards = conveyor.tar_shards(args.data, fields=fields, index=args.index)
    else:
        shards = conveyor.tar_shards(args.data, fields=fields, streaming=True)
    loader = conveyor.DataLoader(shards, batch_size=args.batch_size, shuffle=indexed,
                                 num_workers=args.workers, seed=0, device=args.device)
    start = time.perf_counter()
    samples, timed, seconds = timed_after_warmup(
        loader, args.epochs, lambda b: b["image"].shape[0], args.workers,
        lambda b: check_clip_batch(b["image"], b.get("caption"), b.get("meta")))
    stats = loader.stats()
    # Where the time goes, over every epoch (warm-up included): the workers' time filling
    # samples, and the loop's (Python's) time waiting for batches out of its wall time.
    return {"samples": samples, "timed_samples": timed, "seconds": seconds,
            "wall_seconds": time.perf_counter() - start, "fill_seconds": stats["fill_seconds"],
            "wait_seconds": stats["wait_seconds"], "skipped": stats["skipped"]}


def collate_clip(samples):
    """Batches as Conveyor's: the images stacked, captions a list of str, JSON a list."""
    import torch

    images, captions, metas = zip(*samples)
    return torch.stack(images), list(captions), list(metas)


def keep(value):
    return value


def run_clip_webdataset(args):
    import torch
    import webdataset as wds
    from torchvision.transforms import v2

    crop = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip(),
                       v2.PILToTensor()])
    pipeline = (wds.WebDataset(args.data, shardshuffle=100, seed=0)
                .shuffle(1000).decode("pil").to_tuple("jpg", "txt", "json")
                .map_tuple(crop, keep, keep))
    loader = torch.utils.data.DataLoader(pipeline, batch_size=args.batch_size,
                                         num_workers=args.workers, collate_fn=collate_clip,
                                         persistent_workers=args.workers > 0)
    samples, timed, seconds = timed_after_warmup(loader, args.epochs, lambda b: len(b[1]),
                                                 args.workers, lambda b: check_clip_batch(*b))
    return {"samples": samples, "timed_samples": timed, "seconds": seconds}


# ------------------------------------------------------------------------------------------------
# The user's own dataset in SQLite (--sqlite, --sqlite-memory; issue 36). A loader's name may end
# in @W: that run has W workers instead of --workers (conveyor-sqlite@1: the scaling's base).

SQLITE_LOADERS = ["conveyor-sqlite", "conveyor-folder", "torch-sqlite"]
SQLITE_ALL = ["conveyor-sqlite", "conveyor-sqlite@1", "conveyor-folder", "torch-sqlite"]
# (numerator, denominator, target) of each reported ratio, the headline first.
SQLITE_RATIOS = [("conveyor-sqlite", "torch-sqlite", 2.5),
                 ("conveyor-sqlite", "conveyor-folder", 0.9),
                 ("conveyor-sqlite", "conveyor-sqlite@1", None)]
MEMORY_ALL = ["conveyor-sqlite", "torch-sqlite", "torch-sqlite@8"]


def loader_workers(name, workers):
    """(loader, workers) of a loader's name: NAME@W has W workers, NAME --workers."""
    base, at, count = name.partition("@")
    if base not in SQLITE_LOADERS or (at and not (count.isdigit() and int(count) > 0)):
        raise ValueError(f"unknown loader {name!r} (known: {', '.join(SQLITE_LOADERS)}, each "
                         f"optionally @WORKERS)")
    return base, int(count) if at else workers


def prepare_sqlite(args):
    """--run sqlite-prepare: the photos (--data, else the mixed photo-like dataset of
    --sqlite-images) and their database (--sqlite-db, else beside the folder), written once."""
    import sqlite_photos

    folder = Path(args.data) if args.data else sqlite_photos.mixed_photos(args.sqlite_images)
    db = Path(args.sqlite_db) if args.sqlite_db else folder.with_name(folder.name + ".sqlite")
    written = sqlite_photos.write_database(folder, db)
    return {"folder": str(folder), **written, "db_bytes": db.stat().st_size}


def check_images(images):
    import torch

    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, CROP, CROP):
        raise ValueError(f"images are {images.dtype} {tuple(images.shape)}")


def run_sqlite(args):
    """--run NAME[@W] of --sqlite: one loader over the photos for --epochs epochs."""
    import torch

    import process_memory
    import sqlite_photos

    name, workers = loader_workers(args.run, args.workers)
    before = process_memory.pss_kb(os.getpid())
    photos = sqlite_photos.SqlitePhotos(args.sqlite_db, records_mb=args.records_mb)
    result = {"workers": workers}
    if photos.records is not None:  # what the list takes in this process before any worker
        result["records"] = len(photos.records)
        result["records_pss_mb"] = (process_memory.pss_kb(os.getpid()) - before) / 1024
    if name == "torch-sqlite":
        try:
            dataset = sqlite_photos.PilDecoded(photos, CROP)
        except ImportError as missing:
            return {**result, "skipped": f"{missing.name} is not installed: PyTorch's run "
                                         f"decodes with PIL and torchvision's v2 transforms "
                                         f"(bench/python/setup-peers)"}
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                             num_workers=workers, persistent_workers=True,
                                             prefetch_factor=2)
        images = lambda batch: batch[0]  # noqa: E731
    else:  # only Conveyor's runs import it: PyTorch's processes map what they would alone
        import conveyor

        crop = conveyor.RandomResizedCrop(CROP, flip=True)
        if name == "conveyor-folder":
            dataset = conveyor.ImageFolder(args.data, transform=crop)
            images = lambda batch: batch[0]  # noqa: E731
        else:
            dataset = conveyor.from_dataset(photos, fields={
                "image": conveyor.Image("jpg", transform=crop), "label": conveyor.Int("cls")})
            images = lambda batch: batch["image"]  # noqa: E731
        loader = conveyor.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                     num_workers=workers, seed=0)
    start = time.perf_counter()
    # The same warm-up (--workers batches) for every run, so that each times the same samples.
    samples, timed, seconds = timed_after_warmup(loader, args.epochs,
                                                 lambda b: images(b).shape[0], args.workers,
                                                 lambda b: check_images(images(b)))
    result.update(samples=samples, timed_samples=timed, seconds=seconds,
                  wall_seconds=time.perf_counter() - start)
    if args.sqlite_memory:
        # The loader, and PyTorch's persistent worker processes with it, stay a second (ten of
        # the parent's polls) after the last batch: a short run's workers could otherwise live
        # between two polls, and the tree's memory would be counted without them.
        time.sleep(1.0)
    if name == "conveyor-sqlite":
        # Where the time goes, over every epoch: the workers' fill, the loop's waits, the GIL
        # (held to call __getitem__ and copy what it returned), and the connections the
        # workers opened (one per thread).
        stats = loader.stats()
        result.update(fill_seconds=stats["fill_seconds"], wait_seconds=stats["wait_seconds"],
                      skipped=stats["skipped"], gil=stats.get("gil"),
                      connections=photos.connections_opened)
    return result


def run_sqlite_one(name, args, prepared):
    """One run of --sqlite or --sqlite-memory in a process of its own; with --sqlite-memory, the
    peak PSS of its process tree (the process and its worker processes)."""
    import process_memory

    cmd = [sys.executable, __file__, "--run", name, "--data", prepared["folder"], "--sqlite-db",
           prepared["db"], "--workers", str(args.workers), "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--records-mb", str(args.records_mb)]
    if args.sqlite_memory:
        cmd.append("--sqlite-memory")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child_process = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        if args.sqlite_memory:
            with process_memory.PeakPss(child_process.pid) as peak:
                child_process.wait()
        else:  # no polling: it would take CPU from the timed runs
            child_process.wait()
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
        errors = err.read().strip().splitlines()
    if not lines:
        return {"error": (errors or ["no output"])[-1]}
    result = json.loads(lines[-1])
    # With --sqlite-memory the runs' worker counts differ (8 processes prefetch more batches
    # than the warm-up skips): their rates are not comparable, only their wall times are shown.
    if "timed_samples" in result and not args.sqlite_memory:
        result["samples_per_s"] = result["timed_samples"] / result["seconds"]
    if args.sqlite_memory and "samples" in result:  # a run that failed has no figure
        result.update(peak_pss_mb=peak.peak_kb / 1024, processes_at_peak=peak.processes,
                      most_processes=peak.most_processes, pss_polls=peak.polls)
    return result


def gil_per_sample(result):
    """(GIL held us per sample, its share of the workers' time) of a conveyor-sqlite run."""
    gil = result.get("gil") or {}
    if "held_seconds" not in gil or not result.get("samples"):
        return None
    return 1e6 * gil["held_seconds"] / result["samples"], gil.get("share")


def sqlite_main(args, loaders, report):
    """--sqlite and --sqlite-memory: writes the database (once), runs the rounds, prints the
    table."""
    memory = args.sqlite_memory
    cmd = [sys.executable, __file__, "--run", "sqlite-prepare", "--sqlite-images",
           str(args.sqlite_images)]
    cmd += ["--data", args.data] if args.data else []
    cmd += ["--sqlite-db", args.sqlite_db] if args.sqlite_db else []
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    prepared = json.loads(lines[-1]) if lines else {"error": done.stderr.strip()[-2000:]}
    if "error" in prepared:
        raise SystemExit(f"bench.py: the SQLite database: {prepared['error']}")
    report.update(data=prepared["folder"], sqlite=prepared, batch_size=args.batch_size,
                  records_mb=args.records_mb)
    mean_kb = prepared["bytes"] / prepared["images"] / 1000
    how = "reused" if prepared["reused"] else f"written in {prepared['seconds']:.1f} s"
    print(f"sqlite: {prepared['images']} photos, {mean_kb:.0f} kB average, in {prepared['db']} "
          f"({prepared['db_bytes'] / 2**20:.0f} MiB, {how})", file=sys.stderr, flush=True)
    rate = "samples_per_s"
    rounds = run_rounds(loaders, args.rounds, lambda name: run_sqlite_one(name, args, prepared),
                        "peak_pss_mb" if memory else rate, "MB" if memory else "samples")
    report["load_after"] = os.getloadavg()
    expected = prepared["images"] * args.epochs  # every run reads every sample once an epoch
    for results in rounds.values():
        for result in results:
            if "samples" in result and result["samples"] != expected:
                result["error"] = f"read {result['samples']} samples, not {expected}"
                result.pop(rate, None)
                result.pop("peak_pss_mb", None)
    summary = {}
    for name in loaders:
        entry = {"rounds": rounds[name], "workers": loader_workers(name, args.workers)[1]}
        for key in (rate, "peak_pss_mb"):
            good = [x[key] for x in rounds[name] if x.get(key)]
            if good:
                entry[key] = statistics.median(good)
        gil = [g for g in map(gil_per_sample, rounds[name]) if g]
        if gil:
            entry["gil_us_per_sample"] = statistics.median(us for us, _ in gil)
            shares = [s for _, s in gil if s is not None]
            if shares:
                entry["gil_share"] = statistics.median(shares)
        for key in ("error", "skipped"):
            found = [x[key] for x in rounds[name] if key in x]
            if found:
                entry[key] = found[0]
        summary[name] = entry
    ratios = {}
    pairs = ([(over, "conveyor-sqlite", None) for over in loaders if over != "conveyor-sqlite"]
             if memory else SQLITE_RATIOS)
    key = "peak_pss_mb" if memory else rate
    for over, under, target in pairs:
        if over in rounds and under in rounds:
            per_round = paired_ratios(rounds[over], rounds[under], key)
            if per_round:
                ratios[f"{over} / {under}"] = {"median": statistics.median(per_round),
                                               "rounds": per_round, "target": target}
    report["loaders"] = summary
    report["ratios"] = ratios
    print(f"\n{report['date']}  {report['machine']}  load {report['load_before'][0]:.2f}  "
          f"workers {args.workers}  batch {args.batch_size}  crop {CROP}  epochs {args.epochs}  "
          f"rounds {args.rounds}  photos {prepared['images']}"
          + (f"  records {args.records_mb} MB" if memory else ""))
    if memory:
        print(f"{'loader':22s} {'workers':>7s} {'peak PSS MB':>12s} {'processes':>9s} "
              f"{'epochs s':>9s}")
    else:
        print(f"{'loader':22s} {'workers':>7s} {'samples/s':>10s} {'GIL us/sample':>14s} "
              f"{'GIL share':>10s}")
    for name, entry in summary.items():
        shown = f"{entry[rate]:.1f}" if rate in entry else (
            "skipped" if "skipped" in entry else "failed")
        note = entry.get("error") or entry.get("skipped")
        if memory:
            peak = f"{entry['peak_pss_mb']:.0f}" if "peak_pss_mb" in entry else "-"
            good = [x for x in entry["rounds"] if "peak_pss_mb" in x]
            at_peak = max((x["processes_at_peak"] for x in good), default=0)
            wall = (f"{statistics.median(x['wall_seconds'] for x in good):.1f}" if good
                    else "failed")
            print(f"{name:22s} {entry['workers']:>7d} {peak:>12s} {at_peak:>9d} {wall:>9s}"
                  + (f"   ({note})" if note else ""))
        else:
            us = f"{entry['gil_us_per_sample']:.0f}" if "gil_us_per_sample" in entry else ""
            share = f"{entry['gil_share']:.3f}" if "gil_share" in entry else ""
            print(f"{name:22s} {entry['workers']:>7d} {shown:>10s} {us:>14s} {share:>10s}"
                  + (f"   ({note})" if note else ""))
    for label, ratio in ratios.items():
        target = f"  target >= {ratio['target']}x" if ratio["target"] else ""
        print(f"{label:44s} {ratio['median']:.3f}x{target}  (rounds: "
              f"{', '.join(f'{r:.3f}' for r in ratio['rounds'])})")
    if memory:
        built = [x["records_pss_mb"] for r in rounds.values() for x in r if "records_pss_mb" in x]
        if built:
            print(f"the list of records: {statistics.median(built):.0f} MB of PSS in the process "
                  f"that made it (median of the runs)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


def child(args):
    """--run NAME: one loader's epochs in this process; prints one JSON line."""
    extra = {}
    try:
        if args.run == "sqlite-prepare":
            print(json.dumps(prepare_sqlite(args)), flush=True)
            return
        if args.run.partition("@")[0] in SQLITE_LOADERS:
            print(json.dumps(run_sqlite(args)), flush=True)
            return
        if args.run in CLIP_ALL:
            run = run_clip_webdataset if args.run == "webdataset" else run_clip_conveyor
            print(json.dumps(run(args)), flush=True)
            return
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
           "--beton", str(beton), "--batch-size", str(args.batch_size)]
    if args.index:
        cmd += ["--index", args.index]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    result = json.loads(lines[-1])
    if "images" in result:
        result["images_per_s"] = result["images"] / result["seconds"]
    if "timed_samples" in result:
        result["samples_per_s"] = result["timed_samples"] / result["seconds"]
    return result


def run_rounds(loaders, rounds, run, rate, unit):
    """Each round runs every loader once, in turn (so that a drifting machine affects all
    alike); returns {loader: [its result in each round]}, each with the 1-minute load before."""
    results = {name: [] for name in loaders}
    for r in range(rounds):
        for name in loaders:
            load = os.getloadavg()[0]
            result = run(name)
            result["load_1min_before"] = load
            results[name].append(result)
            shown = (f"{result[rate]:.1f} {unit}" + ("" if unit == "MB" else "/s")
                     if rate in result else f"skipped: {result['skipped']}"
                     if "skipped" in result else f"failed: {result.get('error')}")
            print(f"round {r + 1}/{rounds}  {name:24s} {shown}  (load {load:.2f})",
                  file=sys.stderr, flush=True)
    return results


def paired_ratios(over, under, rate):
    """The per-round ratios over/under of two loaders' rates (rounds where both ran)."""
    return [a[rate] / b[rate] for a, b in zip(over, under) if a.get(rate) and b.get(rate)]


def default_data(conveyor_bench):
    done = subprocess.run([conveyor_bench, "--generate-only"], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip().splitlines()[-1]


def prepare_tool(given):
    if given:
        return given
    beside = Path(sys.executable).parent / "conveyor-prepare"
    if beside.exists():
        return str(beside)
    return shutil.which("conveyor-prepare") or str(REPO / "build" / "tools" / "conveyor-prepare")


def clip_main(args, loaders, report):
    """--clip: writes the CLIP-style shards, indexes them, runs the rounds, prints the table."""
    report.update(clip_samples=args.clip_samples, clip_per_shard=args.clip_per_shard,
                  batch_size=args.batch_size)
    with tempfile.TemporaryDirectory() as work:
        out = Path(args.clip_shards) if args.clip_shards else Path(work) / "clip"
        start = time.perf_counter()
        pattern, sizes = write_clip_shards(args.data, out, args.clip_samples,
                                           args.clip_per_shard)
        report.update(shards=pattern, mean_member_bytes=sizes,
                      write_seconds=time.perf_counter() - start)
        print(f"clip: {args.clip_samples} samples in {pattern} (mean bytes: jpg "
              f"{sizes['jpg']:.0f}, txt {sizes['txt']:.0f}, json {sizes['json']:.0f})",
              file=sys.stderr, flush=True)
        if any(name.endswith("-indexed") for name in loaders):
            start = time.perf_counter()
            tool = prepare_tool(args.conveyor_prepare)
            try:
                # --force: the shards were just written, so an index beside them is stale
                # (before --index-only, which takes every argument after it as a shard).
                done = subprocess.run([tool, "--force", "--index-only", pattern],
                                      capture_output=True, text=True)
                error = (None if done.returncode == 0
                         else (done.stderr.strip().splitlines() or ["?"])[-1])
            except OSError as failed:
                error = f"{tool}: {failed.strerror}"
            if error is None:
                report["index_seconds"] = time.perf_counter() - start
                args.index = str(out / "clip.index.json")  # PREFIX.index.json beside the shards
            else:
                report["index_error"] = error
                loaders = [name for name in loaders if not name.endswith("-indexed")]
                print(f"clip: no index, so no indexed runs: {report['index_error']}",
                      file=sys.stderr, flush=True)
        args.data = pattern
        rounds = run_rounds(loaders, args.rounds, lambda name: run_one(name, args, None),
                            "samples_per_s", "samples")
    report["load_after"] = os.getloadavg()
    # Every loader reads every sample once an epoch: a count that differs is a failed run.
    expected = args.clip_samples * args.epochs
    for results in rounds.values():
        for result in results:
            if "samples" in result and result["samples"] != expected:
                result["error"] = f"read {result['samples']} samples, not {expected}"
                result.pop("samples_per_s", None)
    summary = {}
    for name in loaders:
        entry = {"rounds": rounds[name]}
        good = [x["samples_per_s"] for x in rounds[name] if x.get("samples_per_s")]
        if good:
            entry["samples_per_s"] = statistics.median(good)
        errors = [x["error"] for x in rounds[name] if "error" in x]
        if errors:
            entry["error"] = errors[0]
        summary[name] = entry
    ratios = {}
    for over, under in CLIP_RATIOS:
        if over in rounds and under in rounds:
            per_round = paired_ratios(rounds[over], rounds[under], "samples_per_s")
            if per_round:
                ratios[f"{over} / {under}"] = {"median": statistics.median(per_round),
                                               "rounds": per_round}
    report["loaders"] = summary
    report["ratios"] = ratios
    print(f"\n{report['date']}  {report['machine']}  load {report['load_before'][0]:.2f}  "
          f"workers {args.workers}  batch {args.batch_size}  crop {CROP}  epochs {args.epochs}  "
          f"rounds {args.rounds}  device {args.device}  samples {args.clip_samples}")
    # Conveyor's runs: the workers' fill time and the loop's time out of waits, per sample.
    print(f"{'loader':24s} {'samples/s':>10s} {'fill us/sample':>15s} {'loop us/sample':>15s}")
    for name, entry in summary.items():
        rate = f"{entry['samples_per_s']:.1f}" if "samples_per_s" in entry else "failed"
        good = [x for x in entry["rounds"] if "fill_seconds" in x and "samples" in x]
        fill = loop = ""
        if good:
            us = [(1e6 * x["fill_seconds"] / x["samples"],
                   1e6 * (x["wall_seconds"] - x["wait_seconds"]) / x["samples"]) for x in good]
            fill = f"{statistics.median(f for f, _ in us):.0f}"
            loop = f"{statistics.median(w for _, w in us):.0f}"
        print(f"{name:24s} {rate:>10s} {fill:>15s} {loop:>15s}" +
              (f"   ({entry['error']})" if "error" in entry else ""))
    for label, ratio in ratios.items():
        print(f"{label:48s} {ratio['median']:.3f}x  (rounds: "
              f"{', '.join(f'{r:.3f}' for r in ratio['rounds'])})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="an ImageFolder (default: conveyor-bench's dataset)")
    parser.add_argument("--format", choices=("jpeg", "png", "webp", "mixed"), default="jpeg",
                        help="png, webp, mixed: the --data JPEGs re-encoded once by Pillow "
                             "(lossy WebP, quality 80; mixed: a third each), beside them")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, help="default 3; with --sqlite-memory 1")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--loaders", help=f"default: {','.join(ALL)}; with --clip: "
                                           f"{','.join(CLIP_ALL)}; with --sqlite: "
                                           f"{','.join(SQLITE_ALL)}; with --sqlite-memory: "
                                           f"{','.join(MEMORY_ALL)} (NAME@W: W workers)")
    parser.add_argument("--conveyor-bench", default=str(REPO / "build" / "bench" / "conveyor-bench"))
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--clip", action="store_true",
                        help="compare on CLIP-style shards (jpg + txt + json) written from --data")
    parser.add_argument("--clip-samples", type=int, default=1500,
                        help="samples in the CLIP-style shards (the --data JPEGs in turn)")
    parser.add_argument("--clip-per-shard", type=int, default=100,
                        help="samples per CLIP-style shard")
    parser.add_argument("--clip-shards", help="write the CLIP-style shards here and keep them "
                                              "(default: a temporary folder)")
    parser.add_argument("--conveyor-prepare", help="indexes the CLIP-style shards (default: "
                                                   "beside python, on PATH or in build/tools)")
    parser.add_argument("--batch-size", type=int, default=BATCH,
                        help=f"the --clip runs' batch size ({BATCH})")
    parser.add_argument("--sqlite", action="store_true",
                        help="the user's own Dataset over photos in SQLite: conveyor.from_dataset "
                             "against PyTorch's DataLoader and Conveyor's ImageFolder")
    parser.add_argument("--sqlite-memory", action="store_true",
                        help="peak PSS of the process tree, the SQLite dataset holding a "
                             "--records-mb list: Conveyor against PyTorch's worker processes")
    parser.add_argument("--sqlite-images", type=int, default=1500,
                        help="photos in the generated mixed dataset (without --data)")
    parser.add_argument("--sqlite-db", help="the SQLite database (default: beside the folder)")
    parser.add_argument("--records-mb", type=int, default=None,
                        help="MB of records the dataset holds (--sqlite-memory: 500; --sqlite: 0)")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--beton", help=argparse.SUPPRESS)
    parser.add_argument("--index", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.records_mb is None:
        args.records_mb = 500 if args.sqlite_memory else 0
    if args.rounds is None:
        args.rounds = 1 if args.sqlite_memory else 3
    if args.run:
        return child(args)
    if sum((args.clip, args.sqlite, args.sqlite_memory)) > 1:
        parser.error("--clip, --sqlite and --sqlite-memory are separate comparisons: one at a time")
    sqlite = args.sqlite or args.sqlite_memory
    if sqlite:
        known = MEMORY_ALL if args.sqlite_memory else SQLITE_ALL
        loaders = [name for name in (args.loaders or ",".join(known)).split(",") if name]
        for name in loaders:
            try:
                loader_workers(name, args.workers)
            except ValueError as error:
                parser.error(str(error))
        if "conveyor-sqlite" not in loaders:
            loaders.insert(0, "conveyor-sqlite")
    else:
        if not args.data:
            args.data = default_data(args.conveyor_bench)
        if args.format != "jpeg":
            args.data = converted_data(args.data, args.format)
        known, main_loader = (CLIP_ALL, "conveyor-fields") if args.clip else (ALL, "conveyor")
        loaders = [name for name in (args.loaders or ",".join(known)).split(",") if name]
        for name in loaders:
            if name not in known:
                parser.error(f"unknown loader {name!r} (known: {', '.join(known)})")
        if main_loader not in loaders:
            loaders.insert(0, main_loader)
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}",
              "load_before": os.getloadavg(), "data": args.data, "workers": args.workers,
              "epochs": args.epochs, "rounds": args.rounds, "device": args.device}
    if args.clip:
        return clip_main(args, loaders, report)
    if sqlite:
        return sqlite_main(args, loaders, report)
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
        rounds = run_rounds(loaders, args.rounds, lambda name: run_one(name, args, beton),
                            "images_per_s", "images")
    report["load_after"] = os.getloadavg()
    summary = {}
    for name in loaders:
        rates = [x.get("images_per_s") for x in rounds[name]]
        entry = {"rounds": rounds[name]}
        good = [v for v in rates if v]
        if good:
            entry["images_per_s"] = statistics.median(good)
        ratios = paired_ratios(rounds["conveyor"], rounds[name], "images_per_s")
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
