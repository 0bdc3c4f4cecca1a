"""One way for frozen records to become JSON-ready data: `dataclasses.fields` plus per-field metadata.

    @dataclass(frozen=True)
    class Holder(Record):
        pid: int
        memory: dict[int, int | None] = field(metadata=as_mib("memory_mib"))
        start_time: int = field(default=0, metadata=OMIT)

    Holder(1, {0: 1 << 30}).to_dict()  # {"pid": 1, "memory_mib": {"0": 1024.0}}

Enums become their values, tuples and sets lists, dict keys strings, paths strings, nested records dicts.
A record adds computed keys by overriding `derived()`. Used by the preflight and the launch records alike.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable, Mapping
from typing import Any

from podguard.units import mib

__all__ = ["OMIT", "Record", "as_mib", "as_ms", "in_mib", "renamed", "to_data"]

_KEY = "podguard.key"
_CONVERT = "podguard.convert"
_OMIT = "podguard.omit"

OMIT: Mapping[str, Any] = {_OMIT: True}  # field metadata: leave this field out of the data


def renamed(key: str | None = None, convert: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Field metadata: write the field under `key`, after `convert` (applied to the raw value)."""
    meta: dict[str, Any] = {}
    if key is not None:
        meta[_KEY] = key
    if convert is not None:
        meta[_CONVERT] = convert
    return meta


def in_mib(value: Any) -> Any:
    """Bytes (or {key: bytes}) as MiB rounded to 0.1; None stays None."""
    if isinstance(value, Mapping):
        return {str(k): mib(v) for k, v in value.items()}
    return mib(value)


def as_mib(key: str) -> dict[str, Any]:
    """Field metadata for bytes (or {gpu: bytes}) written as MiB rounded to 0.1 under `key`."""
    return renamed(key, in_mib)


def _round_ms(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _round_ms(v) for k, v in value.items()}
    return None if value is None else round(float(value), 3)


def as_ms(key: str | None = None) -> dict[str, Any]:
    """Field metadata for milliseconds (or {name: ms}) rounded to the microsecond."""
    return renamed(key, _round_ms)


def to_data(value: Any) -> Any:
    """`value` as plain JSON-ready data (see the module docstring for the rules)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            meta = f.metadata
            if meta.get(_OMIT) or f.name.startswith("_"):
                continue
            raw = getattr(value, f.name)
            convert = meta.get(_CONVERT)
            out[meta.get(_KEY, f.name)] = to_data(convert(raw) if convert is not None else raw)
        derived = getattr(value, "derived", None)
        if callable(derived):
            out.update({k: to_data(v) for k, v in derived().items()})
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(to_data(k)): to_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return [to_data(v) for v in items]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


class Record:
    """Mixin for dataclass records: `to_dict()` is `to_data(self)`; override `derived()` for computed keys."""

    __slots__ = ()

    def derived(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = to_data(self)
        return data
