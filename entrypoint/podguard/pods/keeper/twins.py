"""Several pods (clusters) of one name: which one the keeper takes.

pick_one(found, only="", prefer=kept_id)        # the one of the name (several: the kept one, else the oldest)
oldest(found)                                  # after a create: the one that stays (createdAt, then id)
keep = settle(found, discard)                  # the oldest stays, every other one is discarded (terminated)

Several of one name are a moment in another actor's work (`pod heal --replace` between its create and its
terminate; two keepers settling twins), never a reason for an overnight keeper to end: a keeper that exited here
would leave the pods billing with nothing watching (a deployed keeper even stops its own pod on an error).
`createdAt` is a required field of RunPod's REST v2 Pod and Cluster (runpod/docs api-reference-v2/openapi.json);
GraphQL does not give it (`pod_from_graphql`), and then the lowest id decides: the same answer for every keeper
that reads the same API.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["Named", "oldest", "pick_one", "settle"]


class Named(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def created_at(self) -> str | None: ...


def oldest(items: Sequence[Named]) -> Named:
    """The one of several of one name that stays: the oldest (RunPod's createdAt), then the lowest id."""
    return min(items, key=lambda x: (x.created_at or "~", x.id))


def settle(found: Sequence[Named], discard: Callable[[str], None]) -> Named:
    """Of several of one name made at the same moment: the oldest stays, the others are discarded (one rule that
    every keeper applies, so two keepers that created at once agree on the one to keep)."""
    keep = oldest(found)
    for twin in found:
        if twin.id != keep.id:
            discard(twin.id)
    return keep


def pick_one(found: Sequence[Named], *, only: str = "", prefer: str = "") -> Named | None:
    """`only`: that id or None; else the one of the name, None when there is none; of several, `prefer` (the one
    kept so far) when it is among them, else the oldest (the one settle_twins keeps)."""
    if only:
        return next((x for x in found if x.id == only), None)
    if not found:
        return None
    return next((x for x in found if prefer and x.id == prefer), None) or oldest(found)
