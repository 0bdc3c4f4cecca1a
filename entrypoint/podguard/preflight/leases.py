"""GPU leases: concurrent podguard runs on one host get disjoint GPUs, and a run's processes are known.

    with acquire_gpus(selection.gpus, explicit=True, command="podguard train -- python a.py") as lease:
        ...                                 # run the job; the locks drop when podguard dies, however it dies

A lease is a flock on `<state dir>/leases/gpus/<uuid>.lock` (see `lease_files`). A MIG lease also holds its
card's file shared and a whole-GPU lease holds it exclusively, so the two conflict. Why flocks: docs/cleanup.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.gpu.selected import SelectedGpu, Selection
from podguard.preflight.lease_files import (
    LeaseHolder,
    card_key,
    current_gpu_leases,
    default_lease_dir,
    gpu_lease_key,
    is_locked,
    leased_pids,
    live_gpu_leases,
    read_holder,
    try_lock,
    unlock,
)
from podguard.state import NoFlock, holder_command, local_lock_dir

__all__ = [
    "GpuLease",
    "LeaseHolder",
    "acquire_gpus",
    "current_gpu_leases",
    "default_lease_dir",
    "gpu_lease_key",
    "leased_pids",
    "live_gpu_leases",
]

_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5
_PROGRESS_EVERY_S = 10.0


# --------------------------------------------------------------------------------------------------
# Holding and releasing


class GpuLease:
    """The GPUs this run holds. A context manager; `release()` is idempotent.

    Holding the object keeps the locks; the kernel drops them when the process dies.
    """

    def __init__(self, gpus: Sequence[SelectedGpu], locks: Sequence[tuple[int, bool]], paths: Sequence[Path]) -> None:
        self.gpus: tuple[SelectedGpu, ...] = tuple(gpus)
        self.paths: tuple[Path, ...] = tuple(paths)
        self._locks: list[tuple[int, bool]] = list(locks)

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    @property
    def held(self) -> bool:
        return bool(self._locks) or not self.gpus

    def restrict(self, selection: Selection) -> Selection:
        """The selection narrowed to the leased GPUs, in the selection's order."""
        keys = {gpu_lease_key(g) for g in self.gpus}
        return dataclasses.replace(selection, gpus=tuple(g for g in selection.gpus if gpu_lease_key(g) in keys))

    def release(self) -> None:
        locks, self._locks = self._locks, []
        for fd, shared in locks:
            unlock(fd, shared)

    def __enter__(self) -> GpuLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"GpuLease(indices={self.indices}, held={self.held})"


Busy = list[tuple[SelectedGpu, LeaseHolder | None]]


class _Locker:
    """Takes the locks of single GPUs in one lease dir, and says who holds the ones it cannot get."""

    def __init__(self, gdir: Path, command: str) -> None:
        self.gdir = gdir
        self.command = command

    def path(self, key: str) -> Path:
        return self.gdir / f"{key}.lock"

    def lock(self, gpu: SelectedGpu) -> tuple[list[tuple[int, bool]] | None, LeaseHolder | None]:
        """([(fd, shared), ...], None) when `gpu` is ours now, else (None, its holder if known).

        A holder that has not written its record yet is retried for ~30 ms before being reported unknown."""
        key, card = gpu_lease_key(gpu), card_key(gpu)
        for attempt in range(4):
            fd = try_lock(self.path(key), self.command, parent=card or "")
            if fd is not None:
                if card is None:
                    return [(fd, False)], None
                shared = try_lock(self.path(card), self.command, shared=True)
                if shared is not None:
                    return [(fd, False), (shared, True)], None
                unlock(fd, False)
                holder = read_holder(self.path(card))  # the whole card is leased
            else:
                holder = read_holder(self.path(key)) or (self._mig_holder(key) if card is None else None)
            if holder is not None:
                return None, holder
            if attempt < 3:
                time.sleep(0.01)
        return None, None

    def _mig_holder(self, card: str) -> LeaseHolder | None:
        """Who holds a MIG device of `card` (its file is then held shared, with no record of its own)."""
        for path in sorted(self.gdir.glob("MIG-*.lock")):
            holder = read_holder(path)
            if holder is not None and holder.parent == card and is_locked(path):
                return holder
        return None

    def lock_all(self, gpus: Sequence[SelectedGpu]) -> tuple[list[tuple[int, bool]] | None, Busy]:
        """Every GPU of `gpus` (in order) or none."""
        got: list[tuple[int, bool]] = []
        busy: Busy = []
        for gpu in gpus:
            locks, holder = self.lock(gpu)
            if locks is None:
                busy.append((gpu, holder))
            else:
                got += locks
        if busy:
            for fd, shared in got:
                unlock(fd, shared)
            return None, busy
        return got, []


def _label(gpus: Sequence[SelectedGpu]) -> str:
    idx = ", ".join(str(g.index) for g in gpus)
    return f"GPU {idx}" if len(gpus) == 1 else f"GPUs {idx}"


