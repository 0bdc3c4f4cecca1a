"""Per-rank progress for podguard's hang watch: `heartbeat(step)` from the training loop.

    from podguard.rank import heartbeat
    for step, batch in enumerate(loader):
        ...
        heartbeat(step)          # a memory store: no system call, about a microsecond

Under `podguard train|run` the supervisor gives each worker a small shared file (PODGUARD_HEARTBEAT_FILE) with
one slot per local rank; `heartbeat()` writes its count, the step and the monotonic time into this process's
slot through an mmap, and the supervisor reads the slots on its own loop (launch/watch/hangs.py). Outside
podguard (no variable) it does nothing. The slot is PODGUARD_HEARTBEAT_SLOT, else LOCAL_RANK, else the rank of
torch.distributed's process group where the job initialised it before its first heartbeat (ranks a job starts
itself with torch.multiprocessing.spawn have neither variable), else 0. The pid is read once (and again, with
the slot, in a forked child), so a heartbeat makes no system call. A rank
that has sent a heartbeat is hung when its own heartbeats stop for `--hang-timeout`; with steps, podguard also
knows each rank's step rate (stragglers). Standard library only; never raises into the training loop.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENV_FILE", "ENV_SLOT", "Beat", "Busy", "create_board", "heartbeat", "read_board", "read_slots"]

ENV_FILE = "PODGUARD_HEARTBEAT_FILE"
ENV_SLOT = "PODGUARD_HEARTBEAT_SLOT"
MAGIC = b"PGHB0001"
HEADER = struct.Struct("<8sI")  # magic, slot count
SLOT = struct.Struct("<QqdIi")  # count, step (-1: none), time.monotonic() of the beat, pid, global rank + 1 (0: none)
SLOT_SIZE = 32
FIRST_SLOT = 64  # the header's cache line, then one 32-byte slot per rank, then one 32-byte busy slot per rank
BUSY = struct.Struct("<ddf12s")  # since (monotonic), ended (0: still busy), bound in seconds, what (UTF-8, cut)

_NO_BOARD = object()
_board: object | tuple[mmap.mmap, int, int] | None = None  # (map, slot, busy slot or -1); _NO_BOARD: none here
_count = 0
_rank1 = 0  # this process's global RANK + 1 (0: none)
_pid = 0  # this process's pid, read once (and again in a forked child): os.getpid() is a system call
_STEP_MAX = 2**63 - 1


@dataclass(frozen=True)
class Beat:
    """The newest heartbeat of one slot."""

    slot: int
    count: int  # heartbeats sent so far
    step: int | None
    at: float  # time.monotonic() of the beat (CLOCK_MONOTONIC is system-wide: comparable across processes)
    pid: int
    rank: int | None = None  # the global RANK of the process that beat (None: not under torch's launcher)

    @property
    def label(self) -> int:
        """The rank a person is told: the global rank where known, else the slot (the local rank)."""
        return self.slot if self.rank is None else self.rank


@dataclass(frozen=True)
class Busy:
    """A rank's announcement that it is saving or evaluating (podguard.rank.busy): not a hang, up to its bound."""

    slot: int
    what: str  # "saving", "evaluating" (cut to 12 bytes)
    since: float  # time.monotonic() when it began
    ended: float | None  # when it ended (None: still busy)
    max_s: float  # its bound: past since + max_s it no longer holds the clock

    def holds(self, now: float) -> bool:
        """Busy now, within its bound."""
        return self.ended is None and now < self.since + self.max_s


def create_board(path: Path, slots: int) -> Path:
    """A zeroed board of `slots` slots and as many busy slots (the supervisor makes it before the workers start)."""
    data = bytearray(FIRST_SLOT + 2 * SLOT_SIZE * max(1, slots))
    HEADER.pack_into(data, 0, MAGIC, max(1, slots))
    path.write_bytes(bytes(data))
    return path


def read_board(path: Path | int) -> dict[int, Beat]:
    """Every slot that has had a heartbeat (the supervisor's side; one read of a small file). `path` may be an fd
    open on the board: it still reads when the file was unlinked under the run (`rm /dev/shm/*` to free space)."""
    return read_slots(path)[0]


