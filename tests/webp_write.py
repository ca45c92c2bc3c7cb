#!/usr/bin/env python3
"""Writes WebP files with Pillow (the project's venv, Pillow 13, libwebp inside it) for webp_test.

usage: webp_write.py DIR

DIR/kinds/NAME.webp: every kind Pillow writes: lossy (quality 80) and lossless, RGB and RGBA
(alpha varying across the image), at odd sizes from 1x1. NAME is KIND-WxH.
DIR/folder/CLASS/imgN.{png,webp}: an ImageFolder of photo-like PNGs and lossy WebPs (two classes,
five images each, alternating), for the shards that webdataset_write.py writes from it.
Prints the number of files written under kinds/.
"""
import os
import random
import sys

from PIL import Image


def photo(width, height, mode, seed):
    """A smooth gradient with noise and a few edges, as a photo has; alpha varies too."""
    rng = random.Random(seed)
    fx, fy = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0)
    pixels = []
    for y in range(height):
        for x in range(width):
            base = [int(255 * ((x * fx + y * fy + 40 * c) % max(width + height, 1)) /
                        max(width + height, 1)) for c in range(3)]
            if (x // 7 + y // 5) % 3 == 0:
                base = [255 - v for v in base]
            noisy = [min(255, max(0, v + rng.randint(-12, 12))) for v in base]
            if mode == "RGBA":
                noisy.append((x * 37 + y * 11) % 256)
            pixels.append(tuple(noisy))
    image = Image.new(mode, (width, height))
    image.putdata(pixels)
    return image


def main():
    out = sys.argv[1]
    kinds = os.path.join(out, "kinds")
    os.makedirs(kinds, exist_ok=True)
    sizes = [(1, 1), (2, 3), (5, 1), (17, 13), (33, 31), (64, 41), (101, 67)]
    written = 0
    seed = 1
    for mode in ("RGB", "RGBA"):
        for lossless in (False, True):
            for width, height in sizes:
                kind = ("lossless" if lossless else "lossy") + "_" + mode.lower()
                path = os.path.join(kinds, f"{kind}-{width}x{height}.webp")
                photo(width, height, mode, seed).save(path, "WEBP", lossless=lossless,
                                                      quality=80, method=4)
                seed += 1
                written += 1
    for c, name in enumerate(("ant", "bee")):
        folder = os.path.join(out, "folder", name)
        os.makedirs(folder, exist_ok=True)
        for i in range(5):
            image = photo(48 + 3 * i, 36 + c, "RGB", 100 + 10 * c + i)
            if i % 2 == 0:
                image.save(os.path.join(folder, f"img{i}.png"), "PNG")
            else:
                image.save(os.path.join(folder, f"img{i}.webp"), "WEBP", quality=85)
    print(written)


if __name__ == "__main__":
    main()
