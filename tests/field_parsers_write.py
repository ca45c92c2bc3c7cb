"""Fixtures for tests/field_parsers_test.cpp, written by numpy and by Python's csv and json
modules, so that the C++ parsers are checked against the writers users have.

Usage: field_parsers_write.py DIR SEED
Writes into DIR:
  npy/NAME.npy and npy/NAME.bin (the array's bytes, C order, little-endian), listed in
  npy.json as {"name", "dtype" (numpy's name), "shape"}: every dtype that parse_npy reads, in
  shapes 0-d, empty and n-d, in format versions 1.0, 2.0 and 3.0, and random arrays;
  refused/NAME.npy: what parse_npy must refuse (dtype object, structured, big-endian,
  fortran_order, strings, datetimes), listed in refused.json as {"name", "says"} (a part of
  the message);
  table-K.csv / .tsv / .jsonl: random tables (CSV through csv.writer, with commas, quotes,
  CR, LF and non-ASCII in cells, both line terminators; TSV joined by tabs; JSON Lines through
  json.dumps, each row with a random subset of the keys), listed in tables.json as {"name",
  "format", "columns", "rows": [[cell or null, ...]]} (JSON Lines: each cell is the value's
  json.dumps text, null where the row lacks the key).
"""
import csv
import io
import json
import os
import random
import sys

import numpy as np

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
SHAPES = [(), (0,), (3,), (2, 3), (2, 0, 4), (1, 1, 1, 1), (5, 1, 2)]


def random_array(rng, dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        values = rng.integers(0, 2, n).astype(bool)
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    elif dtype.startswith("complex"):
        values = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    else:
        values = (rng.standard_normal(n) * 1000).astype(dtype)
    return values.reshape(shape)


def write_npy(folder, listing, name, array, version=None):
    with open(os.path.join(folder, name + ".npy"), "wb") as f:
        if version is None:
            np.save(f, array)
        else:
            np.lib.format.write_array(f, array, version=version)
    with open(os.path.join(folder, name + ".bin"), "wb") as f:
        f.write(np.ascontiguousarray(array).tobytes())
    listing.append({"name": name, "dtype": str(array.dtype), "shape": list(array.shape)})


def random_cell(rng):
    alphabet = ["a", "b", "z", "0", "7", " ", ",", "\"", "\n", "\r\n", "\t", "é", "猫", "'", ";"]
    if rng.random() < 0.15:
        return ""
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))


def random_json_value(rng, depth=0):
    kind = rng.randint(0, 6 if depth < 3 else 3)
    if kind == 0:
        return rng.randint(-10**12, 10**12)
    if kind == 1:
        return rng.uniform(-1e6, 1e6)
    if kind == 2:
        return random_cell(rng)
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return [random_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_cell(rng): random_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def write_tables(folder, seed):
    rng = random.Random(seed)
    tables = []
    for k in range(12):
        columns = ["c%d_%s" % (i, random_cell(rng).replace("\n", "").replace("\r", ""))
                   for i in range(rng.randint(1, 6))]
        rows = [[random_cell(rng) for _ in columns] for _ in range(rng.randint(0, 30))]
        kind = k % 3
        if kind == 0:
            name = "table-%d.csv" % k
            terminator = "\r\n" if k % 2 == 0 else "\n"
            with open(os.path.join(folder, name), "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f, lineterminator=terminator)
                writer.writerow(columns)
                writer.writerows(rows)
            tables.append({"name": name, "format": "csv", "columns": columns, "rows": rows})
        elif kind == 1:
            name = "table-%d.tsv" % k
            clean = lambda s: s.replace("\t", "").replace("\r", "").replace("\n", "")
            columns = [clean(c) for c in columns]
            rows = [[clean(c) for c in row] for row in rows]
            # A TSV row of one empty cell is an empty line (skipped): give it text.
            rows = [row if "".join(row) else ["x"] + row[1:] for row in rows]
            with open(os.path.join(folder, name), "w", newline="", encoding="utf-8") as f:
                for row in [columns] + rows:
                    f.write("\t".join(row) + ("\r\n" if k % 2 else "\n"))
            tables.append({"name": name, "format": "tsv", "columns": columns, "rows": rows})
        else:
            name = "table-%d.jsonl" % k
            keys = list(dict.fromkeys(columns + ["é\"k", "\\u"]))
            lines, objects = [], []
            for _ in range(rng.randint(0, 30)):
                chosen = [key for key in keys if rng.random() < 0.7]
                rng.shuffle(chosen)
                obj = {key: random_json_value(rng) for key in chosen}
                objects.append(obj)
                lines.append(json.dumps(obj, ensure_ascii=rng.random() < 0.5))
                if rng.random() < 0.2:
                    lines.append("  " if rng.random() < 0.5 else "")
            order = []
            for obj in objects:
                for key in obj:
                    if key not in order:
                        order.append(key)
            expected = []
            for obj, line in zip(objects, [l for l in lines if l.strip()]):
                ascii_line = line.isascii()
                expected.append([json.dumps(obj[key], ensure_ascii=ascii_line) if key in obj
                                 else None for key in order])
            with open(os.path.join(folder, name), "w", newline="", encoding="utf-8") as f:
                f.write("\n".join(lines) + ("\n" if rng.random() < 0.5 else ""))
            tables.append({"name": name, "format": "jsonl", "columns": order, "rows": expected})
    with open(os.path.join(folder, "tables.json"), "w") as f:
        json.dump(tables, f)


def main():
    folder, seed = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(seed)
    npy = os.path.join(folder, "npy")
    os.makedirs(npy, exist_ok=True)
    listing = []
    for dtype in DTYPES:
        for i, shape in enumerate(SHAPES):
            write_npy(npy, listing, "%s-%d" % (dtype, i), random_array(rng, dtype, shape))
    for version in [(1, 0), (2, 0), (3, 0)]:
        array = random_array(rng, "float32", (4, 5))
        write_npy(npy, listing, "version-%d" % version[0], array, version)
    for i in range(40):
        dtype = DTYPES[rng.integers(len(DTYPES))]
        shape = tuple(int(d) for d in rng.integers(0, 6, rng.integers(0, 5)))
        write_npy(npy, listing, "random-%d" % i, random_array(rng, dtype, shape))
    with open(os.path.join(folder, "npy.json"), "w") as f:
        json.dump(listing, f)

    refused = os.path.join(folder, "refused")
    os.makedirs(refused, exist_ok=True)
    cases = [
        ("object", np.array([1, "a", None], dtype=object), "pickle"),
        ("structured", np.zeros(3, dtype=[("x", "<f4"), ("y", "<i4")]), "structured"),
        ("big-endian", np.arange(6, dtype=">f4"), "big-endian"),
        ("fortran", np.asfortranarray(np.arange(6, dtype="<i4").reshape(2, 3)), "fortran_order"),
        ("unicode", np.array(["ab", "c"]), "no torch dtype"),
        ("bytes", np.array([b"ab", b"c"]), "no torch dtype"),
        ("datetime", np.array(["2020-01-01"], dtype="datetime64[D]"), "no torch dtype"),
    ]
    listing = []
    for name, array, says in cases:
        with open(os.path.join(refused, name + ".npy"), "wb") as f:
            np.save(f, array, allow_pickle=True)
        listing.append({"name": name, "says": says})
    with open(os.path.join(folder, "refused.json"), "w") as f:
        json.dump(listing, f)

    write_tables(folder, seed)


if __name__ == "__main__":
    main()
