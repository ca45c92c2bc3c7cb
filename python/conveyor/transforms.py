"""How each JPEG becomes a fixed-size uint8 RGB tensor row: decode, crop, resize, flip, layout.

These describe the engine's C++ transform (conveyor::ImageTransform); the work is done on the
loader's worker threads, decoding only the crop a sample needs at the smallest DCT scale that
covers its output. They are not callables on tensors: pass one to a dataset.
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

from . import _C, _options

__all__ = ["JpegEntropyIndex", "Transform", "RandomResizedCrop", "ResizeCenterCrop", "Resize", "Views",
           "train_transform", "eval_transform", "SIMD_DCT_SCALES", "FULL_DCT_SCALE",
           "ALL_DCT_SCALES"]

#: DCT scales a crop may be decoded at (bit M allows M/8): 1/8, 2/8, 4/8, 8/8 (the default).
SIMD_DCT_SCALES: int = _C.SIMD_DCT_SCALES
#: Full-scale decodes only; the resize does all the shrinking.
FULL_DCT_SCALE: int = _C.FULL_DCT_SCALE
#: Every scale 1/8 .. 8/8.
ALL_DCT_SCALES: int = _C.ALL_DCT_SCALES


class JpegEntropyIndex:
    """Where each JPEG's entropy-coded data starts, row by row, so that later epochs parse only
    the crop (conveyor::JpegEntropyIndex, issue 35). Conveyor decodes baseline JPEGs with its own
    entropy decoder; while it decodes a file it saves its state at the start of every MCU row and
    every 8 MCUs, and a later decode of the same bytes starts each of the crop's rows there
    instead of parsing the file from its start (1.9x the full-decode ceiling from epoch 2, against
    1.5x in epoch 1; BENCHMARKS.md). The pixels are the same with or without it.

    By default every dataset gives each image field one of 64 MiB, about 50,000 photos at about
    1.3 KB each; the least recently used files leave first. Give a transform your own to choose
    the budget (ImageNet's 1.28M photos need about 1.7 GB) or to share one between datasets, and
    ``JpegEntropyIndex(0)`` to turn it off::

        index = conveyor.JpegEntropyIndex(budget_mib=2048, file="/local/imagenet.cvyjidx")
        data = conveyor.ImageFolder(root, transform=conveyor.RandomResizedCrop(224, entropy_index=index))
        ...
        print(index.files, index.bytes)  # what it holds now

    With ``file``, the index starts with the file's entries when it exists (``loaded`` says what
    it found: entries loaded, refused, left over the budget, or the file refused whole, and why)
    and :meth:`save` writes every entry back atomically, so that the next run starts indexed
    (about 1.2 KB a photo on disk); it is also saved, best effort, when the last reference to it
    goes. A file of another format, or entries whose checksum fails, are ignored, and an entry is
    used only for the same bytes, so a changed image is decoded as if unindexed. The checksums
    catch corruption, not forgery: keep the file where only you write, as the images.
    """

    def __init__(self, budget_mib: int = 64, file: Optional[Union[str, "os.PathLike[str]"]] = None
                 ) -> None:
        if isinstance(budget_mib, bool) or not isinstance(budget_mib, int) or budget_mib < 0:
            raise ValueError(f"conveyor: JpegEntropyIndex budget_mib must be an int >= 0, "
                             f"not {budget_mib!r}")
        path = "" if file is None else os.fspath(file)
        if not isinstance(path, str) or (file is not None and not path):
            raise ValueError(f"conveyor: JpegEntropyIndex file must be a path, not {file!r}")
        self._cpp = _C.JpegEntropyIndex(budget_mib << 20, path)

    @property
    def file(self) -> Optional[str]:
        """The file it is kept in, or None."""
        return self._cpp.file or None

    @property
    def loaded(self) -> Dict[str, object]:
        """What the file held when it was made: file_found, file_refused, refusal (naming the
        path), entries_loaded, entries_refused, entries_over_budget, rest_dropped."""
        return self._cpp.loaded

    def save(self) -> None:
        """Writes every entry held to the file, atomically (a new file beside it, then a
        rename). Raises RuntimeError naming the path when it cannot write; does nothing without
        a file or with a budget of 0."""
        self._cpp.save()

    @property
    def budget_bytes(self) -> int:
        """The most bytes it holds (0: off)."""
        return self._cpp.budget_bytes

    @property
    def bytes(self) -> int:
        """The bytes it holds now."""
        return self._cpp.bytes

    @property
    def files(self) -> int:
        """The number of files it holds an entry for."""
        return self._cpp.files

    def __repr__(self) -> str:
        return (f"conveyor.JpegEntropyIndex(budget_mib={self.budget_bytes >> 20}) "
                f"# {self.files} files, {self.bytes} bytes")


def _pair(value, name: str) -> Tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"conveyor: {name} must be a pair (min, max), not {value!r}") from None
    if not low <= high:
        raise ValueError(f"conveyor: {name} must have min <= max, not {value!r}")
    return low, high


def _size(value, name: str = "size") -> int:
    if isinstance(value, (tuple, list)):
        if len(value) == 1 or (len(value) == 2 and value[0] == value[1]):
            value = value[0]
        else:
            raise ValueError(f"conveyor: {name} must be square (one int), not {value!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"conveyor: {name} must be a positive int, not {value!r}")
    return value


class Transform:
    """Base of the image transforms. ``layout`` is "CHW" (images [B,3,S,S], as torchvision)
    or "HWC" ([B,S,S,3]); ``exif_orientation`` makes the output show the upright image (off by
    default, as PIL's open and torchvision's decode_jpeg); ``max_pixels`` refuses larger images
    (decompression bombs) before decoding; ``dct_scales`` is the mask of DCT scales a crop may be
    decoded at (SIMD_DCT_SCALES by default); ``entropy_index`` is the JpegEntropyIndex its
    decodes use and extend (None, the default: the dataset makes one of 64 MiB for it)."""

    _mode = ""  # the engine's ImageTransform.Mode, by its text

    def __init__(self, size, *, resize: int = 256, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 flip: Union[bool, float] = False, layout: str = "CHW",
                 exif_orientation: bool = False, max_pixels: int = 100_000_000,
                 dct_scales: int = SIMD_DCT_SCALES,
                 entropy_index: Optional[JpegEntropyIndex] = None) -> None:
        self.size = _size(size)
        self.resize = _size(resize, "resize")
        self.scale = _pair(scale, "scale")
        self.ratio = _pair(ratio, "ratio")
        if isinstance(flip, bool):
            self.flip = 0.5 if flip else 0.0
        elif isinstance(flip, (int, float)) and 0.0 <= flip <= 1.0:
            self.flip = float(flip)
        else:
            raise ValueError(f"conveyor: flip must be a bool or a probability in [0, 1], "
                             f"not {flip!r}")
        cpp_layout = _options.choice(_C.ImageLayout, layout, "layout")
        self.layout = layout
        self.exif_orientation = bool(exif_orientation)
        self.max_pixels = int(max_pixels)
        self.dct_scales = int(dct_scales)
        if entropy_index is not None and not isinstance(entropy_index, JpegEntropyIndex):
            raise ValueError(f"conveyor: entropy_index must be a conveyor.JpegEntropyIndex or "
                             f"None, not {entropy_index!r}")
        self.entropy_index = entropy_index
        self._cpp = _options.make(
            _C.ImageTransform, mode=_options.choice(_C.ImageTransform.Mode, self._mode, "mode"),
            size=self.size, resize=self.resize, scale_min=self.scale[0], scale_max=self.scale[1],
            ratio_min=self.ratio[0], ratio_max=self.ratio[1], flip_probability=self.flip,
            layout=cpp_layout, limits=_options.make(_C.DecodeLimits, max_pixels=self.max_pixels),
            exif_orientation=self.exif_orientation, dct_scales=self.dct_scales,
            entropy_index=entropy_index._cpp if entropy_index is not None else None)

    @property
    def output_shape(self) -> Tuple[int, int, int]:
        """One image's shape: (3, size, size) for CHW, (size, size, 3) for HWC."""
        s = self.size
        return (3, s, s) if self.layout == "CHW" else (s, s, 3)

    def __repr__(self) -> str:
        return (f"conveyor.{type(self).__name__}(size={self.size}, flip={self.flip}, "
                f"layout={self.layout!r})")


