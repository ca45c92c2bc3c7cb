#!/usr/bin/env python3
"""Writes WebDataset shards with many kinds of member, for shard_members_test (issue 31).

usage: webdataset_members_write.py OUT_DIR

Writes, with WebDataset's own writers (PyPI webdataset, the project's venv):
  OUT_DIR/clip-000000.tar, clip-000001.tar: webdataset.ShardWriter, 4 samples a shard, 7 samples:
    a JPEG (.jpg; Pillow), a caption (.txt), a JSON value (.json), a label (.cls), logits (.npy),
    boxes of a varying count (.boxes.npy). Sample 3 has no .cls and sample 5 no .npy; sample 6's
    key is 120 characters long (a pax header, so its members' data do not follow a single 512-byte
    header); sample 2's caption is empty.
  OUT_DIR/i2d-000000.tar: as img2dataset writes (webdataset.TarWriter), keys "%09d", members
    .jpg, .txt, .json, 5 samples.
and OUT_DIR/expected.tsv: one line per member, "SHARD<TAB>KEY<TAB>EXTENSION<TAB>HEX", the bytes
given to the writer (every value is given as bytes, so that they are what the shard holds), in
the order given (ShardWriter writes a sample's members sorted by extension).
"""
import io
import json
import os
import sys

import numpy as np
import webdataset
from PIL import Image


def jpeg(i):
    image = Image.new("RGB", (16 + 8 * i, 24), (40 * i % 256, 90, 200 - 20 * i))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def npy(array):
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def main():
    folder = sys.argv[1]
    lines = []

    def record(shard, sample):
        key = sample["__key__"]
        for ext, value in sample.items():
            if ext != "__key__":
                lines.append(f"{shard}\t{key}\t{ext}\t{value.hex()}")

    samples = []
    for i in range(7):
        key = f"sample{i:03d}" if i != 6 else "k" * 120
        sample = {
            "__key__": key,
            "jpg": jpeg(i),
            "txt": ("" if i == 2 else f"a caption for sample {i}, ünïcode").encode("utf-8"),
            "json": json.dumps({"i": i, "tags": ["a", "b"][: i % 3]}).encode("utf-8"),
            "cls": str(i % 3).encode("ascii"),
            "npy": npy(np.arange(10, dtype=np.float16) * i),
            "boxes.npy": npy(np.full((i % 4, 4), i, dtype=np.float32)),
        }
        if i == 3:
            del sample["cls"]
        if i == 5:
            del sample["npy"]
        samples.append(sample)
    with webdataset.ShardWriter(os.path.join(folder, "clip-%06d.tar"), maxcount=4,
                                verbose=0) as sink:
        for i, sample in enumerate(samples):
            sink.write(sample)
            record(f"clip-{i // 4:06d}.tar", sample)

    with webdataset.TarWriter(os.path.join(folder, "i2d-000000.tar")) as sink:
        for i in range(5):
            sample = {
                "__key__": f"{0:05d}{i:04d}",
                "jpg": jpeg(i + 1),
                "txt": f"img2dataset caption {i}".encode("utf-8"),
                "json": json.dumps({"url": f"http://example.com/{i}.jpg", "width": 16}).encode(),
            }
            sink.write(sample)
            record("i2d-000000.tar", sample)

    with open(os.path.join(folder, "expected.tsv"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
