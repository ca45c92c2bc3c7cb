"""The engine's option structs as bound classes (conveyor._C.LoaderOptions, ShardOptions,
ImageTransform, ...): every field set from Python arrives in the C++ loader, the public keywords
fill them, and every text an enum takes is read in one place, whose error names the choices."""

from __future__ import annotations

import pytest
import torch

import conveyor
from conveyor import _C, _options
from conftest import CROP, shard_pattern

# A value other than the engine's default for every LoaderOptions field: a field bound without
# one here fails test_every_loader_option_field_set_from_python_arrives_in_the_engine.
LOADER_VALUES = {
    "batch_size": 3,
    "workers": _C.AUTO_WORKERS,
    "max_workers": 3,
    "drop_last": True,
    "enforce_ordering": False,
    "timeout": 2.5,
    "seed": 12345,
    "on_error": "skip",
    "max_substitutes": 5,
    "device": "cuda:0" if torch.cuda.is_available() else "cpu",
    "pin_memory": True,
    "prefetch_factor": 4,
    "slots": 9,
    "chunk_size": 2,
    "gpu_decode": {"mode": "share", "share": 0.25, "threads": 3, "max_batch": 300},
    # Set as an op (conveyor.augment), read back as its name.
    "batch_transform": "RandomErasing(p=0.25, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=[0])",
    "record_augment_params": True,
}


def _struct_value(field: str, value):
    """LOADER_VALUES[field] as the bound struct takes it."""
    if field == "on_error":
        return _options.choice(_C.ErrorPolicy, value, field)
    if field == "device":
        return torch.device(value)
    if field == "gpu_decode":
        mode = _options.choice(_C.GpuDecode.Mode, value["mode"], "gpu_decode mode")
        return _options.make(_C.GpuDecode, **{**value, "mode": mode})
    if field == "batch_transform":
        return conveyor.augment.op_of(conveyor.augment.RandomErasing(p=0.25))
    return value


def test_every_loader_option_field_set_from_python_arrives_in_the_engine(photos):
    assert set(LOADER_VALUES) == set(_options.fields(_C.LoaderOptions))
    default = _options.to_dict(_C.LoaderOptions())
    for field, value in LOADER_VALUES.items():
        if field == "device" and not torch.cuda.is_available():
            continue  # the CPU is the only device here, and the default
        assert default[field] != value, field
    options = _options.make(_C.LoaderOptions, **{field: _struct_value(field, value)
                                                 for field, value in LOADER_VALUES.items()})
    assert _options.to_dict(options) == LOADER_VALUES

    # The engine's own LoaderOptions (DataLoader::options(), as it resolved them) read back.
    source = conveyor.ImageFolder(photos, transform=conveyor.Resize(CROP))._claim()
    loader = _C.Loader(source, options, sampler="sequential", sampler_seed=0, rank=0,
                       world_size=1, shuffle=False, sampler_drop_last=False)
    try:
        # kAutoWorkers starts max_workers threads; everything else arrives as it was set.
        assert _options.to_dict(loader.options) == {**LOADER_VALUES, "workers": 3}
        assert loader.workers == 3
    finally:
        loader.close()


def test_the_dataloader_keywords_fill_the_engines_options(photos):
    ds = conveyor.ImageFolder(photos, transform=conveyor.Resize(CROP))
    loader = conveyor.DataLoader(ds, batch_size=3, num_workers=3, drop_last=True, timeout=2.5,
                                 seed=11, on_error="skip", max_substitutes=5, pin_memory=True,
                                 prefetch_factor=3, slots=9, chunk_size=2, in_order=False,
                                 gpu_decode=0.25)
    try:
        assert loader.options == {
            "batch_size": 3, "workers": 3, "max_workers": 3, "drop_last": True,
            "enforce_ordering": False, "timeout": 2.5, "seed": 11, "on_error": "skip",
            "max_substitutes": 5, "device": "cpu", "pin_memory": True, "prefetch_factor": 3,
            "slots": 9, "chunk_size": 2, "gpu_decode": "0.25", "batch_transform": None,
            "record_augment_params": False}
        assert (loader.batch_size, loader.drop_last, loader.device) == (3, True,
                                                                      torch.device("cpu"))
    finally:
        loader.close()
    defaults = conveyor.DataLoader(ds, num_workers=1)
    try:
        options = defaults.options
        assert (options["timeout"], options["on_error"], options["gpu_decode"]) == (None, "raise",
                                                                                    "off")
    finally:
        defaults.close()


def test_a_timeout_in_seconds_is_kept_to_the_millisecond():
    options = _C.LoaderOptions()
    for seconds, kept in ((0, None), (None, None), (0.0004, 0.001), (1.2344, 1.234),
                          (1.2346, 1.235), (3600, 3600.0)):
        options.timeout = seconds
        assert options.timeout == kept, seconds
    shard = _C.ShardOptions()
    shard.request_timeout = 0.25
    assert (shard.request_timeout, shard.connect_timeout) == (0.25, 5.0)
    for bad in (float("nan"), float("inf"), 1e300):
        with pytest.raises(ValueError, match="request_timeout must be a finite number of seconds"):
            shard.request_timeout = bad


