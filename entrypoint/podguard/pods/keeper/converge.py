"""Converge on exactly one: of what one listing shows of a name, which pod (cluster) the keeper keeps (pure, no I/O).

    plan = converge([Seen("a", PodStatus.RUNNING, owned=True, created_at="...", runs=True), ...], kept="a")
    plan.keep, plan.surplus, plan.strangers, plan.unknown, plan.missing

Level-triggered, like a Kubernetes controller: each poll lists the name and the plan follows from what is there,
never from what the keeper remembers having sent. Only pods (clusters) that carry podguard's mark for the name (or
that the user adopted) are the keeper's: strangers are never touched, and one whose owner is not known yet (a
cluster whose members are not listed yet) is waited for, never duplicated. Of the keeper's own, one is kept: the one
it kept before while that one is not in ERROR, else one that runs (the oldest of those), else one that is not in
ERROR (the oldest: one booting), else the one kept before, else the oldest; every other one is surplus (a create
that landed late, a twin made by another actor at the same moment) and is terminated. None of its own (and none
unknown): the name is missing, and it is made again while the intent is "kept" (decide.py says how: the first
create, or a replacement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from podguard.pods.pod import PodStatus

__all__ = ["Plan", "Seen", "converge", "pick"]


@dataclass(frozen=True)
class Seen:
    """One pod (cluster) of the name, as one listing shows it."""

    id: str
    status: PodStatus  # a cluster: its aggregate status
    owned: bool | None  # podguard's mark for the name (or adopted); None: not known yet
    created_at: str | None = None
    runs: bool = False  # RUNNING with its container (a cluster: every node RUNNING)


@dataclass(frozen=True)
class Plan:
    keep: str  # the one kept ("" when none is the keeper's)
    surplus: tuple[str, ...] = ()  # the keeper's own beyond the one: terminated
    strangers: tuple[str, ...] = ()  # of the name, not the keeper's: never touched
    unknown: tuple[str, ...] = ()  # of the name, owner not known yet: waited for
    missing: bool = False  # none of the keeper's and none unknown: made again while the intent is "kept"


def _age(seen: Seen) -> tuple[bool, str, str]:
    """Oldest first by REST v2's createdAt (ISO 8601 sorts as text); none known (GraphQL): after those, by id."""
    return (seen.created_at is None, seen.created_at or "", seen.id)


def pick(mine: Sequence[Seen], kept: str) -> Seen:
    """The one of the keeper's own that stays (see the module docstring); `mine` is not empty."""
    before = next((s for s in mine if s.id == kept), None)
    if before is not None and before.status is not PodStatus.ERROR:
        return before
    running = [s for s in mine if s.runs]
    if running:
        return min(running, key=_age)
    healthy = [s for s in mine if s.status is not PodStatus.ERROR]
    if healthy:
        return min(healthy, key=_age)
    if before is not None:
        return before
    return min(mine, key=_age)


def converge(seen: Sequence[Seen], *, kept: str) -> Plan:
    """The plan for one listing of the name; `kept` is the id the keeper kept so far ("" when none)."""
    present = [s for s in seen if s.status is not PodStatus.TERMINATED]
    strangers = tuple(s.id for s in present if s.owned is False)
    unknown = tuple(s.id for s in present if s.owned is None)
    mine = [s for s in present if s.owned]
    if not mine:
        return Plan("", (), strangers, unknown, missing=not unknown)
    keep = pick(mine, kept)
    surplus = tuple(s.id for s in mine if s.id != keep.id)
    return Plan(keep.id, surplus, strangers, unknown, missing=False)