def read_slots(path: Path | int) -> tuple[dict[int, Beat], dict[int, Busy]]:
    """The heartbeats and the busy announcements, from one read of the board (see `read_board`)."""
    try:
        data = path.read_bytes() if isinstance(path, Path) else os.pread(path, os.fstat(path).st_size, 0)
    except OSError:
        return {}, {}
    if len(data) < FIRST_SLOT or data[:8] != MAGIC:
        return {}, {}
    _, slots = HEADER.unpack_from(data, 0)
    beats: dict[int, Beat] = {}
    used = min(slots, (len(data) - FIRST_SLOT) // SLOT_SIZE)
    for slot, (count, step, at, pid, rank1) in enumerate(SLOT.iter_unpack(data[FIRST_SLOT : FIRST_SLOT + used * 32])):
        if count:
            beats[slot] = Beat(slot, count, None if step < 0 else step, at, pid, rank1 - 1 if rank1 > 0 else None)
    busy: dict[int, Busy] = {}
    start = FIRST_SLOT + slots * SLOT_SIZE
    region = data[start : start + slots * BUSY.size]
    if any(region):  # (one C-level scan: nobody was ever busy on most boards)
        for slot, (since, ended, max_s, what) in enumerate(BUSY.iter_unpack(region[: len(region) // 32 * 32])):
            if since:
                text = what.rstrip(b"\0").decode("utf-8", "replace")
                busy[slot] = Busy(slot, text, since, ended or None, float(max_s))
    return beats, busy


def _open() -> object | tuple[mmap.mmap, int, int]:
    global _rank1, _pid
    _pid = os.getpid() & 0xFFFFFFFF
    path = os.environ.get(ENV_FILE)
    if not path:
        return _NO_BOARD
    rank = os.environ.get("RANK", "")
    _rank1 = int(rank) + 1 if rank.isdigit() and int(rank) < 2**31 - 1 else 0
    raw = os.environ.get(ENV_SLOT) or os.environ.get("LOCAL_RANK")
    if raw is None:  # a rank the job started itself (mp.spawn: no RANK, no LOCAL_RANK): torch's own rank, if set
        spawned = _torch_rank()
        if spawned is not None and not _rank1:
            _rank1 = spawned + 1
        raw = str(spawned or 0)
    try:
        slot = int(raw)
        with open(path, "r+b") as fh:
            mm = mmap.mmap(fh.fileno(), 0)
        magic, slots = HEADER.unpack_from(mm, 0)
    except (OSError, ValueError, struct.error):
        return _NO_BOARD
    if magic != MAGIC or not 0 <= slot < slots:
        mm.close()
        return _NO_BOARD
    busy = FIRST_SLOT + slots * SLOT_SIZE + slot * BUSY.size  # (a board without busy slots: an older podguard's)
    return mm, FIRST_SLOT + slot * SLOT_SIZE, busy if busy + BUSY.size <= len(mm) else -1


def mapped_slot() -> tuple[mmap.mmap, int, int] | None:
    """This process's board mapping, slot and busy slot (-1: none), opened on first use; None outside podguard."""
    global _board
    if _board is None:
        _board = _open()
    return None if _board is _NO_BOARD else _board  # type: ignore[return-value]


def _torch_rank() -> int | None:
    """The process group's rank where the job has torch.distributed initialised (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # never raise into a training loop
        return None
    return None


def heartbeat(step: int | None = None) -> None:
    """Tell podguard this rank made progress (optionally: which step). Cheap; a no-op outside podguard."""
    global _board, _count
    board = _board
    if board is None:
        board = _board = _open()
    if board is _NO_BOARD:
        return
    mm, offset, _ = board  # type: ignore[misc]
    _count += 1
    value = step if type(step) is int and 0 <= step <= _STEP_MAX else _step_number(step)
    try:  # noqa: SIM105 (the hot path: a try costs nothing, contextlib.suppress an object per call)
        SLOT.pack_into(mm, offset, _count, value, time.monotonic(), _pid, _rank1)
    except (ValueError, struct.error):  # the board was closed under us (interpreter shutdown): never raise
        pass


def _step_number(step: object) -> int:
    """A step that is not a plain int in range (None, a numpy int, 3.0, "abc", 2**64): its number, or -1."""
    if step is None:
        return -1
    try:
        value = int(step)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):  # not a step number: counted as a beat without one
        return -1
    return value if 0 <= value <= _STEP_MAX else -1


def _forked() -> None:
    """In a forked child: its own pid, and its own slot found again at its first heartbeat (a rank that a launcher
    forks, Lightning's `ddp_fork` or `start_processes(start_method="fork")`, is another rank than its parent)."""
    global _pid, _board
    _pid = os.getpid() & 0xFFFFFFFF
    _board = None  # (the parent's mapping stays the parent's; one open at the child's first heartbeat)


os.register_at_fork(after_in_child=_forked)


def _reset_for_tests() -> None:
    global _board, _count, _rank1, _pid
    _board, _count, _rank1, _pid = None, 0, 0, 0