def test_the_transform_keywords_fill_the_engines_transform():
    index = conveyor.JpegEntropyIndex(budget_mib=3)
    t = conveyor.RandomResizedCrop(48, scale=(0.25, 0.75), ratio=(0.5, 2.0), flip=0.3,
                                   layout="HWC", exif_orientation=True, max_pixels=12345,
                                   dct_scales=conveyor.ALL_DCT_SCALES, entropy_index=index)
    got = _options.to_dict(t._cpp)
    assert got.pop("entropy_index").budget_bytes == 3 << 20
    assert _options.to_dict(conveyor.Resize(32)._cpp)["entropy_index"] is None  # the dataset's
    assert got == {"mode": "random_resized_crop", "size": 48, "resize": 256, "scale_min": 0.25,
                   "scale_max": 0.75, "ratio_min": 0.5, "ratio_max": 2.0,
                   "flip_probability": 0.3, "layout": "HWC",
                   "limits": {"max_pixels": 12345, "max_scans": 500},
                   "exif_orientation": True, "dct_scales": conveyor.ALL_DCT_SCALES,
                   "own_entropy_decoder": True, "views": [], "decode_views_once": True}
    assert set(got) | {"entropy_index"} == set(_options.fields(_C.ImageTransform))
    assert _options.to_dict(conveyor.ResizeCenterCrop(32, resize=40)._cpp)["mode"] == \
        "resize_center_crop"
    assert _options.to_dict(conveyor.Resize(32)._cpp)["mode"] == "resize"


def test_the_enums_take_the_texts_of_the_python_api():
    assert _options.choices(_C.ErrorPolicy) == ["raise", "skip"]
    assert _options.choices(_C.ImageLayout) == ["CHW", "HWC"]
    assert _options.choices(_C.ImageTransform.Mode) == [
        t._mode for t in (conveyor.RandomResizedCrop, conveyor.ResizeCenterCrop, conveyor.Resize)]
    assert _options.choices(_C.GpuDecode.Mode) == ["off", "share", "auto"]


@pytest.mark.parametrize("keyword", ["on_error", "layout"])
def test_a_bad_choice_is_a_value_error_naming_every_choice(photos, keyword):
    ds = conveyor.ImageFolder(photos, transform=conveyor.Resize(CROP))
    enum, what, make = {
        "on_error": (_C.ErrorPolicy, "DataLoader on_error",
                     lambda bad: conveyor.DataLoader(ds, on_error=bad)),
        "layout": (_C.ImageLayout, "layout", lambda bad: conveyor.RandomResizedCrop(8, layout=bad)),
    }[keyword]
    texts = _options.choices(enum)
    for bad in ("ignore", "", "RAISE", "chw", None, 1, ["skip"]):
        with pytest.raises(ValueError) as raised:
            make(bad)
        # The one message, from the one reading (conveyor._options.choice).
        assert str(raised.value) == (f"conveyor: {what} must be "
                                     f"{', '.join(map(repr, texts[:-1]))} or {texts[-1]!r}, "
                                     f"not {bad!r}")
        with pytest.raises(ValueError) as direct:
            _options.choice(enum, bad, what)
        assert str(direct.value) == str(raised.value)


def test_a_struct_refuses_a_field_it_does_not_have():
    with pytest.raises(AttributeError, match="LoaderOptions has no field 'batchsize'"):
        _options.make(_C.LoaderOptions, batchsize=4)
    options = _C.LoaderOptions()
    with pytest.raises(AttributeError):
        options.batchsize = 4  # a bound struct takes no new attribute
    with pytest.raises(TypeError):
        options.batch_size = -1  # size_t


def test_the_tar_shards_keywords_fill_the_engines_shard_options(shards):
    ds = conveyor.tar_shards(str(shards / shard_pattern(shards)), conveyor.Resize(CROP),
                             streaming=True, index=str(shards / "photos.index.json"),
                             shuffle_buffer=7, rank=1, world_size=3, epoch_samples=4, retries=2,
                             backoff=(0.25, 1.5), request_timeout=9.5, connect_timeout=1.25,
                             requests_in_flight=6, min_bytes_per_second=1000)
    got = _options.to_dict(ds._options)
    assert got == {"retries": 2, "backoff_initial": 0.25, "backoff_max": 1.5,
                   "request_timeout": 9.5, "connect_timeout": 1.25, "min_bytes_per_second": 1000,
                   "requests_in_flight": 6, "index": str(shards / "photos.index.json"),
                   "streaming": True, "shuffle_buffer": 7, "rank": 1, "world_size": 3,
                   "epoch_samples": 4, "stream_window": 2048, "stream_lookahead": 512}
    assert len(ds) == 4  # epoch_samples arrived in the engine's source
