# Type stubs of the conveyor package (issue 21): what an editor completes. The docstrings are in
# the .py files (help(conveyor.DataLoader)).
import os
from typing import (Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union, overload)

import torch

from . import augment

__version__: str
IMAGENET_MEAN: Tuple[float, float, float]
IMAGENET_STD: Tuple[float, float, float]
SIMD_DCT_SCALES: int
FULL_DCT_SCALE: int
ALL_DCT_SCALES: int

_Path = Union[str, os.PathLike[str]]

class SampleError(RuntimeError):
    index: int
    path: str
    reason: str
    def __init__(self, message: str, index: int, path: str, reason: str = ...) -> None: ...

# --- transforms ----------------------------------------------------------------------------------
class JpegEntropyIndex:
    def __init__(self, budget_mib: int = ..., file: Optional[_Path] = ...) -> None: ...
    @property
    def file(self) -> Optional[str]: ...
    @property
    def loaded(self) -> Dict[str, Any]: ...
    def save(self) -> None: ...
    @property
    def budget_bytes(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def files(self) -> int: ...

class Transform:
    size: int
    resize: int
    scale: Tuple[float, float]
    ratio: Tuple[float, float]
    flip: float
    layout: str
    exif_orientation: bool
    max_pixels: int
    dct_scales: int
    entropy_index: Optional[JpegEntropyIndex]
    @property
    def output_shape(self) -> Tuple[int, int, int]: ...

class RandomResizedCrop(Transform):
    def __init__(self, size: Union[int, Sequence[int]], scale: Sequence[float] = ...,
                 ratio: Sequence[float] = ..., *, flip: Union[bool, float] = ...,
                 layout: str = ..., exif_orientation: bool = ..., max_pixels: int = ...,
                 dct_scales: int = ...,
                 entropy_index: Optional[JpegEntropyIndex] = ...) -> None: ...

class ResizeCenterCrop(Transform):
    def __init__(self, size: Union[int, Sequence[int]] = ..., resize: int = ..., *,
                 layout: str = ..., exif_orientation: bool = ..., max_pixels: int = ...,
                 dct_scales: int = ...,
                 entropy_index: Optional[JpegEntropyIndex] = ...) -> None: ...

class Resize(Transform):
    def __init__(self, size: Union[int, Sequence[int]], *, layout: str = ...,
                 exif_orientation: bool = ..., max_pixels: int = ...,
                 dct_scales: int = ...,
                 entropy_index: Optional[JpegEntropyIndex] = ...) -> None: ...

class Views(Transform):
    groups: Dict[str, Tuple[int, Transform]]
    decode_once: bool
    def __init__(self, groups: Mapping[str, Tuple[int, Transform]], *, layout: str = ...,
                 exif_orientation: bool = ..., max_pixels: int = ..., dct_scales: int = ...,
                 decode_once: bool = ...,
                 entropy_index: Optional[JpegEntropyIndex] = ...) -> None: ...
    @property
    def output_shape(self) -> Dict[str, Tuple[int, int, int, int]]: ...  # type: ignore[override]

def train_transform(size: int = ..., **kwargs: Any) -> RandomResizedCrop: ...
def eval_transform(size: int = ..., resize: int = ..., **kwargs: Any) -> ResizeCenterCrop: ...

# --- datasets ------------------------------------------------------------------------------------
class Dataset:
    transform: Optional[Transform]
    def __len__(self) -> int: ...
    def describe(self, index: int) -> str: ...

class _ImageDataset(Dataset):
    @property
    def classes(self) -> List[str]: ...
    @property
    def class_to_idx(self) -> Dict[str, int]: ...
    @property
    def samples(self) -> List[Tuple[str, int]]: ...
    @property
    def targets(self) -> List[int]: ...

class ImageFolder(_ImageDataset):
    root: str
    def __init__(self, root: _Path, transform: Optional[Transform] = ...) -> None: ...

class FileList(_ImageDataset):
    def __init__(self, items: Union[_Path, Iterable[Tuple[_Path, int]]],
                 transform: Optional[Transform] = ...) -> None: ...

class JpegBytes(_ImageDataset):
    def __init__(self, jpegs: Sequence[bytes], labels: Sequence[int],
                 transform: Optional[Transform] = ...) -> None: ...

# A str is a pattern the user typed (braces, pipe:COMMAND, file://); a path object or a sequence
# holds names taken literally (an http(s):// URL, else a local path): what a glob or listing gives.
_ShardNames = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]

