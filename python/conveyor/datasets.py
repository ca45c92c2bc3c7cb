"""Where samples come from: image folders, file lists, JPEG bytes in memory, and WebDataset tar
shards (local, ``file://`` or ``http(s)://``), all decoded by the engine's C++ workers.

A dataset is a description plus the engine's source. It is not indexed from Python (no
``__getitem__``): a ``conveyor.DataLoader`` reads it. Each loader gets a source of its own: a
dataset already serving a live loader is opened again for the next one.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _C, _options
from .fields import Field, _cpp_fields
from .transforms import Transform, train_transform

__all__ = ["Dataset", "ImageFolder", "FileList", "JpegBytes", "TarShards", "tar_shards", "Manifest",
           "UserDataset", "from_dataset", "PatternDataset", "expand_shard_braces"]

PathLike = Union[str, "os.PathLike[str]"]


def _transform(transform: Optional[Transform]) -> Transform:
    if transform is None:
        return train_transform(224)
    if not isinstance(transform, Transform):
        raise ValueError(
            "conveyor: transform must be a conveyor transform (conveyor.RandomResizedCrop, "
            "ResizeCenterCrop, Resize), not "
            f"{type(transform).__module__}.{type(transform).__qualname__}; the engine decodes and "
            "transforms on its C++ workers, so torchvision transforms do not apply (normalize "
            "on the device after loading: conveyor.normalize)")
    return transform


class Dataset:
    """Base of Conveyor's datasets. ``len(ds)`` is its number of samples; ``ds.describe(i)``
    names sample i (its file)."""

    def __init__(self, make: Callable[[], "_C.Source"], transform: Optional[Transform]) -> None:
        self._make = make
        self.transform = transform
        self._source = make()  # opened now, so that a bad path fails here

    def _reader(self, source: "_C.Source") -> Optional["_C.DatasetReader"]:
        """The Python dataset reader behind ``source`` (UserDataset's), or None."""
        return None

    def _claim(self) -> "_C.Source":
        """The engine source for a new loader: this one, or a fresh one if a live loader holds it."""
        if self._source.in_use:
            return self._make()
        return self._source

    def __len__(self) -> int:
        return len(self._source)

    def describe(self, index: int) -> str:
        """The file (or shard member) of sample ``index``."""
        return self._source.describe(index)

    def __repr__(self) -> str:
        return f"conveyor.{type(self).__name__}({len(self)} samples, transform={self.transform!r})"


class _ImageDataset(Dataset):
    @property
    def classes(self) -> List[str]:
        """Class names, index = label (ImageFolder: the sorted sub-folder names)."""
        return list(self._source.classes)

    @property
    def class_to_idx(self) -> dict:
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def samples(self) -> List[Tuple[str, int]]:
        """(path, label) of every sample, in dataset order (as torchvision's ImageFolder)."""
        return list(self._source.items)

    @property
    def targets(self) -> List[int]:
        return [label for _, label in self._source.items]


class ImageFolder(_ImageDataset):
    """``root/<class>/<image>``, as torchvision's ImageFolder: classes are the sorted sub-folder
    names, labelled 0..K-1, images sorted by name within a class. It lists the extensions
    torchvision's ImageFolder lists (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case) and
    decodes each file by its content (JPEG and PNG today; the others raise naming their format).

        train = conveyor.ImageFolder("/data/imagenet/train",
                                     transform=conveyor.RandomResizedCrop(224, flip=True))
    """

    def __init__(self, root: PathLike, transform: Optional[Transform] = None) -> None:
        self.root = os.fspath(root)
        t = _transform(transform)
        options = _C.FolderOptions()
        super().__init__(lambda: _C.image_folder(self.root, t._cpp, options), t)


class FileList(_ImageDataset):
    """JPEG files with labels: ``items`` is a list of ``(path, label)`` pairs, or the path of a
    text file of ``path<TAB>label`` lines (relative paths are relative to that file's folder).

        ds = conveyor.FileList([("/data/a.jpg", 0), ("/data/b.jpg", 3)],
                               transform=conveyor.ResizeCenterCrop(224))
    """

    def __init__(self, items: Union[PathLike, Iterable[Tuple[PathLike, int]]],
                 transform: Optional[Transform] = None) -> None:
        t = _transform(transform)
        options = _C.FolderOptions()
        if isinstance(items, (str, os.PathLike)):
            self.list_path = os.fspath(items)
            super().__init__(lambda: _C.file_list(self.list_path, t._cpp, options), t)
            return
        pairs = []
        for n, entry in enumerate(items):
            try:
                path, label = entry
            except (TypeError, ValueError):
                raise ValueError(f"conveyor: FileList item {n} must be (path, label), "
                                 f"not {entry!r}") from None
            path = os.path.abspath(os.fspath(path))
            if "\t" in path or "\n" in path:
                raise ValueError(f"conveyor: FileList item {n}: a path with a tab or newline "
                                 f"({path!r}) cannot be listed")
            if isinstance(label, bool) or not isinstance(label, int):
                raise ValueError(f"conveyor: FileList item {n}: the label must be an int, "
                                 f"not {label!r}")
            pairs.append((path, label))
        if not pairs:
            raise ValueError("conveyor: FileList got no items")
        self.list_path = None

        def make() -> "_C.Source":
            # The engine reads lists from a file; it is read whole when the source is made.
            with tempfile.NamedTemporaryFile("w", suffix=".tsv", encoding="utf-8") as f:
                f.writelines(f"{p}\t{label}\n" for p, label in pairs)
                f.flush()
                return _C.file_list(f.name, t._cpp, options)

        super().__init__(make, t)


class JpegBytes(_ImageDataset):
    """Encoded JPEG images held in memory (``bytes`` each) with their labels."""

    def __init__(self, jpegs: Sequence[bytes], labels: Sequence[int],
                 transform: Optional[Transform] = None) -> None:
        t = _transform(transform)
        jpegs = [bytes(j) for j in jpegs]
        labels = [int(label) for label in labels]
        if len(jpegs) != len(labels):
            raise ValueError(f"conveyor: JpegBytes got {len(jpegs)} images but "
                             f"{len(labels)} labels")
        super().__init__(lambda: _C.in_memory(jpegs, labels, t._cpp), t)


def _dist_rank_world() -> Optional[Tuple[int, int]]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


class TarShards(_ImageDataset):
    """WebDataset tar shards (``KEY.jpg`` + ``KEY.cls``; what ``conveyor-prepare --format wds``
    writes). See :func:`tar_shards`."""

    def __init__(self, shards: Union[str, Sequence[str]], transform: Optional[Transform] = None,
                 *, streaming: bool = False, index: Optional[str] = None,
                 shuffle_buffer: int = 1000, rank: Optional[int] = None,
                 world_size: Optional[int] = None, epoch_samples: int = 0, retries: int = 4,
                 backoff: Tuple[float, float] = (0.1, 2.0), request_timeout: float = 30.0,
                 connect_timeout: float = 5.0, requests_in_flight: int = 4,
                 min_bytes_per_second: int = 65536,
                 fields: Optional[Mapping[str, "Field"]] = None) -> None:
        if fields is not None and transform is not None:
            raise ValueError("conveyor: tar_shards: with fields=, each conveyor.Image field "
                             "carries its own transform; do not give transform= too")
        t = _transform(transform) if fields is None else None
        #: The fields of each sample (a dict), or None: batches are then (images, labels).
        self.fields = dict(fields) if fields is not None else None
        cpp_fields = _cpp_fields(self.fields) if fields is not None else None
        # A str is the user's pattern; a path object or a list holds names taken literally.
        if isinstance(shards, bytes):
            raise TypeError("conveyor: tar_shards: shards must be a str (a pattern) or a list "
                            "of paths or URLs, not bytes")
        if isinstance(shards, str):
            self.literal = False
            self.shards = [shards]
        else:
            self.literal = True
            names = [shards] if isinstance(shards, os.PathLike) else list(shards)
            self.shards = []
            for name in names:
                if not isinstance(name, (str, os.PathLike)):
                    raise TypeError(f"conveyor: tar_shards: a list element must be a path or URL "
                                    f"(str or os.PathLike), not {type(name).__name__}")
                self.shards.append(os.fspath(name))
        if not self.shards:
            raise ValueError("conveyor: tar_shards got no shards")
        if (rank is None) != (world_size is None):
            raise ValueError("conveyor: tar_shards: give both rank and world_size, or neither")
        if rank is None:
            rank, world_size = (_dist_rank_world() or (0, 1)) if streaming else (0, 1)
        if not 0 <= rank < world_size:
            raise ValueError(f"conveyor: tar_shards: rank {rank} is outside world_size "
                             f"{world_size}")
        self.streaming = bool(streaming)
        self.rank, self.world_size = rank, world_size
        for name, value in (("request_timeout", request_timeout),
                            ("connect_timeout", connect_timeout)):
            if not value > 0:
                raise ValueError(f"conveyor: tar_shards: {name} must be > 0 seconds, "
                                 f"not {value!r}")
        if not min_bytes_per_second >= 0:
            raise ValueError(f"conveyor: tar_shards: min_bytes_per_second must be >= 0, "
                             f"not {min_bytes_per_second!r}")
        # The engine's ShardOptions, one keyword a field. (The lead's fields= joins here.)
        self._options = options = _options.make(
            _C.ShardOptions, index=index or "", streaming=self.streaming,
            shuffle_buffer=int(shuffle_buffer), rank=rank, world_size=world_size,
            epoch_samples=int(epoch_samples), retries=int(retries),
            backoff_initial=float(backoff[0]), backoff_max=float(backoff[1]),
            request_timeout=float(request_timeout), connect_timeout=float(connect_timeout),
            requests_in_flight=int(requests_in_flight),
            min_bytes_per_second=int(min_bytes_per_second))
        if cpp_fields is not None:
            args = (self.shards, self.literal, cpp_fields, options)
            super().__init__(lambda: _C.field_tar_shards(*args), None)
            return
        args = (self.shards, self.literal, t._cpp, options)
        super().__init__(lambda: _C.tar_shards(*args), t)


def tar_shards(shards: Union[str, Sequence[str]], transform: Optional[Transform] = None,
               **options) -> TarShards:
    """WebDataset tar shards, named in one of two ways:

    - a ``str`` is a pattern you typed: a local path, a ``file://`` or ``http(s)://`` URL, or
      ``"pipe:COMMAND"`` (the command's output is the shard), in brace notation
      (``"train-{000000..000041}.tar"``);
    - a list (or one ``os.PathLike``) holds names taken literally: each an ``http(s)://`` URL or
      else a local path, whatever it holds. Never a pattern, never a command: pass what
      ``glob.glob``, ``os.listdir`` or a server's listing gives here, so that a file named
      ``"{pipe:CMD,x}.tar"`` is read as that file and runs nothing.

    Random access (the default, where ``PREFIX.index.json`` lies beside the shards or ``index=``
    names it): one ranged read per sample, so shuffling, resume and DistributedSampler work as
    for a folder. ``streaming=True`` (or shards without an index) reads whole shards in order
    through a shuffle buffer of ``shuffle_buffer`` samples, split over ``rank``/``world_size``
    (from torch.distributed when initialized); use the loader's default sequential order then.

    ``fields=`` (a dict of name -> ``conveyor.Image``, ``Text``, ``Json``, ``Int``, ``Float``,
    ``Array``, ``Bytes``) reads any members (``txt``, ``json``, ``npy``, ``boxes.npy``, ...) and
    makes batches ``conveyor.FieldBatch`` dicts (docs/fields.md); each Image field carries its
    own transform, so ``transform`` is not given then. Index others' shards once for random
    access with ``conveyor-prepare --index-only SHARD...``; without an index they are streamed.

    HTTP: ``retries`` (4) with exponential ``backoff`` (0.1 s .. 2 s), a deadline on every
    request (``request_timeout``, 30 s; ``connect_timeout``, 5 s), ``requests_in_flight`` (4)
    ranged reads per worker at once. A streamed shard (HTTP or ``pipe:``) that has reached byte N
    fails once it has waited more than (``retries`` + 1) x ``request_timeout`` + ``retries`` x
    the longest backoff + N / ``min_bytes_per_second`` (65536; 0: no floor), so a source that
    trickles cannot hold it forever.
    """
    return TarShards(shards, transform, **options)


class Manifest(Dataset):
    """A manifest of samples as named fields: CSV (a header row, RFC 4180 quoting), TSV or JSON
    Lines, one sample a row (``format``: "csv", "tsv", "jsonl", or None: from the extension).
    Each field reads its column; a ``conveyor.Image`` field's column names the image file,
    relative to the manifest's folder or absolute. Batches are ``conveyor.FieldBatch`` dicts::

        rows = conveyor.Manifest("train.jsonl", fields={
            "image": conveyor.Image("path", transform=conveyor.RandomResizedCrop(224)),
            "labels": conveyor.Array("labels", shape=(1000,), multi_hot=True)})

    ``describe(i)`` names the manifest and the line of row i."""

    def __init__(self, path: PathLike, fields: Mapping[str, Field],
                 format: Optional[str] = None) -> None:
        self.path = os.fspath(path)
        #: The fields of each sample (a dict).
        self.fields = dict(fields)
        cpp_fields = _cpp_fields(self.fields)
        fmt = "" if format is None else str(format)
        super().__init__(lambda: _C.manifest(self.path, cpp_fields, fmt), None)

    def __repr__(self) -> str:
        return (f"conveyor.Manifest({self.path!r}, {len(self)} samples, "
                f"fields={list(self.fields)})")


class UserDataset(Dataset):
    """The user's own map-style dataset as named fields: see :func:`from_dataset`."""

    def __init__(self, dataset: Any, fields: Mapping[str, Field],
                 names: Optional[Sequence[str]] = None) -> None:
        import torch.utils.data
        if isinstance(dataset, Dataset):
            raise ValueError(f"conveyor: from_dataset takes your own map-style dataset; "
                             f"{type(dataset).__qualname__} is a Conveyor dataset already: give "
                             f"it to conveyor.DataLoader as it is")
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise ValueError(
                f"conveyor: from_dataset takes a map-style dataset (__getitem__ and __len__), "
                f"not the IterableDataset {type(dataset).__qualname__}: the loader's order, "
                f"augmentation and state_dict resume are functions of (seed, epoch, index), and "
                f"an iterator has no index to resume at. For WebDataset shards use "
                f"conveyor.tar_shards(..., fields=...); otherwise give a map-style view of the "
                f"data (docs/python.md, \"Your own dataset\")")
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ValueError(f"conveyor: from_dataset takes a map-style dataset (with "
                             f"__getitem__ and __len__), not {type(dataset).__qualname__}")
        if names is not None:
            if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"conveyor: from_dataset names= must be a list of non-empty "
                                 f"str (one per item of a sample tuple), not {names!r}")
            names = tuple(names)
            if len(set(n.lower() for n in names)) != len(names):
                raise ValueError(f"conveyor: from_dataset names= lists a name twice (names are "
                                 f"matched without case): {list(names)}")
        #: The user's dataset, as given.
        self.dataset = dataset
        #: The fields of each sample (a dict).
        self.fields = dict(fields)
        #: The members of a sample tuple, in order (None: samples are dicts).
        self.names = names
        cpp_fields = _cpp_fields(self.fields)
        name_list = list(names or ())
        self._readers: "weakref.WeakKeyDictionary[_C.Source, _C.DatasetReader]" = \
            weakref.WeakKeyDictionary()

        def make() -> "_C.Source":
            source, reader = _C.from_dataset(dataset, cpp_fields, name_list)
            self._readers[source] = reader
            return source

        super().__init__(make, None)

    def _reader(self, source: "_C.Source") -> Optional["_C.DatasetReader"]:
        return self._readers.get(source)

    def __repr__(self) -> str:
        return (f"conveyor.from_dataset({type(self.dataset).__qualname__}, {len(self)} samples, "
                f"fields={list(self.fields)})")