class RandomResizedCrop(Transform):
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` (bilinear), with an optional
    horizontal flip (``flip=True`` flips half the images, as ``RandomHorizontalFlip()``; a float
    is the probability). The crop of sample i in epoch e is a pure function of (loader seed, e,
    i): the same for any number of workers, and again after a resume.

        conveyor.RandomResizedCrop(224, flip=True)             # the usual training transform
        conveyor.RandomResizedCrop(224, scale=(0.35, 1), flip=True, layout="HWC")
    """

    _mode = "random_resized_crop"

    def __init__(self, size, scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), *, flip: Union[bool, float] = False,
                 layout: str = "CHW", exif_orientation: bool = False,
                 max_pixels: int = 100_000_000, dct_scales: int = SIMD_DCT_SCALES,
                 entropy_index: Optional[JpegEntropyIndex] = None) -> None:
        super().__init__(size, scale=scale, ratio=ratio, flip=flip, layout=layout,
                         exif_orientation=exif_orientation, max_pixels=max_pixels,
                         dct_scales=dct_scales, entropy_index=entropy_index)

    def __repr__(self) -> str:
        return (f"conveyor.RandomResizedCrop({self.size}, scale={self.scale}, "
                f"ratio={tuple(round(r, 4) for r in self.ratio)}, flip={self.flip}, "
                f"layout={self.layout!r})")


class ResizeCenterCrop(Transform):
    """The evaluation transform: torchvision's ``Resize(resize)`` (the shorter side) then
    ``CenterCrop(size)``.

        conveyor.ResizeCenterCrop(224, resize=256)
    """

    _mode = "resize_center_crop"

    def __init__(self, size=224, resize: int = 256, *, layout: str = "CHW",
                 exif_orientation: bool = False, max_pixels: int = 100_000_000,
                 dct_scales: int = SIMD_DCT_SCALES,
                 entropy_index: Optional[JpegEntropyIndex] = None) -> None:
        super().__init__(size, resize=resize, layout=layout, exif_orientation=exif_orientation,
                         max_pixels=max_pixels, dct_scales=dct_scales,
                         entropy_index=entropy_index)

    def __repr__(self) -> str:
        return f"conveyor.ResizeCenterCrop({self.size}, resize={self.resize}, layout={self.layout!r})"


class Resize(Transform):
    """The whole image resized to size x size, aspect not kept: torchvision's
    ``Resize((size, size))``."""

    _mode = "resize"

    def __init__(self, size, *, layout: str = "CHW", exif_orientation: bool = False,
                 max_pixels: int = 100_000_000, dct_scales: int = SIMD_DCT_SCALES,
                 entropy_index: Optional[JpegEntropyIndex] = None) -> None:
        super().__init__(size, layout=layout, exif_orientation=exif_orientation,
                         max_pixels=max_pixels, dct_scales=dct_scales,
                         entropy_index=entropy_index)


class Views(Transform):
    """Several views of each image, in named groups: each group is ``(count, transform)``, and
    becomes a batch field named after it, uint8 [B, count, 3, S, S] (or [B, count, S, S, 3] for
    ``layout="HWC"``), S being its transform's size. DINOv2's multi-crop:

        dino = conveyor.Views({
            "global": (2, conveyor.RandomResizedCrop(224, scale=(0.32, 1.0), flip=True)),
            "local":  (8, conveyor.RandomResizedCrop(96, scale=(0.05, 0.32), flip=True))})
        data = conveyor.ImageFolder(root, transform=dino)  # batch["global"], ["local"], ["label"]

    The views are numbered 0..N-1 in group order, each drawn from its own stream
    (seed, epoch, index, view): the same for any number of workers and after a resume, and one
    group of one view is that group's transform, bit for bit. Each image is decoded once for all
    its views (the bounding box of their boxes, at the finest DCT scale any of them needs), and
    every view is resized from that decode; ``decode_once=False`` decodes each view on its own
    instead (slower; each view is then exactly the bytes it has alone). Only the groups'
    geometry (mode, size, scale, ratio, resize, flip) is theirs: ``layout``,
    ``exif_orientation``, ``max_pixels``, ``dct_scales`` and ``entropy_index`` are the Views' own,
    for every view.
    GPU decode leaves such images to the CPU workers, and its status says so.
    """

    _mode = "random_resized_crop"

    def __init__(self, groups: Mapping[str, Tuple[int, Transform]], *, layout: str = "CHW",
                 exif_orientation: bool = False, max_pixels: int = 100_000_000,
                 dct_scales: int = SIMD_DCT_SCALES, decode_once: bool = True,
                 entropy_index: Optional[JpegEntropyIndex] = None) -> None:
        if not isinstance(groups, Mapping) or not groups:
            raise ValueError("conveyor: Views takes a dict of groups, "
                             "{name: (count, transform)}, not " + repr(groups))
        parsed: Dict[str, Tuple[int, Transform]] = {}
        for name, group in groups.items():
            try:
                count, transform = group
            except (TypeError, ValueError):
                raise ValueError(f"conveyor: view group {name!r} must be (count, transform), "
                                 f"not {group!r}") from None
            if not isinstance(name, str) or not name:
                raise ValueError(f"conveyor: a view group's name is a non-empty str, not {name!r}")
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 256:
                raise ValueError(f"conveyor: view group {name!r}: count must be an int in "
                                 f"1..256, not {count!r}")
            if not isinstance(transform, Transform) or isinstance(transform, Views):
                raise ValueError(f"conveyor: view group {name!r}: the transform must be a "
                                 f"conveyor transform (RandomResizedCrop, ...), not {transform!r}")
            parsed[name] = (count, transform)
        self.groups = parsed
        first = next(iter(parsed.values()))[1]
        super().__init__(first.size, layout=layout, exif_orientation=exif_orientation,
                         max_pixels=max_pixels, dct_scales=dct_scales,
                         entropy_index=entropy_index)
        self.decode_once = bool(decode_once)
        views = []
        for name, (count, transform) in parsed.items():
            views.append(_options.make(_C.ViewGroup, name=name, count=count,
                                       transform=transform._cpp))
        self._cpp.views = views
        self._cpp.decode_views_once = self.decode_once

    @property
    def output_shape(self):
        """Each group's shape for one image: {name: (count, 3, S, S)} (or (count, S, S, 3))."""
        return {name: (count, 3, t.size, t.size) if self.layout == "CHW"
                else (count, t.size, t.size, 3) for name, (count, t) in self.groups.items()}

    def __repr__(self) -> str:
        inner = ", ".join(f"{name!r}: ({count}, {t!r})" for name, (count, t) in self.groups.items())
        return f"conveyor.Views({{{inner}}}, layout={self.layout!r})"


def train_transform(size: int = 224, **kwargs) -> RandomResizedCrop:
    """``RandomResizedCrop(size, flip=True)``: the ImageNet training transform."""
    kwargs.setdefault("flip", True)
    return RandomResizedCrop(size, **kwargs)


def eval_transform(size: int = 224, resize: int = 256, **kwargs) -> ResizeCenterCrop:
    """``ResizeCenterCrop(size, resize)``: the ImageNet evaluation transform."""
    return ResizeCenterCrop(size, resize, **kwargs)