class TarShards(_ImageDataset):
    shards: List[str]
    literal: bool
    streaming: bool
    rank: int
    world_size: int
    def __init__(self, shards: _ShardNames, transform: Optional[Transform] = ...,
                 *, streaming: bool = ..., index: Optional[str] = ..., shuffle_buffer: int = ...,
                 rank: Optional[int] = ..., world_size: Optional[int] = ...,
                 epoch_samples: int = ..., retries: int = ...,
                 backoff: Tuple[float, float] = ..., request_timeout: float = ...,
                 connect_timeout: float = ..., requests_in_flight: int = ...,
                 min_bytes_per_second: int = ...,
                 fields: Optional[Mapping[str, Field]] = ...) -> None: ...
    fields: Optional[Dict[str, Field]]

def tar_shards(shards: _ShardNames, transform: Optional[Transform] = ..., *,
               streaming: bool = ..., index: Optional[str] = ..., shuffle_buffer: int = ...,
               rank: Optional[int] = ..., world_size: Optional[int] = ...,
               epoch_samples: int = ..., retries: int = ..., backoff: Tuple[float, float] = ...,
               request_timeout: float = ..., connect_timeout: float = ...,
               requests_in_flight: int = ..., min_bytes_per_second: int = ...,
               fields: Optional[Mapping[str, Field]] = ...) -> TarShards: ...

# --- named fields (docs/fields.md) ---------------------------------------------------------------
class Field:
    keys: str

class Image(Field):
    transform: Transform
    mode: str
    dtype: torch.dtype
    def __init__(self, keys: str = ..., transform: Optional[Transform] = ...,
                 mode: str = ..., dtype: torch.dtype = ...) -> None: ...

# Mask, Boxes, Points and Plan follow an image field, or a group of its conveyor.Views (then each
# view of the group: Mask [B,V,S,S], Plan [B,V,7], Boxes and Points jagged with B*V rows, row
# b*V + v being sample b's view v, and batch[name + "_per_view"] int64 [B,V]).
class Mask(Field):
    follows: str
    dtype: torch.dtype
    def __init__(self, keys: str = ..., follows: str = ..., dtype: torch.dtype = ...) -> None: ...

class Boxes(Field):
    follows: str
    paired: Tuple[str, ...]
    min_size: float
    min_visibility: float
    max_bytes: int
    def __init__(self, keys: str = ..., follows: str = ..., paired: Sequence[str] = ..., *,
                 min_size: float = ..., min_visibility: float = ...,
                 max_bytes: Optional[int] = ...) -> None: ...

class Points(Field):
    follows: str
    columns: Optional[int]
    max_bytes: int
    def __init__(self, keys: str = ..., follows: str = ..., *, columns: Optional[int] = ...,
                 max_bytes: Optional[int] = ...) -> None: ...

class Plan(Field):
    follows: str
    def __init__(self, follows: str = ...) -> None: ...

class Int(Field):
    def __init__(self, keys: str = ...) -> None: ...

class Float(Field):
    def __init__(self, keys: str) -> None: ...

class Array(Field):
    shape: Optional[Tuple[int, ...]]
    dtype: torch.dtype
    multi_hot: bool
    max_bytes: int
    def __init__(self, keys: str = ..., shape: Optional[Sequence[int]] = ...,
                 dtype: torch.dtype = ..., *, multi_hot: bool = ...,
                 max_bytes: Optional[int] = ...) -> None: ...

class Bytes(Field):
    max_bytes: int
    def __init__(self, keys: str, max_bytes: Optional[int] = ...) -> None: ...

class Text(Bytes):
    def __init__(self, keys: str = ..., max_bytes: Optional[int] = ...) -> None: ...

class Json(Bytes):
    def __init__(self, keys: str = ..., max_bytes: Optional[int] = ...) -> None: ...

class FieldBatch(Dict[str, Any]):
    indices: List[int]
    repeats: List[int]
    augment_params: Optional[Dict[str, Any]]
    epoch: int
    sequence: int
    def record_stream(self, stream: Any) -> None: ...

class Manifest(Dataset):
    path: str
    fields: Dict[str, Field]
    def __init__(self, path: Union[str, os.PathLike], fields: Mapping[str, Field],
                 format: Optional[str] = ...) -> None: ...

class UserDataset(Dataset):
    dataset: Any
    fields: Dict[str, Field]
    names: Optional[Tuple[str, ...]]
    def __init__(self, dataset: Any, fields: Mapping[str, Field],
                 names: Optional[Sequence[str]] = ...) -> None: ...

def from_dataset(dataset: Any, fields: Mapping[str, Field],
                 names: Optional[Sequence[str]] = ...) -> UserDataset: ...