def from_dataset(dataset: Any, fields: Mapping[str, Field],
                 names: Optional[Sequence[str]] = None) -> UserDataset:
    """Your own map-style dataset (``torch.utils.data.Dataset``, ``Subset``, ``ConcatDataset``,
    a list: anything with ``__getitem__`` and ``__len__``) as named fields, decoded by the
    engine::

        class Photos(torch.utils.data.Dataset):
            def __len__(self): return self.db.count()
            def __getitem__(self, i): return {"jpg": self.db.get_bytes(i), "cls": self.db.label(i)}

        data = conveyor.from_dataset(Photos(db), fields={
            "image": conveyor.Image("jpg", transform=conveyor.RandomResizedCrop(224, flip=True)),
            "label": conveyor.Int("cls")})
        loader = conveyor.DataLoader(data, batch_size=256, num_workers=16, shuffle=True)

    ``dataset[i]`` returns a dict of members (or a tuple or list, whose items ``names`` names),
    each matched to the fields' keys without case: ``bytes`` (an encoded image, any file), ``str``
    (UTF-8), ``int``, ``float``, numpy arrays and scalars and tensors (an Array field's; a 0-d one
    is a number), and lists or dicts (their ``json.dumps`` text: Json, multi-hot Array and Array
    fields read them as a JSON Lines manifest's cells). A worker takes the GIL only to call
    ``__getitem__`` and copy what it returned; decoding, transforms and writing the batch run
    without it. ``loader.stats()["gil"]`` says how much of the workers' time the GIL took.

    A ``__getitem__`` that raises goes through the loader's ``on_error``: a SampleError naming
    the index with the traceback in its message and the exception as ``__cause__``, or a counted
    skip. KeyboardInterrupt and SystemExit are never skipped: the loader raises them as they are.
    An ``IterableDataset`` is refused (resume needs an index): see docs/python.md.
    """
    return UserDataset(dataset, fields, names)


class PatternDataset(Dataset):
    """Synthetic samples of a deterministic byte pattern (an "image" of ``sample_bytes`` bytes
    and the index as "label"), for measuring the engine's own overhead and for tests."""

    def __init__(self, size: int, sample_bytes: int = 3 * 224 * 224) -> None:
        super().__init__(lambda: _C.pattern_source(int(size), int(sample_bytes)), None)

    @staticmethod
    def pattern_byte(index: int, offset: int) -> int:
        """The byte sample ``index`` holds at ``offset``."""
        return _C.pattern_byte(index, offset)


def expand_shard_braces(pattern: str) -> List[str]:
    """WebDataset's brace notation: ``"a-{000..002}.tar"`` -> a-000.tar, a-001.tar, a-002.tar."""
    return list(_C.expand_shard_braces(pattern))
