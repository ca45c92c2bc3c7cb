"""A sample as named fields: images, captions, JSON, classes, multi-hot targets, stored arrays
and boxes, from WebDataset shards (``conveyor.tar_shards(..., fields=...)``) or a manifest
(``conveyor.Manifest``), decoded by the engine's C++ workers straight into the batch.

    shards = conveyor.tar_shards("clip-{000000..000099}.tar", fields={
        "image": conveyor.Image("jpg;png;webp", transform=conveyor.RandomResizedCrop(224)),
        "caption": conveyor.Text("txt"),
        "meta": conveyor.Json("json"),
        "label": conveyor.Int("cls"),
        "soft": conveyor.Array("npy", shape=(1000,), dtype=torch.float16),
        "boxes": conveyor.Array("boxes.npy", shape=(-1, 4), dtype=torch.float32)})
    for batch in conveyor.DataLoader(shards, batch_size=256, num_workers=8):
        batch["image"], batch["caption"], batch["boxes"]

Each field names where it comes from: a shard member's extension (what follows the first dot of
its file name, in lower case; several separated by ``;``, the first a sample has) or a manifest
column. A batch is a :class:`FieldBatch`, a dict keyed by field name:

- ``Image``: uint8 [B,3,S,S] (or [B,S,S,3]), on the loader's device; with ``mode="RGBA"`` or
  ``"L"``, 4 or 1 channels, and with ``dtype=torch.uint16``, 16-bit samples;
- ``Int`` / ``Float``: int64 / float32 [B];
- ``Array``: [B, *shape] of ``dtype``; with a first dimension of -1 (or no shape: any shape,
  flattened) a ``torch.nested`` tensor of ``layout=torch.jagged`` on the loader's device;
  ``multi_hot=True`` makes a list of class indices a multi-hot row of ``shape=(classes,)``;
- ``Mask``: a segmentation mask that follows an image field's crop, flip and size (nearest
  neighbour, palette indices kept as class ids): uint8 [B,S,S], or int16/int32 for 16-bit masks;
- ``Boxes`` / ``Points``: boxes [N, 4] / points [N, 2 or 3] that follow an image field's crop,
  scale and flip: jagged float32 [B, N_i, 4] / [B, N_i, 3]; a dropped box takes its labels' rows;
- ``Plan``: each sample's plan of an image field, int32 [B, V, 7] (x, y, w, h, flip, out_w, out_h);
- following an image with ``conveyor.Views``: ``follows`` names a group (``"global"``), and the
  field follows each of its V views: ``Mask`` [B,V,S,S], ``Plan`` [B,V,7], ``Boxes`` / ``Points``
  (and the boxes' paired labels) jagged with B*V rows, row ``b*V + v`` holding sample b's view v,
  plus ``batch[name + "_per_view"]``, int64 [B,V], each view's count of rows;
- ``Text``: a ``list[str]``; ``Bytes``: a ``list[bytes]``; ``Json``: a ``list`` of parsed values.

Ragged fields (text, bytes, JSON, arrays whose first dimension varies) hold at most ``max_bytes``
per sample (64 KiB by default): the engine sizes its batch slots from it once. A sample over it,
a sample without a field's member, an .npy of another dtype or shape (or of dtype object: a
pickle, never unpickled), text that is not UTF-8 or JSON that is malformed goes through the
loader's ``on_error``: a SampleError naming the sample (its shard and key, or its manifest line),
the field and the option, or under ``on_error="skip"`` a counted substitute.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _C, _options
from .transforms import Transform

__all__ = ["Field", "Image", "Mask", "Boxes", "Points", "Plan", "Int", "Float", "Array", "Bytes",
           "Text", "Json", "FieldBatch",
           "Manifest"]

# The dtypes an Array may have: torch's, by the name the engine reads.
_DTYPES = {torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
           torch.int32: "int32", torch.int64: "int64", torch.float16: "float16",
           torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}


class Field:
    """What one field of a sample is and where it comes from (see the module's text)."""

    kind: str = ""

    def __init__(self, keys: str) -> None:
        if not isinstance(keys, str) or not keys.strip(" ;"):
            raise ValueError(f"conveyor: {type(self).__name__} needs the member's extension or "
                             f"the manifest's column, as a non-empty str, not {keys!r}")
        self.keys = keys

    def _cpp(self) -> "_C.Field":
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"conveyor.{type(self).__name__}({self.keys!r})"


def _max_bytes(value: Optional[int]) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"conveyor: max_bytes must be a positive int, not {value!r}")
    return value


