"""Several pods (clusters) of one name: which one the keeper takes.

pick_one(found, "pod", "llm-train", only="")   # the one of the name; 64 when there are several
oldest(found)                                  # after a create: the one that stays (createdAt, then id)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["Named", "oldest", "pick_one"]


class Named(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def created_at(self) -> str | None: ...


def oldest(items: Sequence[Named]) -> Named:
    """The one of several of one name that stays: the oldest (RunPod's createdAt), then the lowest id."""
    return min(items, key=lambda x: (x.created_at or "~", x.id))


def pick_one(found: Sequence[Named], what: str, name: str, only: str) -> Named | None:
    """`only`: that id or None; else the one of the name, None when there is none, 64 when there are several."""
    if only:
        return next((x for x in found if x.id == only), None)
    if len(found) > 1:
        from podguard.errors import UsageError

        ids = ", ".join(x.id for x in found)
        raise UsageError(f"{len(found)} {what}s are named {name!r} ({ids}); take the extra ones down first")
    return found[0] if found else None
