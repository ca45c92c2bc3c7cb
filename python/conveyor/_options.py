"""The engine's option structs from Python, without plumbing each field by hand.

conveyor._C binds the C++ option structs (LoaderOptions, ShardOptions with its RemoteOptions,
ImageTransform with its DecodeLimits, FolderOptions, GpuDecode) as classes with one read-write
attribute per field, and their enums with the texts the Python API takes as value names
(ErrorPolicy "raise"/"skip", ImageLayout "CHW"/"HWC", ImageTransform.Mode, GpuDecode.Mode).
Here is the one place that reads such a text (:func:`choice`), fills a struct (:func:`make`) and
writes a struct back as a plain dict (:func:`to_dict`). A new option is one line in
python/src/options.cpp and its keyword where the public class takes it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Type

import torch

from . import _C

__all__ = ["choice", "choices", "make", "fields", "to_dict"]


def choices(enum_type: type) -> List[str]:
    """The texts a bound enum takes, in the binding's order."""
    return list(enum_type.__members__)


def _either(names: List[str]) -> str:
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def choice(enum_type: type, value: Any, what: str):
    """The member of the bound enum ``enum_type`` whose text is ``value``. Raises ValueError
    naming ``what`` (e.g. "DataLoader on_error"), every text it takes, and ``value``."""
    members = enum_type.__members__
    if isinstance(value, str) and value in members:
        return members[value]
    raise ValueError(f"conveyor: {what} must be {_either(list(members))}, not {value!r}")


def fields(struct_type: type) -> List[str]:
    """The field names of a bound option struct (its read-write attributes, base classes'
    first), in the binding's order."""
    names: List[str] = []
    for klass in reversed(struct_type.__mro__):
        for name, attribute in vars(klass).items():
            if isinstance(attribute, property) and attribute.fset is not None \
                    and name not in names:
                names.append(name)
    return names


def make(struct_type: Type, **values):
    """A ``struct_type`` with the engine's defaults, then each of ``values`` set by name (an
    unknown name raises AttributeError; a value of the wrong type, TypeError)."""
    struct = struct_type()
    for name, value in values.items():
        if name not in fields(struct_type):
            raise AttributeError(f"conveyor: {struct_type.__name__} has no field {name!r}")
        setattr(struct, name, value)
    return struct


def _plain(value: Any) -> Any:
    if hasattr(type(value), "__members__"):  # a bound enum: its text
        return value.name
    if isinstance(value, torch.device):
        return str(value)
    if type(value).__module__ == _C.__name__ and fields(type(value)):
        return to_dict(value)  # a nested struct (ImageTransform.limits, LoaderOptions.gpu_decode)
    return value


def to_dict(struct) -> Dict[str, Any]:
    """Every field of a bound option struct as Python ints, floats, bools, strings (an enum's
    text, a device's name), None, or a dict for a nested struct."""
    return {name: _plain(getattr(struct, name)) for name in fields(type(struct))}