class Image(Field):
    """An image member (JPEG, PNG or WebP, each recognised by its content), decoded and transformed
    on the workers into rows of [C,S,S] (or [S,S,C] with the HWC layout). The default keys are
    ``"jpg;jpeg;png;webp"`` (as OpenCLIP reads shards): a sample's first member of those
    extensions.

    ``mode``, Pillow's names: ``"RGB"`` (the default, C = 3: alpha dropped, gray replicated, as
    ``convert("RGB")``); ``"RGBA"`` (C = 4: the file's alpha, a PNG's alpha channel or tRNS chunk
    or a WebP's alpha, 255 where the file has none, as ``convert("RGBA")``; R, G, B are the
    ``"RGB"`` rows exactly); ``"L"`` (C = 1: a gray file's own samples, a colour file converted as
    ``convert("L")``, ``(R*19595 + G*38470 + B*7471 + 32768) >> 16``, before the resize).

    ``dtype``: ``torch.uint8`` (the default) or ``torch.uint16``. In uint16 a 16-bit PNG's samples
    are kept as they are (resized in 16 bits), and an 8-bit file's sample v becomes ``v * 257``
    (255 -> 65535): the uint8 row times 257, exactly.

    The crop, resize, flip and EXIF orientation are the same whatever the mode and dtype, so a
    ``Mask``, ``Boxes`` or ``Plan`` that follows the image follows it alike. An image of another
    mode or dtype than RGB uint8 is decoded on the CPU (under ``gpu_decode`` too), and cannot have
    ``Views`` (refused when the source is made)."""

    kind = "image"

    def __init__(self, keys: str = _C.DEFAULT_IMAGE_KEYS, transform: Optional[Transform] = None,
                 mode: str = "RGB", dtype: torch.dtype = torch.uint8) -> None:
        super().__init__(keys)
        from .datasets import _transform
        self.transform = _transform(transform)
        self._mode = _options.choice(_C.ImageOutput.Mode, mode, "Image mode")
        self.mode = mode
        if dtype not in (torch.uint8, torch.uint16):
            raise ValueError(f"conveyor: Image dtype must be torch.uint8 or torch.uint16, "
                             f"not {dtype!r}")
        self.dtype = dtype

    def _cpp(self) -> "_C.Field":
        return _C.Field.image(self.keys, self.transform._cpp, self._mode,
                              "uint16" if self.dtype == torch.uint16 else "uint8")

    def __repr__(self) -> str:
        extra = "" if self.mode == "RGB" else f", mode={self.mode!r}"
        if self.dtype != torch.uint8:
            extra += f", dtype={self.dtype!r}"
        return f"conveyor.Image({self.keys!r}, transform={self.transform!r}{extra})"


class Mask(Field):
    """A segmentation mask that follows the image field ``follows``: a gray or palette PNG of 1,
    2, 4, 8 or 16 bits (interlaced or not) of the image's size, read as its samples (a palette
    PNG's indices are the class ids, never converted to colours), cut with the image's crop box,
    resized nearest-neighbour (by pixel centres) to the image's output size and flipped with it.
    uint8 [B,S,S] (``dtype=torch.uint8``, the default), int16 or int32 (``torch.int16`` /
    ``torch.int32``, which a 16-bit mask needs; an id over 32767 in an int16 mask is the
    sample's error, never wrapped). A mask of another size than its image's, or of colours
    (RGB), is the sample's error naming the field and both sizes. Samples with a mask are
    decoded on the CPU (under ``gpu_decode`` too), where the image's plan is handed to the
    mask. Of an image with ``conveyor.Views``, ``follows`` names a group: [B,V,S,S], each view's
    mask (the image's own name is refused, listing the groups)."""

    kind = "mask"

    def __init__(self, keys: str = "png", follows: str = "image",
                 dtype: torch.dtype = torch.uint8) -> None:
        super().__init__(keys)
        if not isinstance(follows, str) or not follows:
            raise ValueError(f"conveyor: Mask follows an image field, named by a non-empty str, "
                             f"not {follows!r}")
        if dtype not in (torch.uint8, torch.int16, torch.int32):
            raise ValueError(f"conveyor: Mask dtype must be torch.uint8, torch.int16 or "
                             f"torch.int32, not {dtype!r}")
        self.follows = follows
        self.dtype = dtype

    def _cpp(self) -> "_C.Field":
        return _C.Field.mask(self.keys, self.follows, _DTYPES[self.dtype])

    def __repr__(self) -> str:
        return f"conveyor.Mask({self.keys!r}, follows={self.follows!r}, dtype={self.dtype!r})"