class PatternDataset(Dataset):
    def __init__(self, size: int, sample_bytes: int = ...) -> None: ...
    @staticmethod
    def pattern_byte(index: int, offset: int) -> int: ...

def expand_shard_braces(pattern: str) -> List[str]: ...

# --- samplers ------------------------------------------------------------------------------------
class Sampler:
    kind: str

class SequentialSampler(Sampler):
    def __init__(self, data_source: Any = ...) -> None: ...

class RandomSampler(Sampler):
    seed: Optional[int]
    def __init__(self, data_source: Any = ..., *, seed: Optional[int] = ...) -> None: ...

class DistributedSampler(Sampler):
    num_replicas: int
    rank: int
    shuffle: bool
    seed: int
    drop_last: bool
    def __init__(self, dataset: Any = ..., num_replicas: Optional[int] = ...,
                 rank: Optional[int] = ..., shuffle: bool = ..., seed: int = ...,
                 drop_last: bool = ...) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...

class RASampler(Sampler):
    num_replicas: int
    rank: int
    shuffle: bool
    num_repeats: int
    seed: Optional[int]
    selected_round: int
    def __init__(self, dataset: Any = ..., num_replicas: Optional[int] = ...,
                 rank: Optional[int] = ..., shuffle: bool = ..., num_repeats: int = ..., *,
                 seed: Optional[int] = ..., selected_round: int = ...) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...

# --- the loader ----------------------------------------------------------------------------------
class Batch(Tuple[torch.Tensor, ...]):
    names: Tuple[str, ...]
    indices: List[int]
    repeats: List[int]
    augment_params: Optional[Dict[str, Any]]
    epoch: int
    sequence: int
    @overload  # type: ignore[override]
    def __getitem__(self, key: Union[int, str]) -> torch.Tensor: ...
    @overload
    def __getitem__(self, key: slice) -> Tuple[torch.Tensor, ...]: ...
    def field(self, name: str) -> torch.Tensor: ...
    @property
    def images(self) -> torch.Tensor: ...
    @property
    def labels(self) -> torch.Tensor: ...
    def record_stream(self, stream: torch.cuda.Stream) -> None: ...

class DataLoader:
    dataset: Dataset
    sampler: Sampler
    def __init__(self, dataset: Dataset, batch_size: Optional[int] = ...,
                 shuffle: Optional[bool] = ..., sampler: Optional[Any] = ...,
                 batch_sampler: None = ..., num_workers: Optional[int] = ...,
                 collate_fn: None = ..., pin_memory: bool = ..., drop_last: bool = ...,
                 timeout: float = ..., worker_init_fn: None = ...,
                 multiprocessing_context: None = ..., generator: None = ..., *,
                 prefetch_factor: Optional[int] = ..., persistent_workers: bool = ...,
                 pin_memory_device: str = ..., in_order: bool = ..., seed: int = ...,
                 device: Union[str, torch.device, None] = ..., on_error: str = ...,
                 max_substitutes: int = ..., slots: int = ..., chunk_size: int = ...,
                 gpu_decode: Union[str, float] = ...,
                 batch_transform: Union[augment.BatchTransform,
                                        Mapping[str, Union[augment.BatchTransform,
                                                           Sequence[augment.BatchTransform]]],
                                        None] = ...,
                 record_augment_params: bool = ...) -> None: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> Dict[str, Union[int, str]]: ...
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> DataLoader: ...
    def __exit__(self, *exc: Any) -> None: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def drop_last(self) -> bool: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def options(self) -> Dict[str, Any]: ...
    @property
    def epoch(self) -> int: ...
    @property
    def mode(self) -> str: ...
    @property
    def pinned_bytes(self) -> int: ...
    @property
    def is_pinned(self) -> bool: ...
    def stats(self) -> Dict[str, Any]: ...

# --- helpers -------------------------------------------------------------------------------------
def normalize(images: torch.Tensor, mean: Sequence[float] = ..., std: Sequence[float] = ...,
              dtype: torch.dtype = ..., *, hwc: Optional[bool] = ...,
              channels_last: bool = ...) -> torch.Tensor: ...
def generate_image_folder(root: _Path, classes: int = ..., images_per_class: int = ..., *,
                          quality: int = ..., seed: int = ..., threads: int = ...,
                          mixed: bool = ...) -> Dict[str, Any]: ...
def make_photo_jpeg(width: int, height: int, seed: int = ..., quality: int = ...) -> bytes: ...
def cuda_available() -> bool: ...
