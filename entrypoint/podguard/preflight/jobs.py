"""Other podguard runs on this host, seen through their GPU leases: whose processes a cleanup must never touch,
which GPUs `podguard cleanup` skips, and which GPUs `podguard health` finds in use by their own job.

    found = leased_elsewhere(selection)
    found.pids     # {1234: "pid 1234 (podguard train -- python a.py) since 12:03"}
    found.in_use   # {0: "pid 1234 (...), alive"}: every selected device of GPU 0 is leased by a live run
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from podguard.gpu.selected import SelectedGpu, Selection
from podguard.preflight.leases import gpu_lease_key, live_gpu_leases

__all__ = ["LeasedElsewhere", "leased_elsewhere"]


@dataclass(frozen=True)
class LeasedElsewhere:
    pids: dict[int, str] = field(default_factory=dict)  # lease holder pid -> description
    gpus: frozenset[SelectedGpu] = frozenset()  # selected GPUs (or MIG devices) another live run leases
    in_use: dict[int, str] = field(default_factory=dict)  # GPU index -> its job, when all of it is leased
    notes: tuple[str, ...] = ()


def leased_elsewhere(
    selection: Selection, lease_dir: Path | None = None, *, own: Collection[Path] = ()
) -> LeasedElsewhere:
    """What other live podguard runs on this host hold (this process's own leases, the files `own`, excluded)."""
    live = live_gpu_leases(lease_dir, skip=own)
    if not live:
        return LeasedElsewhere()
    pids = {h.pid: h.describe() for h in live.values()}
    leased: set[SelectedGpu] = set()
    notes: list[str] = []
    for gpu in selection.gpus:
        holder = live.get(gpu_lease_key(gpu))
        if holder is not None:
            leased.add(gpu)
            notes.append(f"GPU {gpu.index} skipped: leased by {holder.describe()}")
    in_use: dict[int, str] = {}
    for index in dict.fromkeys(selection.indices):
        devices = [g for g in selection.gpus if g.index == index]
        if devices and all(g in leased for g in devices):
            holder = live[gpu_lease_key(devices[0])]
            in_use[index] = f"podguard run {holder.describe()}, alive"
    return LeasedElsewhere(pids, frozenset(leased), in_use, tuple(notes))
