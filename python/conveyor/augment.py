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

from typing import Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _C

__all__ = ["BatchTransform", "Compose", "PerField", "Normalize", "RandomErasing", "MixUp", "CutMix",
           "MixUpCutMix", "ColorJitter", "RandomGrayscale", "GaussianBlur", "RandomSolarize",
           "TrivialAugmentWide", "RandAugment", "AutoAugment", "functional", "apply",
           "augment_steps"]

#: torchvision v2's kernels on uint8 images [..., 3, H, W], as the ops run them (for tests and
#: for users who transform by hand): adjust_brightness, adjust_contrast, adjust_saturation,
#: adjust_hue, adjust_sharpness, rgb_to_grayscale, posterize, solarize, solarize_add, invert,
#: equalize, autocontrast, gaussian_blur, affine, rotate, apply_augment_op.
functional = _C.augment.functional

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


class BatchTransform:
    """A batch op of the engine (conveyor/augment.h). ``repr()`` is its C++ name."""

    _op: "_C.augment.BatchOp"

    def __repr__(self) -> str:
        return self._op.name


def op_of(transform):
    """The engine's op behind ``transform`` (None stays None; a dict is ``PerField(transform)``);
    DataLoader's batch_transform."""
    if transform is None:
        return None
    if isinstance(transform, Mapping):
        transform = PerField(transform)
    if not isinstance(transform, BatchTransform):
        raise ValueError(f"conveyor: batch_transform must be a conveyor.augment op (Compose, "
                         f"Normalize, RandomErasing, MixUp, CutMix, MixUpCutMix, ColorJitter, "
                         f"RandomGrayscale, GaussianBlur, RandomSolarize, TrivialAugmentWide, "
                         f"RandAugment, AutoAugment), not "
                         f"{type(transform).__qualname__}")
    return transform._op


class Compose(BatchTransform):
    """The ops in turn; each draws its own random stream."""

    def __init__(self, transforms: Sequence[BatchTransform]) -> None:
        self.transforms = list(transforms)
        self._op = _C.augment.compose([op_of(t) for t in self.transforms])


class PerField(BatchTransform):
    """A pipeline per image field or per view group (conveyor.Views): ``{name: transform}``, or
    for a view group ``{name: [transform of view 0, of view 1, ...]}`` (DINOv2's global views).
    Each pipeline sees its field alone, under the name "image" (so the ops' default ``image``
    is right): a view group's [B, V, 3, S, S] as B * V images, or view by view. View v of a
    sample draws from (seed, epoch, index, v, repeat) and the field's name, so one transform
    for a group is the same as that transform for each of its views. The field keeps its place;
    Normalize inside makes it float [B, V, 3, S, S]. Ops that mix samples and labels (MixUp,
    CutMix) go in a Compose around it: ``Compose([PerField({...}), MixUpCutMix(...)])``.
    ``DataLoader(batch_transform={...})`` is ``PerField({...})``; with
    ``record_augment_params``, ``augment_params["fields"][name]["rows"][b][v]`` lists what view
    v of row b received."""

    def __init__(self, pipelines: Mapping[str, Union[BatchTransform,
                                                     Sequence[BatchTransform]]]) -> None:
        if not isinstance(pipelines, Mapping) or not pipelines:
            raise ValueError(f"conveyor: PerField takes a dict {{field or view group: transform "
                             f"or [one per view]}}, not {pipelines!r}")
        self.pipelines = dict(pipelines)
        specs = []
        for name, value in self.pipelines.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"conveyor: PerField's keys are field names, not {name!r}")
            ops = list(value) if isinstance(value, (list, tuple)) else [value]
            if not ops:
                raise ValueError(f"conveyor: PerField field {name!r} has no transform")
            specs.append((name, [op_of(t) for t in ops]))
        self._op = _C.augment.per_field(specs)


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


def _range(value, name: str, center: float, bound: Tuple[float, float],
           clip_first_on_zero: bool = True) -> Tuple[float, float]:
    """torchvision's ColorJitter._check_input: a number v is [center - v, center + v]."""
    if value is None:
        return (center, center)
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"conveyor: ColorJitter's {name} must be >= 0 as a single number")
        lo, hi = center - float(value), center + float(value)
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    else:
        lo, hi = (float(v) for v in value)
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"conveyor: ColorJitter's {name} must lie in {bound} and increase, "
                         f"not {(lo, hi)}")
    return (lo, hi)


def _fill(fill) -> list:
    if fill is None:
        return []
    return [float(fill)] if isinstance(fill, (int, float)) else [float(v) for v in fill]


def _interpolation(interpolation) -> str:
    name = getattr(interpolation, "value", interpolation)  # torchvision's InterpolationMode
    return str(name).lower()


class ColorJitter(BatchTransform):
    """Per sample, brightness, contrast, saturation and hue factors drawn uniform in their ranges
    and applied in a random order, as torchvision's ColorJitter; with probability ``p`` (1:
    always; ``p`` is RandomApply's, as DINOv2 writes ``RandomApply([ColorJitter(...)], p=0.8)``)."""

    def __init__(self, brightness=None, contrast=None, saturation=None, hue=None, *,
                 p: float = 1.0, image: str = "image") -> None:
        self._op = _C.augment.color_jitter(
            list(_range(brightness, "brightness", 1.0, (0.0, float("inf")))),
            list(_range(contrast, "contrast", 1.0, (0.0, float("inf")))),
            list(_range(saturation, "saturation", 1.0, (0.0, float("inf")))),
            list(_range(hue, "hue", 0.0, (-0.5, 0.5), clip_first_on_zero=False)), float(p), image)


