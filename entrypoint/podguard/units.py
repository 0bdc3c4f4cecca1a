"""Byte units and their human rendering, shared by every module that prints memory."""

from __future__ import annotations

__all__ = ["GIB", "KIB", "MIB", "describe_memory", "mib"]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def mib(value: int | None) -> float | None:
    """Bytes as MiB rounded to 0.1 (None stays None: the driver could not tell)."""
    return None if value is None else round(value / MIB, 1)


def describe_memory(value: int | None) -> str:
    """Bytes for a person: `'1.5 GiB'`, `'300 MiB'`, or `'memory n/a'` when unknown."""
    if value is None:
        return "memory n/a"
    if value >= GIB:
        return f"{value / GIB:.1f} GiB"
    return f"{value / MIB:.0f} MiB"
