"""Conveyor: a C++ data-loading engine for PyTorch, from Python.

Worker threads decode JPEGs with libjpeg-turbo straight into a ring of batch slots (pinned, with a
CUDA device, and copied there on a side stream ahead of the training loop). The names follow
torch.utils.data and torchvision:

    import conveyor
    train = conveyor.ImageFolder("/data/imagenet/train",
                                 transform=conveyor.RandomResizedCrop(224, flip=True))
    loader = conveyor.DataLoader(train, batch_size=256, shuffle=True, num_workers=16,
                                 device="cuda", seed=0)
    for images, labels in loader:       # uint8 NCHW on cuda:0
        x = conveyor.normalize(images)  # float32, ImageNet mean/std

    ckpt = {"loader": loader.state_dict()}   # resume mid-epoch, bit-exact: load_state_dict()

See docs/python.md in the repository.
"""

from __future__ import annotations

import torch as _torch

_TORCH_BUILT_AGAINST = "2.11.0"
if _torch.__version__.split("+")[0] != _TORCH_BUILT_AGAINST:
    raise ImportError(
        f"conveyor was built against torch {_TORCH_BUILT_AGAINST} (its C++ ABI), but this "
        f"environment has torch {_torch.__version__}. Install torch=={_TORCH_BUILT_AGAINST}, "
        f"or rebuild conveyor in this environment: python -m pip install --no-build-isolation .")

from . import _C  # noqa: E402  (after the torch check: the extension links this torch)
from . import augment  # noqa: E402
from ._errors import SampleError  # noqa: E402
from .datasets import (Dataset, FileList, ImageFolder, JpegBytes, Manifest,  # noqa: E402
                       PatternDataset, TarShards, UserDataset, expand_shard_braces,
                       from_dataset, tar_shards)
from .fields import (Array, Boxes, Bytes, Field, FieldBatch, Float, Image, Int, Json,  # noqa: E402
                     Mask, Plan, Points, Text)
from .loader import Batch, DataLoader  # noqa: E402
from .samplers import (DistributedSampler, RandomSampler, RASampler, Sampler,  # noqa: E402
                       SequentialSampler)
from .transforms import (ALL_DCT_SCALES, FULL_DCT_SCALE, SIMD_DCT_SCALES,  # noqa: E402
                         JpegEntropyIndex, RandomResizedCrop, Resize, ResizeCenterCrop,
                         Transform, Views, eval_transform, train_transform)

__version__ = "0.1.0"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def normalize(images: _torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD,
              dtype: _torch.dtype = _torch.float32, *, hwc: bool | None = None,
              channels_last: bool = False) -> _torch.Tensor:
    """``(images / 255 - mean) / std`` per channel, as ``dtype`` (float32, float16, bfloat16),
    on the images' device (one fused kernel on CUDA). ``images`` is uint8 [B,3,H,W], or
    [B,H,W,3] (``hwc``: guessed from the shape when None). The result is [B,3,H,W], in
    channels-last memory format when ``channels_last``."""
    if images.dtype != _torch.uint8 or images.dim() != 4:
        raise ValueError(f"conveyor: normalize takes uint8 images [B,3,H,W] or [B,H,W,3], "
                         f"not {images.dtype} {tuple(images.shape)}")
    if hwc is None:
        hwc = images.shape[1] != 3 and images.shape[3] == 3
    return _C.normalize(images, [float(m) for m in mean], [float(s) for s in std], dtype,
                        bool(hwc), bool(channels_last))


def generate_image_folder(root: str, classes: int = 10, images_per_class: int = 100, *,
                          quality: int = 90, seed: int = 1, threads: int = 0,
                          mixed: bool = False) -> dict:
    """Writes (once: reused when complete) the photo-like synthetic ImageFolder that
    conveyor-bench uses: JPEGs about 500x375 that decode at the speed of real photos.
    ``mixed`` adds ImageNet's few percent of gray, CMYK, YCCK, progressive and 4:4:4 files.
    Returns {"root", "images", "bytes", "reused"}."""
    return _C.generate_image_folder(str(root), classes, images_per_class, quality, seed, threads,
                                    mixed)


def make_photo_jpeg(width: int, height: int, seed: int = 1, quality: int = 90) -> bytes:
    """One photo-like JPEG (bytes), deterministic in ``seed``."""
    return _C.make_photo_jpeg(width, height, seed, quality)


def cuda_available() -> bool:
    """Whether the engine can deliver batches to a CUDA device here."""
    return bool(_C.cuda_available())


__all__ = [
    "DataLoader", "Batch", "SampleError",
    "Dataset", "ImageFolder", "FileList", "JpegBytes", "TarShards", "tar_shards",
    "PatternDataset", "expand_shard_braces", "Manifest", "UserDataset", "from_dataset",
    "Field", "Image", "Mask", "Boxes", "Points", "Plan", "Int", "Float", "Array", "Bytes", "Text",
    "Json", "FieldBatch",
    "Sampler", "SequentialSampler", "RandomSampler", "DistributedSampler", "RASampler",
    "Transform", "RandomResizedCrop", "ResizeCenterCrop", "Resize", "Views", "train_transform",
    "eval_transform", "JpegEntropyIndex", "SIMD_DCT_SCALES", "FULL_DCT_SCALE", "ALL_DCT_SCALES",
    "normalize", "generate_image_folder", "make_photo_jpeg", "cuda_available",
    "IMAGENET_MEAN", "IMAGENET_STD",
]
