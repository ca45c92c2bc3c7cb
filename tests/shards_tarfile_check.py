#!/usr/bin/env python3
"""Checks shards written by conveyor-prepare --format wds with Python's tarfile (issue 13).

usage: shards_tarfile_check.py DST.index.json [EXPECTED_SAMPLES]

Reads every shard the index lists with the standard library's tarfile, not with Conveyor, and
checks WebDataset's naming rules: each member a regular file named KEY.EXT with no folder, KEY
without dots (webdataset splits a name at its first dot), each sample's members KEY.jpg then
KEY.cls, adjacent, keys in increasing order and unique across shards. Then that each .cls holds
the sample's label as decimal text, that the index lists the samples in the same order, with the
.jpg member's data offset and size (a ranged read of the raw file at that offset returns the
member's bytes, a JPEG), its "members" (version 2) the same two members with their data offsets and
sizes, and the shard's size and sample count. Exit 0 and a line 'ok: ...', or
exit 1 naming the shard and member.
"""
import json
import os
import re
import sys
import tarfile


def fail(message):
    print("shards_tarfile_check: " + message, file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) not in (2, 3):
        fail("usage: shards_tarfile_check.py DST.index.json [EXPECTED_SAMPLES]")
    index_path = sys.argv[1]
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    if index.get("format") != "conveyor-wds-index" or index.get("version") != 2:
        fail(f"{index_path}: not a conveyor-wds-index version 2")
    folder = os.path.dirname(index_path)
    samples = index["samples"]
    position = 0  # next entry of index["samples"]
    previous_key = None
    for shard in index["shards"]:
        path = os.path.join(folder, shard["file"])
        if os.path.getsize(path) != shard["bytes"]:
            fail(f"{path}: {os.path.getsize(path)} bytes, the index says {shard['bytes']}")
        with tarfile.open(path, mode="r:") as tar, open(path, "rb") as raw:
            members = tar.getmembers()
            if len(members) != 2 * shard["samples"]:
                fail(f"{path}: {len(members)} members for {shard['samples']} samples")
            for i in range(0, len(members), 2):
                jpg, cls = members[i], members[i + 1]
                for m in (jpg, cls):
                    if not m.isfile():
                        fail(f"{path}: {m.name} is not a regular file")
                    if not re.fullmatch(r"[^./]+\.[a-z0-9]+", m.name):
                        fail(f"{path}: {m.name} does not follow WebDataset's KEY.EXT naming")
                key, ext = jpg.name.split(".", 1)
                cls_key, cls_ext = cls.name.split(".", 1)
                if ext != "jpg" or cls_ext != "cls" or cls_key != key:
                    fail(f"{path}: members {jpg.name}, {cls.name} are not KEY.jpg, KEY.cls")
                if not key.isdigit():
                    fail(f"{path}: key {key} is not a sample number")
                if previous_key is not None and int(key) <= int(previous_key):
                    fail(f"{path}: key {key} after {previous_key}: not in increasing order")
                previous_key = key
                if position >= len(samples):
                    fail(f"{path}: {jpg.name} is not in the index")
                entry = samples[position]
                position += 1
                if entry["shard"] != shard["file"] or entry["key"] != key:
                    fail(f"{path}: {jpg.name}: the index has {entry['shard']}:{entry['key']} here")
                label_text = tar.extractfile(cls).read().decode("ascii")
                if label_text != str(int(label_text)) or int(label_text) != entry["label"]:
                    fail(f"{path}: {cls.name} holds '{label_text}', the index's label is "
                         f"{entry['label']}")
                data = tar.extractfile(jpg).read()
                if entry["offset"] != jpg.offset_data or entry["size"] != jpg.size:
                    fail(f"{path}: {jpg.name}: index offset/size {entry['offset']}/"
                         f"{entry['size']}, tarfile {jpg.offset_data}/{jpg.size}")
                listed = [["jpg", jpg.offset_data, jpg.size], ["cls", cls.offset_data, cls.size]]
                if entry["members"] != listed:
                    fail(f"{path}: {jpg.name}: index members {entry['members']}, tarfile {listed}")
                raw.seek(entry["offset"])
                if raw.read(entry["size"]) != data or data[:2] != b"\xff\xd8":
                    fail(f"{path}: {jpg.name}: the ranged read is not the member's JPEG bytes")
    if position != len(samples):
        fail(f"{index_path}: {len(samples) - position} samples in no shard")
    if len(sys.argv) == 3 and len(samples) != int(sys.argv[2]):
        fail(f"{index_path}: {len(samples)} samples, expected {sys.argv[2]}")
    print(f"ok: {len(samples)} samples in {len(index['shards'])} shards")


if __name__ == "__main__":
    main()
