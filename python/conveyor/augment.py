"""conveyor.augment: augmentations the loader runs on each whole batch (issue 34).

Give a pipeline as ``DataLoader(..., batch_transform=Compose([...]))``: the loader runs it on
each batch, on the batch's device, before handing the batch out: on a CPU loader in the worker
thread that finishes the batch (never the training thread), on a CUDA loader on its copy stream
after the copy (the training step's stream waits for it, as for the copy). Every random draw is a
function of (seed, epoch, the sample's index) per sample, or of (seed, epoch, the batch's
sequence) per batch, so the batches are the same for any num_workers and after a state_dict
resume. The names and parameters are torchvision.transforms.v2's (MixUpCutMix is timm's Mixup).

    aug = conveyor.augment
    loader = conveyor.DataLoader(data, batch_size=256, device="cuda", batch_transform=aug.Compose([
        aug.RandomErasing(p=0.1), aug.Normalize(mean, std),
        aug.MixUpCutMix(mixup_alpha=0.2, cutmix_alpha=1.0, num_classes=1000,
                        label_smoothing=0.1)]))
    for images, targets in loader:   # float32 [B, 3, H, W]; soft targets float32 [B, 1000]

docs/augment.md lists the ops and how to add one.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from . import _C

__all__ = ["BatchTransform", "Compose", "Normalize", "RandomErasing", "MixUp", "CutMix",
           "MixUpCutMix"]

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


class BatchTransform:
    """A batch op of the engine (conveyor/augment.h). ``repr()`` is its C++ name."""

    _op: "_C.augment.BatchOp"

    def __repr__(self) -> str:
        return self._op.name


def op_of(transform: Optional[BatchTransform]):
    """The engine's op behind ``transform`` (None stays None); DataLoader's batch_transform."""
    if transform is None:
        return None
    if not isinstance(transform, BatchTransform):
        raise ValueError(f"conveyor: batch_transform must be a conveyor.augment op (Compose, "
                         f"Normalize, RandomErasing, MixUp, CutMix, MixUpCutMix), not "
                         f"{type(transform).__qualname__}")
    return transform._op


class Compose(BatchTransform):
    """The ops in turn; each draws its own random stream."""

    def __init__(self, transforms: Sequence[BatchTransform]) -> None:
        self.transforms = list(transforms)
        self._op = _C.augment.compose([op_of(t) for t in self.transforms])


class Normalize(BatchTransform):
    """uint8 images to ``dtype`` [B, 3, H, W]: (x / 255 - mean) / std (conveyor.normalize's
    rule, which it is)."""

    def __init__(self, mean: Sequence[float] = _IMAGENET_MEAN,
                 std: Sequence[float] = _IMAGENET_STD, dtype: torch.dtype = torch.float32,
                 image: str = "image") -> None:
        self._op = _C.augment.normalize([float(m) for m in mean], [float(s) for s in std], dtype,
                                        image)


class RandomErasing(BatchTransform):
    """Per sample, with probability ``p``, a box of area fraction in ``scale`` and aspect ratio
    in ``ratio`` set to ``value`` (one number, or one per channel), as torchvision's."""

    def __init__(self, p: float = 0.5, scale: Tuple[float, float] = (0.02, 0.33),
                 ratio: Tuple[float, float] = (0.3, 3.3),
                 value: Union[float, Sequence[float]] = 0, image: str = "image") -> None:
        values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
        self._op = _C.augment.random_erasing(float(p), float(scale[0]), float(scale[1]),
                                             float(ratio[0]), float(ratio[1]), values, image)


class MixUp(BatchTransform):
    """Per batch, lambda ~ Beta(alpha, alpha); images blended with the batch in reverse order,
    labels (int64 classes) made soft targets float32 [B, num_classes] summing to 1."""

    def __init__(self, *, alpha: float = 1.0, num_classes: int, label_smoothing: float = 0.0,
                 image: str = "image", label: str = "label") -> None:
        self._op = _C.augment.mixup(float(alpha), int(num_classes), float(label_smoothing),
                                    image, label)


class CutMix(BatchTransform):
    """Per batch, a box of area about 1 - lambda (lambda ~ Beta(alpha, alpha)) pasted from the
    batch in reverse order; the targets weighted by the pasted box's exact area."""

    def __init__(self, *, alpha: float = 1.0, num_classes: int, label_smoothing: float = 0.0,
                 image: str = "image", label: str = "label") -> None:
        self._op = _C.augment.cutmix(float(alpha), int(num_classes), float(label_smoothing),
                                     image, label)


class MixUpCutMix(BatchTransform):
    """timm's Mixup: per batch, CutMix with probability ``switch_prob`` (when both alphas are
    > 0), else MixUp; label smoothing as timm's."""

    def __init__(self, *, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0,
                 num_classes: int = 1000, label_smoothing: float = 0.1,
                 switch_prob: float = 0.5, image: str = "image", label: str = "label") -> None:
        self._op = _C.augment.mixup_cutmix(float(mixup_alpha), float(cutmix_alpha),
                                           float(switch_prob), float(label_smoothing),
                                           int(num_classes), image, label)
