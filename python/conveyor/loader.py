"""conveyor.DataLoader: the engine's loader, with the names of torch.utils.data.DataLoader."""

from __future__ import annotations

import atexit
import os
import weakref
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch

from . import _C, _options
from . import augment as _augment
from ._errors import SampleError
from .datasets import Dataset
from .fields import FieldBatch, make_field_batch
from .samplers import RandomSampler, Sampler, SequentialSampler, from_torch

__all__ = ["DataLoader", "Batch"]


class Batch(tuple):
    """One batch: a tuple of the dataset's fields, so ``images, labels = batch`` (uint8 images
    [B,3,S,S] or [B,S,S,3], int64 labels [B]).

    Attributes: ``names`` (the fields' names), ``indices`` (the dataset index of each row, in
    row order: substitutes under on_error="skip" included), ``repeats`` (each row's repeat
    number under ``RASampler``: the k-th draw of a sample in the epoch is repeat k-1; all 0
    otherwise), ``epoch`` and ``sequence`` (the batch's position in the epoch), and with
    ``DataLoader(record_augment_params=True)`` ``augment_params``: what ``batch_transform``
    drew, ``{"rows": [[(op, name, value), ...] for each row], "batch": [(op, name, value),
    ...]}`` (None when not recorded). Per row: an AutoAugment-family step as (op, step,
    signed magnitude), e.g. ("TrivialAugmentWide", "Rotate", -12.0); RandomErasing's box as
    ("RandomErasing", "x0"/"y0"/"x1"/"y1", pixels); ColorJitter's factors as ("ColorJitter",
    "brightness", 1.2), ...; GaussianBlur's ("GaussianBlur", "sigma", s); a probability op that
    fired as (op, "applied", 1.0). Per batch: ("MixUp", "lambda", l) or CutMix's box and
    lambda. The tensors are the engine's memory, not copies: on the CPU
    they view a slot of its ring, which is recycled once the tensors are dropped.
    """

    names: Tuple[str, ...]
    indices: List[int]
    repeats: List[int]
    augment_params: Optional[dict]
    epoch: int
    sequence: int
    _fence: Any = None  # _C.BatchFence of a device batch: the end of its copy

    @classmethod
    def _make(cls, fields, offsets, names, indices, epoch, sequence, fence=None,
              repeats=None, augment_params=None) -> "Batch":
        batch = tuple.__new__(cls, fields)
        batch.names = tuple(names)
        batch.indices = indices
        batch.repeats = repeats if repeats is not None else [0] * len(indices)
        batch.augment_params = augment_params
        batch.epoch = epoch
        batch.sequence = sequence
        batch._fence = fence  # the end of the batch's own copy to the device; None on the CPU
        return batch

    def __getitem__(self, key):
        """``batch[i]`` (a tuple's item, a slice) or ``batch["name"]`` (the field of that name:
        ``batch["global"]`` of a ``conveyor.Views`` transform)."""
        if isinstance(key, str):
            return self.field(key)
        return tuple.__getitem__(self, key)

    def field(self, name: str) -> torch.Tensor:
        try:
            return self[self.names.index(name)]
        except ValueError:
            raise KeyError(f"conveyor: the batch has no field {name!r} "
                           f"(it has {', '.join(self.names)})") from None

    @property
    def images(self) -> torch.Tensor:
        return self.field("image")

    @property
    def labels(self) -> torch.Tensor:
        return self.field("label")

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        """Use the batch on another CUDA stream: ``stream`` waits for the copy that produced it
        (the current stream already does), and the caching allocator keeps the tensors' memory
        until the work queued on ``stream`` so far is done. A no-op for CPU batches.

        ``stream`` waits for the batch's own copy (its fence, as in the C++ Batch::record_stream),
        never for whatever the current stream holds, so ``batch.record_stream(s)`` inside
        ``with torch.cuda.stream(s):`` is right too."""
        if self._fence is not None:
            self._fence.use_on(stream, list(self))

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}={tuple(t.shape)} {t.dtype} {t.device}"
                           for n, t in zip(self.names, self))
        return f"conveyor.Batch(epoch={self.epoch}, sequence={self.sequence}, {shapes})"


