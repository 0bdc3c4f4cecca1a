"""A cross-rank lock for heavy imports and kernel compiles (eight ranks importing at once can run the
host out of memory), released by the kernel however its holder dies.

    with serialized("import", slots=2):   # at most two ranks of this host in here at a time
        import deepspeed

The lock files live in `<state dir>/locks/<host>/` (pods sharing a volume do not wait for each other);
where the volume has no flock, in a host-local folder. Why flock, O_CLOEXEC and the at-fork hook:
docs/lifecycle.md.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.rank._env import current_rank, emit
from podguard.state import (
    NoFlock,
    flock_supported,
    host_id,
    local_lock_dir,
    lock_blocking,
    open_lock,
    state_dir,
    subdir,
    try_flock,
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HELD_FDS: set[int] = set()


def _close_held_in_child() -> None:
    for fd in list(_HELD_FDS):
        with suppress(OSError):
            os.close(fd)
    _HELD_FDS.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


@dataclass(frozen=True)
class LockHold:
    """What `serialized` handed out: which slot, and how long it took to get it."""

    name: str
    slot: int
    path: Path
    waited_s: float


def lock_dir_default() -> Path:
    """`<state dir>/locks/<host>`: shared by every rank of this host, not by other pods on the volume."""
    return subdir(subdir(state_dir(), "locks"), host_id())


def _usable(directory: Path, rank: int, log: bool) -> Path:
    """`directory`, or a host-local one when its filesystem refuses flock (ENOLCK on some NFS mounts)."""
    directory.mkdir(parents=True, exist_ok=True)
    return directory if flock_supported(directory) else _fallback(directory, rank, log)


def _fallback(directory: Path, rank: int, log: bool) -> Path:
    fallback = local_lock_dir("locks")
    if log:
        emit(f"[rank {rank}] LOCK: {directory} has no file locks (a network volume?); using {fallback}")
    return fallback


def _open(path: Path) -> int:
    try:
        return open_lock(path)
    except PermissionError:  # another user's lock file: flock works on a read-only fd too
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


@contextmanager
def serialized(
    name: str = "import",
    slots: int = 1,
    *,
    lock_dir: str | os.PathLike[str] | None = None,
    timeout_s: float | None = None,
    log: bool = True,
) -> Iterator[LockHold]:
    """Hold one of `slots` slots of the lock `name` for the duration of the `with` block.

    `slots=1` serializes; `slots=N` lets N processes through at once (e.g. half the ranks importing
    while the others wait). Logs `[rank R] LOCK: waiting` (only when it has to), `acquired` with the
    wait time, and `released` with the hold time. With `timeout_s`, giving up raises PodguardError with
    exit code 75 (a retry may succeed) naming who holds the lock.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UsageError(
            f"lock name {name!r} is not valid; use 1-64 letters, digits, '.', '_' or '-' (starting alphanumeric)"
        )
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise UsageError(f"lock slots={slots!r} is not valid; it must be an integer >= 1")
    if timeout_s is not None and not timeout_s >= 0:
        raise UsageError(f"lock timeout_s={timeout_s!r} is not valid; it must be >= 0 or None (wait forever)")
    rank = current_rank()
    directory = _usable(Path(lock_dir) if lock_dir is not None else lock_dir_default(), rank, log)
    try:
        fd, slot, waited = _acquire(directory, name, slots, timeout_s, rank, log)
    except NoFlock:  # the probe passed but the lock itself was refused: once more, host-locally
        directory = _fallback(directory, rank, log)
        fd, slot, waited = _acquire(directory, name, slots, timeout_s, rank, log)
    path = directory / f"{name}.{slot}.lock"
    acquired_at = time.monotonic()
    _HELD_FDS.add(fd)
    _write_holder(fd, rank)
    if log:
        emit(f"[rank {rank}] LOCK: acquired {name!r} slot {slot}/{slots} after waiting {waited:.2f}s")
    try:
        yield LockHold(name=name, slot=slot, path=path, waited_s=waited)
    finally:
        _HELD_FDS.discard(fd)
        with suppress(OSError):
            os.ftruncate(fd, 0)
        with suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        if log:
            emit(f"[rank {rank}] LOCK: released {name!r} slot {slot} (held {time.monotonic() - acquired_at:.2f}s)")


def _acquire(
    directory: Path, name: str, slots: int, timeout_s: float | None, rank: int, log: bool
) -> tuple[int, int, float]:
    """Take a free slot. Tries every slot without blocking (starting at rank % slots so ranks spread
    out); when all are taken, blocks in the kernel for a single slot with no deadline (the fastest
    hand-over), otherwise polls with a short capped backoff until the deadline."""
    start = time.monotonic()
    order = [(rank + i) % slots for i in range(slots)]
    fds: dict[int, int] = {}
    try:
        for slot in order:
            fds[slot] = _open(directory / f"{name}.{slot}.lock")
        got = _try_all(fds, order)
        if got is None:
            if log:
                emit(
                    f"[rank {rank}] LOCK: waiting for {name!r} ({slots} slot{'s' if slots > 1 else ''}, "
                    f"held by {_holders(fds)})"
                )
            if slots == 1 and timeout_s is None:
                lock_blocking(fds[0])
                got = 0
            else:
                deadline = None if timeout_s is None else start + timeout_s
                delay = 0.005
                while got is None:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise PodguardError(
                            f"lock {name!r} in {directory} not acquired within {timeout_s}s (held by {_holders(fds)})",
                            ExitCode.GPUS_BUSY,
                        )
                    pause = delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
                    time.sleep(pause)
                    delay = min(delay * 2, 0.05)
                    got = _try_all(fds, order)
        fd = fds.pop(got)
        return fd, got, time.monotonic() - start
    finally:
        for other in fds.values():
            os.close(other)


def _try_all(fds: dict[int, int], order: list[int]) -> int | None:
    for slot in order:
        if try_flock(fds[slot]):
            return slot
    return None


def _write_holder(fd: int, rank: int) -> None:
    """Record who holds the slot, so a waiter can say whom it waits for. Informational only: the lock
    itself is the flock, and a dead holder's leftover text is harmless."""
    info = {"pid": os.getpid(), "rank": rank, "host": os.uname().nodename, "since": time.time()}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError:
        pass


def _holders(fds: dict[int, int]) -> str:
    found = []
    for fd in fds.values():
        try:
            info = json.loads(os.pread(fd, 4096, 0) or b"{}")
            found.append(f"pid {info['pid']} rank {info['rank']}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return ", ".join(found) or "another process"