class RandomGrayscale(BatchTransform):
    """Per sample, with probability ``p``, the image made gray on its 3 channels."""

    def __init__(self, p: float = 0.1, *, image: str = "image") -> None:
        self._op = _C.augment.random_grayscale(float(p), image)


class GaussianBlur(BatchTransform):
    """Per sample, a Gaussian blur of ``kernel_size`` with sigma uniform in ``sigma`` (min, max),
    as torchvision's GaussianBlur; with probability ``p`` (DINOv2's 1.0, 0.1, 0.5)."""

    def __init__(self, kernel_size: Union[int, Sequence[int]],
                 sigma: Union[float, Tuple[float, float]] = (0.1, 2.0), *, p: float = 1.0,
                 image: str = "image") -> None:
        sizes = [int(kernel_size)] if isinstance(kernel_size, int) else [int(k) for k in kernel_size]
        lo, hi = (float(sigma), float(sigma)) if isinstance(sigma, (int, float)) else sigma
        self._op = _C.augment.gaussian_blur(sizes, float(lo), float(hi), float(p), image)


class RandomSolarize(BatchTransform):
    """Per sample, with probability ``p``, pixels >= ``threshold`` inverted."""

    def __init__(self, threshold: float, p: float = 0.5, *, image: str = "image") -> None:
        self._op = _C.augment.random_solarize(float(threshold), float(p), image)


class TrivialAugmentWide(BatchTransform):
    """Per sample, one of torchvision's 14 ops at a magnitude bin uniform in
    ``num_magnitude_bins`` (torchvision's TrivialAugmentWide). ``interpolation``: "nearest" or
    "bilinear"; ``fill``: None (zeros), a number or one per channel."""

    def __init__(self, num_magnitude_bins: int = 31, interpolation="nearest", fill=None, *,
                 image: str = "image") -> None:
        self._op = _C.augment.trivial_augment_wide(int(num_magnitude_bins),
                                                   _interpolation(interpolation), _fill(fill),
                                                   image)


class RandAugment(BatchTransform):
    """Per sample, ``num_ops`` ops uniform among torchvision's 14 at bin ``magnitude`` of
    ``num_magnitude_bins`` (torchvision's RandAugment). ``RandAugment.timm("rand-m9-mstd0.5-inc1")``
    is timm's variant (DeiT's recipe)."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31,
                 interpolation="nearest", fill=None, *, image: str = "image") -> None:
        self._op = _C.augment.rand_augment(int(num_ops), float(magnitude),
                                           int(num_magnitude_bins), _interpolation(interpolation),
                                           _fill(fill), image)

    @classmethod
    def timm(cls, config: str = "rand-m9-mstd0.5-inc1", interpolation=None, fill=None, *,
             image: str = "image") -> "RandAugment":
        """timm's ``rand_augment_transform(config)``: keys m (magnitude, 0-10), n (ops, 2), mstd
        (magnitude std), mmax (10), inc (timm's increasing op set), p (each op's probability,
        0.5); bilinear and timm's ImageNet-mean fill (124, 116, 104) unless given."""
        self = cls.__new__(cls)
        self._op = _C.augment.timm_rand_augment(
            config, None if interpolation is None else _interpolation(interpolation),
            None if fill is None else _fill(fill), image)
        return self


class AutoAugment(BatchTransform):
    """Per sample, one of the ImageNet policy's 25 sub-policies (torchvision's AutoAugment)."""

    def __init__(self, interpolation="nearest", fill=None, *, image: str = "image") -> None:
        self._op = _C.augment.auto_augment(_interpolation(interpolation), _fill(fill), image)


def augment_steps(transform: BatchTransform, seed: int, count: int, height: int, width: int):
    """The (op, magnitude) steps that ``transform`` (TrivialAugmentWide, RandAugment or
    AutoAugment) draws for dataset indices 0..count-1 of epoch 0 under ``seed``."""
    return _C.augment.augment_steps(transform._op, int(seed), int(count), int(height), int(width))


def apply(transform: BatchTransform, fields: dict, *, seed: int = 0, epoch: int = 0,
          sequence: int = 0, indices: Optional[Sequence[int]] = None,
          repeats: Optional[Sequence[int]] = None, record: bool = False):
    """Runs ``transform`` on one batch outside a loader, as a loader with ``seed`` would on the
    batch ``sequence`` of ``epoch`` whose rows are the dataset's ``indices`` (default 0..B-1)
    and draws ``repeats`` (RASampler's repeat numbers; default all 0): ``fields`` maps names to
    tensors [B, ...] (uint8 "image" [B, 3, H, W] or [B, H, W, 3], int64 "label" [B], ...);
    returns the new dict. The tensors may be changed in place. With ``record``, returns
    ``(fields, params)``, params what the ops drew, as ``Batch.augment_params`` gives it."""
    rows = next(iter(fields.values())).shape[0]
    idx = list(range(rows)) if indices is None else [int(i) for i in indices]
    reps = [] if repeats is None else [int(r) for r in repeats]
    out, params = _C.augment.apply(op_of(transform), dict(fields), int(seed), int(epoch),
                                   int(sequence), idx, reps, bool(record))
    return (out, params) if record else out
