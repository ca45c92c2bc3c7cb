#!/usr/bin/env python3
"""Writes an ImageFolder as WebDataset shards with WebDataset's own ShardWriter (PyPI webdataset,
installed in the project's venv by scripts/setup), for webdataset_shards_test.

usage: webdataset_write.py FOLDER OUT_PREFIX SAMPLES_PER_SHARD

The classes are FOLDER's sorted subfolders, labelled 0..K-1, the images in each sorted by name.
Sample i is keyed "CLASS/imgN" (a key with a folder, as WebDataset keeps paths), with its image
bytes as .png or .webp when they are a PNG or a WebP (by their first bytes), else (JPEG) as .jpg
for even i and .jpeg for odd i, its label as .cls, and a .json member that Conveyor
does not read. Writes OUT_PREFIX-000000.tar, OUT_PREFIX-000001.tar, ... and prints the number of
shards.
"""
import os
import sys

import webdataset


def main():
    folder, prefix, per_shard = sys.argv[1], sys.argv[2], int(sys.argv[3])
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    samples = []
    for label, name in enumerate(classes):
        for image in sorted(os.listdir(os.path.join(folder, name))):
            samples.append((name, image, label))
    with webdataset.ShardWriter(prefix + "-%06d.tar", maxcount=per_shard, verbose=0) as sink:
        for i, (name, image, label) in enumerate(samples):
            with open(os.path.join(folder, name, image), "rb") as f:
                data = f.read()
            stem = os.path.splitext(image)[0]
            if data.startswith(b"\x89PNG"):
                member = "png"
            elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
                member = "webp"
            else:
                member = "jpg" if i % 2 == 0 else "jpeg"
            sink.write({
                "__key__": name + "/" + stem,
                member: data,
                "cls": label,
                "json": {"class": name, "file": image},
            })
        shards = sink.shard
    print(shards)


if __name__ == "__main__":
    main()