_live_loaders: "weakref.WeakSet[DataLoader]" = weakref.WeakSet()


@atexit.register
def _close_live_loaders() -> None:
    # Interpreter exit: stop every loader's threads and release its ring and streams before
    # Python and CUDA tear down (the engine would otherwise die with them, mid-work).
    for loader in list(_live_loaders):
        try:
            loader.close()
        except Exception:  # pragma: no cover - best effort at exit (e.g. a forked child)
            pass


def _positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"conveyor: DataLoader {name} must be an int >= {minimum}, "
                         f"not {value!r}")
    return value


def _device(device) -> str:
    if device is None:
        return "cpu"
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"conveyor: DataLoader device {device!r} is not a device") from None
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        d = torch.device("cuda", torch.cuda.current_device())  # as torch: "cuda" is the current one
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"conveyor: DataLoader device must be 'cpu' or 'cuda[:N]', not {device!r}")
    return str(d)


def _refuse(name: str, value, advice: str) -> None:
    if value is not None:
        raise ValueError(f"conveyor: DataLoader does not take {name}: {advice}")


class DataLoader:
    """Batches of a Conveyor dataset, decoded by C++ worker threads straight into a ring of
    batch slots and, with a CUDA ``device``, copied there on a side stream ahead of the loop.

        loader = conveyor.DataLoader(train, batch_size=256, shuffle=True, num_workers=16,
                                     device="cuda", seed=0)
        for epoch in range(90):
            for images, labels in loader:   # uint8 NCHW on cuda:0, already copied, stream-safe
                ...

    A dataset made with ``fields=`` (``conveyor.tar_shards(..., fields=...)``,
    ``conveyor.Manifest``) yields ``conveyor.FieldBatch`` dicts keyed by field name instead:
    images and arrays as tensors on ``device``, ragged arrays as ``torch.nested`` jagged
    tensors there, text as ``list[str]``, JSON as parsed values (docs/fields.md).

    Arguments (torch.utils.data.DataLoader's names where the meaning is the same):
        dataset: a Conveyor dataset (ImageFolder, FileList, JpegBytes, tar_shards, Manifest,
            from_dataset). A torch.utils.data.Dataset itself is refused: its whole Python
            __getitem__ (decode included) would serialize the workers on the GIL; wrap it in
            conveyor.from_dataset, whose __getitem__ returns encoded bytes (docs/python.md).
        batch_size: samples per batch (default 1).
        shuffle: a new permutation every epoch, a pure function of (seed, epoch).
        sampler: conveyor.SequentialSampler, RandomSampler, DistributedSampler (torch's
            DistributedSampler is translated) or RASampler (repeated augmentation). Not with
            shuffle.
        num_workers: decoding threads (not processes; they never take the GIL). None (the
            default): one per core; 0: one thread; "auto": the engine chooses, while it runs,
            how many of one thread per core work (few when the training step is the
            bottleneck), from what it measures; stats()["active_workers_history"] shows the
            choice as (batch, seconds, workers). The batches are the same either way.
        drop_last: drop the last batch of an epoch when it is short.
        timeout: seconds to wait for one batch before TimeoutError; 0 (default): no limit.
        seed: seeds the order (shuffle) and the augmentations (default 0): the batches are the
            same for any num_workers.
        on_error: "raise" (default): a sample that fails raises conveyor.SampleError (with
            .index and .path); "skip": it is replaced by the next index that loads, and counted
            in stats()["skipped"].
        pin_memory: with device="cpu", hand out batches in pinned memory (a copy), ready for
            your own non_blocking copies. Default False: views of the ring, no copy.
        device: "cpu" (default) or "cuda[:N]": batches arrive there; the current stream waits
            for each batch's copy.
        prefetch_factor: batches copied to the device ahead of the loop (CUDA; default 2).
        in_order: deliver batches in sampler order (default True); False delivers them as they
            finish (then state_dict() mid-epoch is refused).
        gpu_decode: with a CUDA ``device``, decode on the GPU's hardware JPEG engines (nvJPEG,
            A100/H100/H200) as well as on the worker threads, each image straight into the
            batch's device memory with the same crops: "off" (default), "auto" (each chunk to
            the decoder whose queue drains first), "hw-only" (every file the hardware takes) or
            a share in [0, 1] of the samples (a pure function of seed, epoch and index, so
            resume and any num_workers give the same bytes). Where it cannot run, everything is
            decoded on the CPU and stats()["gpu_decode"]["status"] says why; that dict also
            gives each decoder's images and the decode threads' busy and idle seconds.
        batch_transform: a conveyor.augment op (Compose([...]) for several) run on each batch
            before it is handed out, on the batch's device, off the training thread (None, the
            default: none); or a dict of them per image field or view group (augment.PerField).
            Batches stay the same for any num_workers and after a resume.
        record_augment_params: record what batch_transform drew for each batch as
            ``Batch.augment_params`` (default False).
        max_substitutes, slots, chunk_size: the engine's LoaderOptions (loader.h).
        persistent_workers: accepted for compatibility: the workers always persist.

    Each ``iter(loader)`` starts the next epoch (or continues a loaded state mid-epoch);
    ``len(loader)`` is the batches per epoch; ``set_epoch(e)`` makes the next ``iter()`` start
    epoch e. ``state_dict()``/``load_state_dict()`` checkpoint the position (torchdata's
    StatefulDataLoader convention): a plain dict for torch.save; the next iteration continues
    with the batch after the last one received, bit-exact, for any num_workers. ``close()`` (or
    dropping the loader) stops its threads.
    """

    def __init__(self, dataset: Dataset, batch_size: Optional[int] = 1,
                 shuffle: Optional[bool] = None, sampler: Optional[Sampler] = None,
                 batch_sampler=None, num_workers: Union[int, str, None] = None, collate_fn=None,
                 pin_memory: bool = False, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True, seed: int = 0,
                 device: Union[str, torch.device, None] = None, on_error: str = "raise",
                 max_substitutes: int = 16, slots: int = 0, chunk_size: int = 0,
                 gpu_decode: Union[str, float] = "off",
                 batch_transform: Union[_augment.BatchTransform,
                                        Mapping[str, Any], None] = None,
                 record_augment_params: bool = False) -> None:
        if not isinstance(dataset, Dataset):
            if isinstance(dataset, torch.utils.data.Dataset) or hasattr(dataset, "__getitem__"):
                raise ValueError(
                    f"conveyor: DataLoader takes a Conveyor dataset (conveyor.ImageFolder, "
                    f"FileList, JpegBytes, tar_shards, Manifest), not the Python dataset "
                    f"{type(dataset).__qualname__}. Wrap it: conveyor.from_dataset(dataset, "
                    f"fields={{\"image\": conveyor.Image(\"jpg\"), \"label\": "
                    f"conveyor.Int(\"cls\")}}), its __getitem__ returning the encoded bytes and "
                    f"values (the engine decodes them without the GIL: docs/python.md, \"Your "
                    f"own dataset\"), or keep torch.utils.data.DataLoader for it")
            raise ValueError(f"conveyor: DataLoader dataset must be a Conveyor dataset, not "
                             f"{type(dataset).__qualname__}")
        _refuse("batch_sampler", batch_sampler, "use batch_size, sampler and drop_last")
        _refuse("collate_fn", collate_fn,
                "the engine writes each sample straight into its batch (a tuple of tensors); "
                "transform the batch in the loop")
        _refuse("worker_init_fn", worker_init_fn, "its workers are C++ threads")
        _refuse("multiprocessing_context", multiprocessing_context,
                "its workers are C++ threads")
        _refuse("generator", generator, "pass seed=")
        if batch_size is None:
            raise ValueError("conveyor: DataLoader batch_size=None (no batching) is not offered")
        batch_size = _positive_int(batch_size, "batch_size")
        if num_workers is None:
            workers = 0  # the engine: one per hardware thread
        elif num_workers == "auto":
            workers = _C.AUTO_WORKERS  # the engine's kAutoWorkers, up to one per hardware thread
        else:
            workers = max(1, _positive_int(num_workers, "num_workers", minimum=0))
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"conveyor: DataLoader timeout must be seconds >= 0, "
                             f"not {timeout!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"conveyor: DataLoader seed must be an int in [0, 2**63), "
                             f"not {seed!r}")
        on_error = _options.choice(_C.ErrorPolicy, on_error, "DataLoader on_error")
        prefetch_factor = _positive_int(2 if prefetch_factor is None else prefetch_factor,
                                        "prefetch_factor")
        if sampler is not None and shuffle:
            raise ValueError("conveyor: DataLoader sampler option is mutually exclusive with "
                             "shuffle")
        if sampler is None:
            sampler = RandomSampler() if shuffle else SequentialSampler()
        # A torch DistributedSampler's set_epoch() (its .epoch) is followed at each iter().
        self._torch_sampler = None
        if sampler is not None and not isinstance(sampler, Sampler):
            self._torch_sampler = sampler
            self._torch_epoch_seen = getattr(sampler, "epoch", None)
            sampler = from_torch(sampler, seed)
        device_name = _device(pin_memory_device if pin_memory_device and device is None
                              else device)
        options = _options.make(
            _C.LoaderOptions, batch_size=batch_size, workers=workers, drop_last=bool(drop_last),
            enforce_ordering=bool(in_order), timeout=float(timeout), seed=seed, on_error=on_error,
            max_substitutes=_positive_int(max_substitutes, "max_substitutes", 0),
            device=torch.device(device_name), pin_memory=bool(pin_memory),
            prefetch_factor=prefetch_factor, slots=_positive_int(slots, "slots", 0),
            chunk_size=_positive_int(chunk_size, "chunk_size", 0),
            gpu_decode=_C.GpuDecode.parse(str(gpu_decode)),  # its texts, or a share
            batch_transform=_augment.op_of(batch_transform),
            record_augment_params=bool(record_augment_params))
        self.dataset = dataset
        self.sampler = sampler
        source = dataset._claim()
        # A from_dataset source's reader: its GIL time, and the exceptions __getitem__ raised.
        self._reader = dataset._reader(source)
        self._cpp = _C.Loader(source, options, **sampler._spec(seed))
        self._generation = 0
        _live_loaders.add(self)

    # --- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """The next epoch's batches (or the rest of a loaded state's epoch), as
        ``(images, labels)`` pairs. It replaces an earlier iterator of this loader, whose
        next ``next()`` raises RuntimeError."""
        sampler = self.sampler
        if getattr(sampler, "_pending_epoch", None) is not None:
            self._cpp.set_epoch(sampler._pending_epoch)
            sampler._pending_epoch = None
        if self._torch_sampler is not None:
            epoch = getattr(self._torch_sampler, "epoch", None)
            if epoch is not None and epoch != self._torch_epoch_seen:
                self._cpp.set_epoch(int(epoch))
                self._torch_epoch_seen = epoch
        self._cpp.start_epoch()
        self._generation += 1
        return _EpochIterator(self, self._generation)

    def __len__(self) -> int:
        """Batches per epoch (this rank's, for a DistributedSampler)."""
        return self._cpp.batches_per_epoch()

    def set_epoch(self, epoch: int) -> None:
        """The next ``iter()`` starts ``epoch`` (as DistributedSampler.set_epoch)."""
        self._cpp.set_epoch(_positive_int(epoch, "epoch", 0))

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The loader's position: the epoch, the batches received in it, and what shapes the
        order (seed, batch_size, drop_last, dataset size, the sampler). Ints and strings only,
        so ``torch.save`` writes it and ``torch.load(weights_only=True)`` reads it. Nothing
        about num_workers, prefetch_factor or the device: resume with any of them changed."""
        return self._cpp.state_dict()

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Continue from ``state_dict``: the next ``iter()`` starts with the batch after the last
        one received (the next epoch if that one was complete), byte-identical to an
        uninterrupted run's, without reading the batches before it. A DistributedSampler's state
        loads on another number of ranks (elastic). Raises ValueError naming the field that does
        not fit (batch_size, drop_last, dataset size, seed, sampler ...), changing nothing."""
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"conveyor: load_state_dict takes the dict state_dict() returned, "
                             f"not {type(state_dict).__qualname__}")
        self._cpp.load_state_dict(dict(state_dict))

    # --- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the workers and releases the ring and the copy stage; batches already handed
        out stay valid. Dropping the loader does the same."""
        self._cpp.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- what it is doing --------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self._cpp.options.batch_size

    @property
    def num_workers(self) -> int:
        """Worker threads, as resolved (None was one per core)."""
        return self._cpp.workers

    @property
    def drop_last(self) -> bool:
        return self._cpp.options.drop_last

    @property
    def device(self) -> torch.device:
        return self._cpp.options.device

    @property
    def options(self) -> Dict[str, Any]:
        """The engine's options as resolved (workers, slots, chunk_size filled in): every field
        of its LoaderOptions, enums and the device as their texts, gpu_decode as the text its
        keyword takes."""
        options = self._cpp.options
        return {**_options.to_dict(options), "gpu_decode": str(options.gpu_decode)}

    @property
    def epoch(self) -> int:
        """The current (or last) epoch."""
        return self._cpp.epoch

    @property
    def mode(self) -> str:
        """One line saying which path is in use: the GPU copy stage, or "CPU only (...)"."""
        return self._cpp.mode

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the slot ring (pinned or not), allocated once."""
        return self._cpp.pinned_bytes

    @property
    def is_pinned(self) -> bool:
        return self._cpp.is_pinned

    def stats(self) -> Dict[str, Any]:
        """batches, samples, skipped, errors, skipped_samples (the first 1000: index, path,
        message, epoch), fill_seconds (worker time), wait_seconds (the loop's waits),
        copy_issue_seconds, slot_states, copies_to_host. A ``conveyor.from_dataset`` dataset's
        loader adds "gil": {"held_seconds", "wait_seconds", "calls", "share"}: the workers' time
        holding the GIL (in ``__getitem__`` and copying what it returned) and waiting to take
        it, the ``__getitem__`` calls, and share = held_seconds / fill_seconds."""
        stats = self._cpp.stats()
        if self._reader is not None:
            gil = self._reader.gil()
            fill = stats["fill_seconds"]
            gil["share"] = gil["held_seconds"] / fill if fill > 0 else 0.0
            stats["gil"] = gil
        return stats

    def _raise_from_dataset(self, error: SampleError) -> None:
        """``error`` came from a from_dataset dataset's __getitem__: raises it with the Python
        exception as its __cause__, or a KeyboardInterrupt or SystemExit as itself."""
        cause = self._reader.take_error(error.index) if self._reader is not None else None
        if cause is None:
            return
        if not isinstance(cause, Exception):
            raise cause
        raise error from cause

    def __repr__(self) -> str:
        if self._cpp.closed:
            return "conveyor.DataLoader(closed)"
        return (f"conveyor.DataLoader({self.dataset!r}, batch_size={self.batch_size}, "
                f"num_workers={self.num_workers}, sampler={self.sampler!r}, mode={self.mode!r})")


class _EpochIterator:
    """One epoch of a DataLoader; a later ``iter(loader)`` replaces it."""

    __slots__ = ("_loader", "_generation")

    def __init__(self, loader: DataLoader, generation: int) -> None:
        self._loader = loader
        self._generation = generation

    def __iter__(self) -> "_EpochIterator":
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Union[Batch, FieldBatch]:
        loader = self._loader
        if loader._generation != self._generation:
            raise RuntimeError("conveyor: this iterator belongs to an earlier epoch, which a later "
                               "iter(loader) replaced")
        try:
            out = loader._cpp.next()
        except SampleError as error:
            loader._raise_from_dataset(error)
            raise
        if out is None:
            raise StopIteration
        fields = getattr(loader.dataset, "fields", None)
        if fields is not None:
            return make_field_batch(fields, out)
        return Batch._make(*out)