def _follows(kind: str, follows: str) -> str:
    if not isinstance(follows, str) or not follows:
        raise ValueError(f"conveyor: {kind} follows an image field, named by a non-empty str, "
                         f"not {follows!r}")
    return follows


class Boxes(Field):
    """Boxes that follow the image field ``follows``: each sample's member is [N, 4] XYXY in the
    upright image's pixels (an .npy of any real or integer dtype, a JSON list of
    ``[x1, y1, x2, y2]`` lists, or a flat list of 4N numbers). Each box is mapped into the
    image's output pixels (the crop's corner, the resize's scale, the flip), clipped to them, and
    dropped when its clipped width or height is under ``min_size`` pixels (default 1, as
    torchvision v2's ``SanitizeBoundingBoxes``) or when the view keeps less than
    ``min_visibility`` of its area (default 0: no share required); the rows of the ``paired``
    fields (ragged ``Array`` fields of one row per box: class labels) are dropped with it. Out: a
    jagged float32 [B, N_i, 4] (``torch.nested``). A box outside its image, with x2 < x1 or
    y2 < y1, or not finite, is the sample's error naming the field and the box. ``paired=()``
    for boxes without labels; a paired field that a source lacks is refused.

    Of an image with ``conveyor.Views``, ``follows`` names a group of V views, and each view
    keeps its own boxes: a jagged float32 [B*V, N_bv, 4], row ``b*V + v`` being sample b's view v
    (sample major, view minor), its paired fields likewise, and ``batch[name + "_per_view"]``,
    int64 [B, V], the boxes each view kept. ``max_bytes`` bounds the member; a batch row holds
    V times as many."""

    kind = "boxes"

    def __init__(self, keys: str = "boxes.npy", follows: str = "image",
                 paired: Sequence[str] = ("labels",), *, min_size: float = 1.0,
                 min_visibility: float = 0.0, max_bytes: Optional[int] = None) -> None:
        super().__init__(keys)
        self.follows = _follows("Boxes", follows)
        if isinstance(paired, str):
            paired = (paired,)
        self.paired = tuple(paired)
        self.min_size = float(min_size)
        self.min_visibility = float(min_visibility)
        self.max_bytes = _max_bytes(max_bytes)

    def _cpp(self) -> "_C.Field":
        return _C.Field.boxes(self.keys, self.follows, list(self.paired), self.min_size,
                              self.min_visibility, self.max_bytes)

    def __repr__(self) -> str:
        return (f"conveyor.Boxes({self.keys!r}, follows={self.follows!r}, "
                f"paired={self.paired!r}, min_size={self.min_size}, "
                f"min_visibility={self.min_visibility})")


class Points(Field):
    """Points that follow the image field ``follows``: each sample's member is [N, 2] (x, y) or
    [N, 3] (x, y, visibility) in the upright image's pixels (an .npy, a JSON list of lists, or
    a flat JSON list of ``columns`` numbers per point: ``columns=3`` reads COCO's keypoints; a
    flat list without ``columns`` is refused). Mapped as boxes are, never clipped. Out: a jagged
    float32 [B, N_i, 3] whose third column is the member's visibility (1 for an [N, 2] member)
    for a point inside the image's output (0 <= x <= S, 0 <= y <= S) and 0 outside it. A flip
    mirrors x but does not swap left and right keypoints' identities (the ``Plan`` says which
    samples were flipped). Of an image with ``conveyor.Views``, ``follows`` names a group of V
    views: a jagged float32 [B*V, N_b, 3], row ``b*V + v`` being sample b's view v, and
    ``batch[name + "_per_view"]``, int64 [B, V]."""

    kind = "points"

    def __init__(self, keys: str = "points.npy", follows: str = "image", *,
                 columns: Optional[int] = None, max_bytes: Optional[int] = None) -> None:
        super().__init__(keys)
        self.follows = _follows("Points", follows)
        if columns not in (None, 2, 3):
            raise ValueError(f"conveyor: Points columns must be 2, 3 or None, not {columns!r}")
        self.columns = columns
        self.max_bytes = _max_bytes(max_bytes)

    def _cpp(self) -> "_C.Field":
        return _C.Field.points(self.keys, self.follows, self.columns or 0, self.max_bytes)

    def __repr__(self) -> str:
        return f"conveyor.Points({self.keys!r}, follows={self.follows!r}, columns={self.columns})"