def _busy_text(busy: Busy) -> str:
    parts = []
    for gpu, holder in busy:
        who = holder.describe() if holder else "another process (no record)"
        parts.append(f"GPU {gpu.index} is leased by {who}")
    return "; ".join(parts)


def _check_counts(cands: list[SelectedGpu], count: int | None, explicit: bool, timeout_s: float | None) -> int:
    if explicit:
        if count is not None and count != len(cands):
            raise UsageError(
                f"{count} GPUs requested but {len(cands)} named explicitly ({_label(cands)}); "
                "name exactly the GPUs to use"
            )
        need = len(cands)
    else:
        need = len(cands) if count is None else count
        if need < 0:
            raise UsageError(f"GPU count {need} is invalid; expected a number >= 0")
        if need > len(cands):
            raise PodguardError(
                f"{need} GPUs needed but this node offers {len(cands)}" + (f" ({_label(cands)})" if cands else ""),
                ExitCode.GPUS_MISSING,
            )
    if timeout_s is not None and timeout_s < 0:
        raise UsageError(f"GPU wait timeout {timeout_s} is invalid; expected seconds >= 0")
    return need


def _try_once(locker: _Locker, cands: list[SelectedGpu], need: int, explicit: bool) -> tuple[GpuLease | None, Busy]:
    if explicit:
        ordered = sorted(cands, key=gpu_lease_key)  # one global order: no lock-order deadlocks
        locks, busy = locker.lock_all(ordered)
        if locks is not None:
            return GpuLease(cands, locks, [locker.path(gpu_lease_key(g)) for g in cands]), []
        return None, busy
    got: list[tuple[SelectedGpu, list[tuple[int, bool]]]] = []
    busy = []
    for g in cands:  # tried one by one, so nothing is ever waited on while held
        locks, holder = locker.lock(g)
        if locks is None:
            busy.append((g, holder))
            continue
        got.append((g, locks))
        if len(got) == need:
            gpus = [gpu for gpu, _ in got]
            return GpuLease(gpus, [lk for _, ls in got for lk in ls], [locker.path(gpu_lease_key(x)) for x in gpus]), []
    for _, locks in got:
        for fd, shared in locks:
            unlock(fd, shared)
    return None, busy


def _gpu_dir(lease_dir: Path | None) -> Path:
    gdir = (lease_dir if lease_dir is not None else default_lease_dir()) / "gpus"
    gdir.mkdir(parents=True, exist_ok=True)
    return gdir


def acquire_gpus(
    candidates: Sequence[SelectedGpu],
    count: int | None = None,
    *,
    explicit: bool,
    wait: bool = False,
    timeout_s: float | None = None,
    lease_dir: Path | None = None,
    command: str | None = None,
) -> GpuLease:
    """Lease GPUs for this run.

    explicit=True (GPU_LIST / CUDA_VISIBLE_DEVICES named them): all `candidates`, exactly; `count`, if
    given, must equal their number. explicit=False: the first `count` (default: all) free candidates,
    so concurrent runs end up on disjoint sets. When they are not free: refuse at once with exit 75
    naming the holders (wait=False), or poll with backoff, saying how the wait goes (a console line when the
    holders change, and every few seconds), until they are (wait=True) or `timeout_s` passes (None = no limit),
    then exit 75.
    No candidates (a CPU-only run) gives an empty lease.
    """
    cands = list(dict.fromkeys(candidates))
    need = _check_counts(cands, count, explicit, timeout_s)
    if need == 0:
        return GpuLease((), (), ())
    locker = _Locker(_gpu_dir(lease_dir), command or holder_command())
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    delay = _POLL_FIRST_S
    last_report, last_text = -_PROGRESS_EVERY_S, ""
    while True:
        try:
            lease, busy = _try_once(locker, cands, need, explicit)
        except NoFlock:  # this volume has no flock: lock host-locally (all runs here do the same)
            if lease_dir is not None or locker.gdir.parent == local_lock_dir("leases"):
                raise
            locker = _Locker(_gpu_dir(local_lock_dir("leases")), locker.command)
            continue
        if lease is not None:
            return lease
        now = time.monotonic()
        text = _busy_text(busy)
        if not explicit:
            text = f"{need} free GPUs needed, {len(cands) - len(busy)} of {len(cands)} free: {text}"
        if not wait:
            hint = "or choose other GPUs with GPU_LIST" if explicit else "or ask for fewer GPUs"
            raise PodguardError(f"{text}; wait for them with --wait-for-gpus, {hint}", ExitCode.GPUS_BUSY)
        if deadline is not None and now >= deadline:
            raise PodguardError(
                f"still busy after waiting {now - start:.0f}s: {text}; a retry may succeed once they are released",
                ExitCode.GPUS_BUSY,
            )
        if text != last_text or now - last_report >= _PROGRESS_EVERY_S:
            console.say(
                f"waiting for GPUs ({now - start:.0f}s{'' if timeout_s is None else f' of {timeout_s:.0f}s'}): {text}"
            )
            last_report, last_text = now, text
        time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - now)))
        delay = min(delay * 1.5, _POLL_MAX_S)
