"""conveyor.augment's ops against torchvision 0.26 (issue 34): each function with fixed parameters
against torchvision.transforms.v2.functional on the same uint8 images (exact for the pure pixel
maps; a stated bound, with the measured figures printed, for the interpolating ones), and the
draws of TrivialAugmentWide, RandAugment and AutoAugment over 100k samples against torchvision's
op tables (and timm's rand-m9-mstd0.5-inc1 against timm's definitions, written out below).
torchvision is not in CI's venv: the module skips then (augment_test holds the golden properties
without it)."""

from __future__ import annotations

import collections
import math

import pytest
import torch

tv = pytest.importorskip("torchvision", reason="torchvision is not installed (CI's venv lacks "
                                               "it): the op-by-op comparison needs it")
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as TF  # noqa: E402

import conveyor  # noqa: E402

aug = conveyor.augment
CF = aug.functional
NEAREST, BILINEAR = v2.InterpolationMode.NEAREST, v2.InterpolationMode.BILINEAR


def photo_like(n: int, h: int = 56, w: int = 64, seed: int = 0) -> torch.Tensor:
    """Smooth colour fields with edges and grain, as photos have: uint8 [n, 3, h, w]."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 6, 7, generator=g) * 255
    smooth = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bicubic",
                                             align_corners=False)
    edges = (torch.rand(n, 1, h // 8, w // 8, generator=g) > 0.7).float() * 60
    edges = torch.nn.functional.interpolate(edges, size=(h, w), mode="nearest")
    grain = torch.randn(n, 3, h, w, generator=g) * 6
    return (smooth + edges + grain).clamp(0, 255).to(torch.uint8)


IMAGES = photo_like(8)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def each_image():
    return [IMAGES[i] for i in range(IMAGES.shape[0])]


# --- exact: the pure pixel maps ----------------------------------------------------------------

EXACT = [
    ("posterize", [{"bits": b} for b in range(9)]),
    ("solarize", [{"threshold": t} for t in (0.0, 1.0, 64.0, 127.5, 128.0, 200.0, 255.0)]),
    ("invert", [{}]),
    ("equalize", [{}]),
    ("autocontrast", [{}]),
    ("adjust_brightness", [{"factor": f} for f in (0.0, 0.3, 0.99, 1.0, 1.01, 1.7, 2.5)]),
    ("adjust_contrast", [{"factor": f} for f in (0.0, 0.3, 0.99, 1.0, 1.01, 1.7, 2.5)]),
    ("adjust_saturation", [{"factor": f} for f in (0.0, 0.3, 0.99, 1.0, 1.01, 1.7, 2.5)]),
]
TV_NAMES = {"adjust_brightness": ("adjust_brightness", "brightness_factor"),
            "adjust_contrast": ("adjust_contrast", "contrast_factor"),
            "adjust_saturation": ("adjust_saturation", "saturation_factor"),
            "adjust_sharpness": ("adjust_sharpness", "sharpness_factor"),
            "adjust_hue": ("adjust_hue", "hue_factor")}


def torchvision_call(name, image, kwargs):
    if name in TV_NAMES:
        tv_name, key = TV_NAMES[name]
        return getattr(TF, tv_name)(image, **{key: kwargs["factor"]})
    return getattr(TF, name)(image, **kwargs)


@pytest.mark.parametrize("name,params", EXACT, ids=[n for n, _ in EXACT])
def test_pure_pixel_maps_equal_torchvision_exactly(name, params):
    for kwargs in params:
        for image in each_image() + [IMAGES]:  # one image, and a batch
            got = getattr(CF, name)(image, **kwargs)
            want = torchvision_call(name, image, kwargs)
            assert got.dtype == torch.uint8 and torch.equal(got, want), (name, kwargs)


def test_grayscale_equals_torchvision_exactly():
    for image in each_image():
        assert torch.equal(CF.rgb_to_grayscale(image), TF.rgb_to_grayscale(image, 3))


def test_equalize_and_autocontrast_on_flat_and_extreme_images():
    flat = torch.full((3, 9, 9), 77, dtype=torch.uint8)
    two = torch.zeros(3, 9, 9, dtype=torch.uint8)
    two[:, :, 4:] = 255
    for image in (flat, two, torch.randint(0, 256, (3, 31, 17), dtype=torch.uint8)):
        assert torch.equal(CF.equalize(image), TF.equalize(image))
        assert torch.equal(CF.autocontrast(image), TF.autocontrast(image))


# --- bounded: the interpolating and convolving ones --------------------------------------------
# Bound: max abs diff <= 1 level and PSNR >= 50 dB on photo-like images (the same ATen kernels in
# the same order: measured 0, i.e. bit-exact, on the dev machine; the bound allows for a CPU
# whose vector code rounds a float32 sum differently).

MAX_ABS, MIN_PSNR = 1, 50.0
measured = {}


def check_bounded(label, got, want):
    diff = (got.int() - want.int()).abs().max().item()
    p = psnr(got, want)
    measured[label] = (diff, p)
    print(f"{label}: max abs diff {diff}, PSNR {p:.1f} dB")
    assert got.shape == want.shape and got.dtype == torch.uint8
    assert diff <= MAX_ABS and p >= MIN_PSNR, (label, diff, p)


def test_sharpness_hue_and_blur_within_the_bound():
    for image in each_image():
        for f in (0.0, 0.1, 0.5, 1.5, 1.99):
            check_bounded(f"sharpness {f}", CF.adjust_sharpness(image, f),
                          TF.adjust_sharpness(image, sharpness_factor=f))
        for h in (-0.5, -0.2, -0.05, 0.0, 0.1, 0.33, 0.5):
            check_bounded(f"hue {h}", CF.adjust_hue(image, h), TF.adjust_hue(image, hue_factor=h))
        for k, s in ((3, 0.5), (9, 1.7), (23, 0.1), (23, 2.0)):
            check_bounded(f"blur {k} {s}", CF.gaussian_blur(image, [k, k], [s, s]),
                          TF.gaussian_blur(image, kernel_size=[k, k], sigma=[s, s]))


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [None, [0.0], [124.0, 116.0, 104.0]])
def test_affine_and_rotate_within_the_bound(mode, fill):
    tv_mode = NEAREST if mode == "nearest" else BILINEAR
    tv_fill = None if fill is None else (fill[0] if len(fill) == 1 else fill)
    cases = [(0.0, [0, 0], 1.0, [0.0, 0.0], None), (13.0, [3, -5], 1.0, [0.0, 0.0], None),
             (0.0, [0, 0], 1.0, [21.8, 0.0], [0, 0]), (0.0, [0, 0], 1.0, [0.0, -30.0], [0, 0]),
             (-37.5, [7, 2], 0.9, [5.0, 3.0], None), (0.0, [-20, 0], 1.0, [0.0, 0.0], None)]
    for image in each_image()[:4]:
        for angle, translate, scale, shear, center in cases:
            got = CF.affine(image, angle, [float(t) for t in translate], scale, shear, mode,
                            fill or [], center or [])
            want = TF.affine(image, angle=angle, translate=translate, scale=scale, shear=shear,
                             interpolation=tv_mode, fill=tv_fill, center=center)
            check_bounded(f"affine {mode} {fill} {angle} {translate} {shear}", got, want)
        for angle in (0.0, 4.5, -30.0, 90.0, 135.0, 180.0, -90.0, 271.0):
            got = CF.rotate(image, angle, mode, fill or [])
            want = TF.rotate(image, angle=angle, interpolation=tv_mode, fill=tv_fill)
            check_bounded(f"rotate {mode} {fill} {angle}", got, want)


AUGMENT_OPS = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
               "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast",
               "Equalize", "Invert"]


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_each_augment_op_equals_torchvision_s_at_its_magnitudes(mode):
    tv_mode = NEAREST if mode == "nearest" else BILINEAR
    ta = v2.TrivialAugmentWide(interpolation=tv_mode)
    for op in AUGMENT_OPS:
        if op == "Posterize":
            magnitudes = [float(b) for b in range(9)]
        elif op == "Solarize":
            magnitudes = [0.0, 0.25, 0.5, 0.9667, 1.0]
        else:
            magnitudes = [0.0, 0.3, -0.3, 0.99, -0.99, 17.0, -32.0, 135.0]
            if op in ("Brightness", "Color", "Contrast", "Sharpness"):
                magnitudes = [m for m in magnitudes if 1 + m >= 0]
        for m in magnitudes:
            for image in each_image()[:3]:
                got = CF.apply_augment_op(image, op, m, mode, [])
                want = ta._apply_image_or_video_transform(image, op, m, interpolation=tv_mode,
                                                          fill={torch.Tensor: None})
                if op in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Sharpness"):
                    check_bounded(f"{op} {m} {mode}", got, want)
                else:
                    assert torch.equal(got, want), (op, m)


# --- distributions -----------------------------------------------------------------------------
N = 100_000


def chi2_ok(counts: dict, expected: dict) -> None:
    """Pearson's chi-square against expected counts, at the 1e-6 level (generous: the test must
    not flake, and a wrong law is off by far more)."""
    keys = set(counts) | set(expected)
    stat = sum((counts.get(k, 0) - expected[k]) ** 2 / expected[k] for k in keys)
    dof = len(keys) - 1
    # Wilson-Hilferty: the chi-square quantile at 1 - 1e-6 (z = 4.753).
    limit = dof * (1 - 2 / (9 * dof) + 4.753 * math.sqrt(2 / (9 * dof))) ** 3
    assert stat < limit, (stat, limit, counts, expected)


def bins_of(space, name, num_bins, h, w):
    fn, signed = space[name]
    values = fn(num_bins, h, w)
    return (None if values is None else [float(v) for v in values]), signed


def check_magnitudes(steps, space, num_bins, h, w, fixed_bin=None):
    by_op = collections.defaultdict(list)
    for s in steps:
        for op, m in s:
            by_op[op].append(m)
    for op, ms in by_op.items():
        bins, signed = bins_of(space, op, num_bins, h, w)
        if bins is None:
            assert set(ms) == {0.0}, op
            continue
        allowed = bins if fixed_bin is None else [bins[fixed_bin]]
        absolute = collections.Counter(abs(m) if signed else m for m in ms)
        assert set(absolute) <= {abs(b) if signed else b for b in allowed}, op
        if fixed_bin is None and len(ms) > 2000:  # uniform over the bins (zero and equal
            per_value = collections.Counter(abs(b) if signed else b for b in bins)  # bins merge)
            chi2_ok(absolute, {v: len(ms) * c / num_bins for v, c in per_value.items()})
        nonzero = [m for m in ms if m != 0]
        if signed and len(nonzero) > 2000:
            negative = sum(m < 0 for m in nonzero) / len(nonzero)
            assert abs(negative - 0.5) < 5 * math.sqrt(0.25 / len(nonzero)), op


def test_trivial_augment_wide_draws_as_torchvision_defines():
    ta = aug.TrivialAugmentWide()
    steps = aug.augment_steps(ta, 11, N, 224, 224)
    assert all(len(s) == 1 for s in steps)
    space = v2.TrivialAugmentWide._AUGMENTATION_SPACE
    counts = collections.Counter(s[0][0] for s in steps)
    chi2_ok(counts, {op: N / len(space) for op in space})
    check_magnitudes(steps, space, 31, 224, 224)


def test_rand_augment_draws_as_torchvision_defines():
    ra = aug.RandAugment(num_ops=2, magnitude=9)
    steps = aug.augment_steps(ra, 12, N, 160, 224)
    assert all(len(s) == 2 for s in steps)
    space = v2.RandAugment._AUGMENTATION_SPACE
    counts = collections.Counter(op for s in steps for op, _ in s)
    chi2_ok(counts, {op: 2 * N / len(space) for op in space})
    check_magnitudes(steps, space, 31, 160, 224, fixed_bin=9)


def test_auto_augment_draws_as_torchvision_defines():
    aa = aug.AutoAugment()
    steps = aug.augment_steps(aa, 13, N, 224, 224)
    policies = v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)._policies
    assert len(policies) == 25
    expected = collections.Counter()
    for policy in policies:
        for op, p, _ in policy:
            expected[op] += N * p / len(policies)
    expected = {op: c for op, c in expected.items() if c > 0}
    counts = collections.Counter(op for s in steps for op, _ in s)
    chi2_ok(counts, expected)
    space = v2.AutoAugment._AUGMENTATION_SPACE
    allowed = collections.defaultdict(set)
    for policy in policies:
        for op, _, idx in policy:
            bins, _ = bins_of(space, op, 10, 224, 224)
            allowed[op].add(0.0 if bins is None else bins[idx])
    for s in steps:
        assert len(s) <= 2
        for op, m in s:
            assert abs(m) in {abs(v) for v in allowed[op]}, (op, m)


# timm 1.0's auto_augment.py, as its rand-m9-mstd0.5-inc1 uses it: two slots, each an op uniform
# (with replacement) among the 15 of _RAND_INCREASING_TRANSFORMS, applied with probability 0.5,
# its level N(9, 0.5) clipped to [0, 10].
TIMM_INCREASING = ["AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                   "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing",
                   "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY",
                   "TranslateXRel", "TranslateYRel"]
TIMM_AS = {"PosterizeIncreasing": "Posterize", "SolarizeIncreasing": "Solarize",
           "ColorIncreasing": "Color", "ContrastIncreasing": "Contrast",
           "BrightnessIncreasing": "Brightness", "SharpnessIncreasing": "Sharpness",
           "TranslateXRel": "TranslateX", "TranslateYRel": "TranslateY"}


def test_timm_rand_augment_draws_as_timm_defines():
    ra = aug.RandAugment.timm("rand-m9-mstd0.5-inc1")
    assert "timm=True" in repr(ra) and "increasing=True" in repr(ra)
    steps = aug.augment_steps(ra, 14, N, 224, 224)
    counts = collections.Counter(op for s in steps for op, _ in s)
    chi2_ok(counts, {TIMM_AS.get(op, op): 2 * N * 0.5 / 15 for op in TIMM_INCREASING})
    levels = collections.defaultdict(list)
    for s in steps:
        for op, m in s:
            levels[op].append(m)
    rotate = torch.tensor(levels["Rotate"]).abs() / 3.0  # (level / 10) * 30 degrees
    # E[min(N(9, 0.5), 10)] = 8.9958, its sd just under 0.5
    assert abs(rotate.mean().item() - 8.9958) < 5 * 0.5 / math.sqrt(len(rotate))
    assert rotate.max().item() <= 10.0 + 1e-9 and 0.45 < rotate.std().item() < 0.51
    # Posterize keeps 4 - int(level / 10 * 4) bits: 1 for levels in [7.5, 10), 0 at 10.
    assert set(levels["Posterize"]) <= {0.0, 1.0, 2.0}
    # The enhancements' factors: max(0.1, 1 +- level / 10 * 0.9).
    for op in ("Color", "Contrast", "Brightness", "Sharpness"):
        factors = torch.tensor(levels[op]) + 1
        assert ((factors - 1).abs() <= 0.9 + 1e-9).all() and (factors >= 0.1 - 1e-9).all(), op