class Plan(Field):
    """The plan of the image field ``follows`` for each sample (no member): int32 [B, V, 7], a
    row per view of (x, y, w, h, flip, out_w, out_h): the source box in the upright image's
    pixels, 1 when the view is mirrored, the output size. V is 1, or the count of the
    ``conveyor.Views`` group that ``follows`` names (each of its views, in order). For users who
    transform
    their own annotations: source x maps to ``(x - x0) * out_w / w`` (then ``out_w - that`` when
    flipped), y likewise."""

    kind = "plan"

    def __init__(self, follows: str = "image") -> None:
        self.keys = ""
        self.follows = _follows("Plan", follows)

    def _cpp(self) -> "_C.Field":
        return _C.Field.plan(self.follows)

    def __repr__(self) -> str:
        return f"conveyor.Plan(follows={self.follows!r})"


class Int(Field):
    """An integer: decimal text (WebDataset's cls, index, id) or a JSON integer; int64 [B]."""

    kind = "int"

    def __init__(self, keys: str = "cls") -> None:
        super().__init__(keys)

    def _cpp(self) -> "_C.Field":
        return _C.Field.integer(self.keys)


class Float(Field):
    """A number: decimal text or a JSON number; float32 [B]."""

    kind = "float"

    def _cpp(self) -> "_C.Field":
        return _C.Field.floating(self.keys)


class Array(Field):
    """An .npy member (its dtype and shape the declared ones) or a JSON list of numbers (a
    manifest cell). ``shape`` fixed, or with a first dimension of -1 that varies (boxes:
    ``shape=(-1, 4)``), or None (any shape, flattened: a jagged 1-d row per sample). With
    ``multi_hot=True``, ``shape=(classes,)`` and the member lists class indices."""

    kind = "array"

    def __init__(self, keys: str = "npy", shape: Optional[Sequence[int]] = None,
                 dtype: torch.dtype = torch.float32, *, multi_hot: bool = False,
                 max_bytes: Optional[int] = None) -> None:
        super().__init__(keys)
        if dtype not in _DTYPES:
            raise ValueError(f"conveyor: Array dtype must be one of "
                             f"{', '.join(str(d) for d in _DTYPES)}, not {dtype!r}")
        self.dtype = dtype
        self.shape = None if shape is None else tuple(int(d) for d in shape)
        self.multi_hot = bool(multi_hot)
        self.max_bytes = _max_bytes(max_bytes)
        if self.multi_hot and (self.shape is None or len(self.shape) != 1):
            raise ValueError("conveyor: Array(multi_hot=True) needs shape=(classes,)")

    @property
    def ragged(self) -> bool:
        return self.shape is None or (len(self.shape) > 0 and self.shape[0] == -1)

    def _cpp(self) -> "_C.Field":
        shape = [-1] if self.shape is None else list(self.shape)
        return _C.Field.array(self.keys, _DTYPES[self.dtype], shape, self.multi_hot,
                              self.max_bytes)

    def __repr__(self) -> str:
        return (f"conveyor.Array({self.keys!r}, shape={self.shape}, dtype={self.dtype}"
                + (", multi_hot=True" if self.multi_hot else "") + ")")


class Bytes(Field):
    """A member's bytes as they are: a ``list[bytes]``."""

    kind = "bytes"

    def __init__(self, keys: str, max_bytes: Optional[int] = None) -> None:
        super().__init__(keys)
        self.max_bytes = _max_bytes(max_bytes)

    def _cpp(self) -> "_C.Field":
        return _C.Field.bytes(self.keys, self.max_bytes)


class Text(Bytes):
    """UTF-8 text (checked): a ``list[str]``. A JSON Lines cell's string is unquoted."""

    kind = "text"

    def __init__(self, keys: str = "txt", max_bytes: Optional[int] = None) -> None:
        super().__init__(keys, max_bytes)

    def _cpp(self) -> "_C.Field":
        return _C.Field.text(self.keys, self.max_bytes)


class Json(Bytes):
    """A JSON value (checked: well formed, nested at most 64 deep): a ``list`` of parsed values."""

    kind = "json"

    def __init__(self, keys: str = "json", max_bytes: Optional[int] = None) -> None:
        super().__init__(keys, max_bytes)

    def _cpp(self) -> "_C.Field":
        return _C.Field.json(self.keys, self.max_bytes)


def _cpp_fields(fields: Mapping[str, Field]) -> List[Tuple[str, "_C.Field"]]:
    """The fields for the engine, in the dict's order; checks names and kinds."""
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError("conveyor: fields must be a non-empty dict of name -> conveyor field "
                         "(conveyor.Image, Mask, Boxes, Points, Plan, Text, Json, Int, Float, "
                         "Array, Bytes)")
    out = []
    for name, field in fields.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"conveyor: a field's name must be a non-empty str, not {name!r}")
        if not isinstance(field, Field):
            raise ValueError(f"conveyor: field {name!r} must be a conveyor field "
                             f"(conveyor.Image, Mask, Boxes, Points, Plan, Text, Json, Int, "
                             f"Float, Array, Bytes), "
                             f"not {type(field).__name__}")
        out.append((name, field._cpp()))
    return out


class FieldBatch(dict):
    """One batch of a dataset made with ``fields=``: a dict keyed by field name (see the
    module's text for each kind's type). Attributes: ``indices`` (the dataset index of each row,
    substitutes under on_error="skip" included), ``repeats`` (each row's repeat number under
    RASampler, else 0), ``augment_params`` (as ``Batch.augment_params``), ``epoch``,
    ``sequence``."""

    indices: List[int]
    repeats: List[int]
    augment_params: Optional[dict]
    epoch: int
    sequence: int
    _fence: Any = None
    _device_tensors: List[torch.Tensor]

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        """As :meth:`conveyor.Batch.record_stream`: ``stream`` waits for the batch's copy and the
        caching allocator keeps its device tensors until the work queued there is done."""
        if self._fence is not None:
            self._fence.use_on(stream, self._device_tensors)

    def __repr__(self) -> str:
        def describe(v):
            if isinstance(v, torch.Tensor):
                if v.is_nested:
                    return f"nested {v.dtype} {v.device}"
                return f"{tuple(v.shape)} {v.dtype} {v.device}"
            return f"list[{len(v)}]"
        inner = ", ".join(f"{k}={describe(v)}" for k, v in self.items())
        return f"conveyor.FieldBatch(epoch={self.epoch}, sequence={self.sequence}, {inner})"


def _rows(values: torch.Tensor, offsets: torch.Tensor) -> List[bytes]:
    data = values.cpu().numpy().tobytes()
    o = offsets.cpu().tolist()
    return [data[o[i]:o[i + 1]] for i in range(len(o) - 1)]


def make_field_batch(kinds: Mapping[str, Field], raw) -> FieldBatch:
    """A FieldBatch from the engine's (tensors, offsets, names, indices, epoch, sequence, fence,
    repeats, augment_params)."""
    tensors, offsets, names, indices, epoch, sequence, fence, repeats, augment_params = raw
    batch = FieldBatch()
    device_tensors = []
    # Boxes and points that follow a group of views: their rows (and their paired fields') split
    # by view, with the per-view counts the engine wrote beside them.
    per_view = {}
    for tensor, name in zip(tensors, names):
        field = kinds.get(name)
        if isinstance(field, (Boxes, Points)) and name + _C.PER_VIEW_SUFFIX in names:
            counts = tensors[names.index(name + _C.PER_VIEW_SUFFIX)]
            per_view[name] = counts
            for paired in (field.paired if isinstance(field, Boxes) else ()):
                per_view[paired] = counts
    for tensor, offset, name in zip(tensors, offsets, names):
        field = kinds.get(name)  # None for a view group's field: an image's (conveyor.Views)
        if isinstance(field, (Text, Json, Bytes)):
            rows = _rows(tensor, offset)
            if isinstance(field, Json):
                batch[name] = [json.loads(r) for r in rows]
            elif isinstance(field, Text):
                batch[name] = [r.decode("utf-8") for r in rows]
            else:
                batch[name] = rows
            continue
        device_tensors.append(tensor)
        if offset is not None:
            device_tensors.append(offset)
            if name in per_view:
                counts = per_view[name].flatten()
                offset = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
            batch[name] = torch.nested.nested_tensor_from_jagged(tensor, offset)
        else:
            batch[name] = tensor
    batch.indices = indices
    batch.repeats = repeats if repeats is not None else [0] * len(indices)
    batch.augment_params = augment_params
    batch.epoch = epoch
    batch.sequence = sequence
    batch._fence = fence
    batch._device_tensors = device_tensors
    return batch
