"""Where the heartbeat board lives: in memory (`/dev/shm`), never on the state dir's network volume.

    placed = place_board(run_id, slots=2, fallbacks=(run_dir,))
    placed.path          # /dev/shm/podguard-hb-<run_id>, or a fallback, or None (no board: heartbeats no-op)
    placed.warnings      # one line each where a place could not take it (told once, never a traceback)
    beats = read_placed(placed)   # through the run's own fd: a board unlinked under the run still reads
    remove_board(placed)

The board is one 32-byte slot per rank (and one 32-byte busy slot: podguard.rank.busy) plus a 64-byte header: sized
for every rank that can appear on this node (`MIN_SLOTS`, 1024 slots, 64 KiB: CPU workers, launchers that start their
own ranks), so no local rank finds
its slot missing. It is written whole at creation, so every page is allocated then: a store through the
workers' mmap can never hit a full tmpfs later (that would be SIGBUS in the training process). Where `/dev/shm`
cannot take it (missing, read-only, or full, as Docker's 64 MB default can be once NCCL and data loaders use
it), the run dir, then a temp dir, with a warning; where none can, the job runs without a board (heartbeats are
then no-ops, output lines still count as progress). The run holds an flock on its board while it runs; a board
that nobody holds and that is older than a minute was left by a run that was killed (SIGKILL, OOM): each run
removes those before it places its own, so leftovers never pile up in `/dev/shm`. docs/watch.md, "Heartbeats".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from podguard.rank.progress import Beat, Busy, create_board, read_slots

__all__ = [
    "MIN_SLOTS",
    "SHM",
    "PlacedBoard",
    "place_board",
    "read_placed",
    "read_placed_slots",
    "remove_board",
    "remove_stale",
]

SHM = Path("/dev/shm")
MIN_SLOTS = 1024  # every local rank a launcher may start on one node (64 KiB with the busy slots)
PREFIX = "podguard-hb-"
STALE_AFTER_S = 60.0  # a board nobody holds is a killed run's only past this age (a starting run locks at once)


@dataclass
class PlacedBoard:
    path: Path | None
    in_memory: bool = False  # under /dev/shm
    warnings: list[str] = field(default_factory=list)
    lock: int | None = None  # an fd holding an flock on the board while the run lives (see remove_stale)


def place_board(run_id: str, slots: int, fallbacks: Sequence[Path] = (), shm: Path = SHM) -> PlacedBoard:
    """Create the board in `shm`, else in the first fallback folder that takes it, else a temp dir."""
    size = max(slots, MIN_SLOTS)
    name = f"{PREFIX}{run_id}"
    placed = PlacedBoard(None)
    places = [(shm / name, True), *((p / "heartbeats", False) for p in fallbacks)]
    places.append((Path(tempfile.gettempdir()) / name, False))
    for folder in (shm, Path(tempfile.gettempdir())):
        remove_stale(folder)
    for path, in_memory in places:
        try:
            if not in_memory:  # (never create /dev/shm itself: that would be a folder on the disk)
                path.parent.mkdir(parents=True, exist_ok=True)
            create_board(path, size)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.unlink()
            placed.warnings.append(f"cannot create the heartbeat board in {path.parent} ({exc.strerror or exc})")
            continue
        placed.path, placed.in_memory, placed.lock = path, in_memory, _hold(path)
        if placed.warnings:
            placed.warnings[-1] += f"; it is in {path}"
        return placed
    placed.warnings.append("no heartbeat board: heartbeat() does nothing in this run (output lines still count)")
    return placed


def read_placed(placed: PlacedBoard | None) -> dict[int, Beat]:
    """The board's beats, read through the run's own fd (a board unlinked under the run still reads)."""
    return read_placed_slots(placed)[0]


def read_placed_slots(placed: PlacedBoard | None) -> tuple[dict[int, Beat], dict[int, Busy]]:
    """The board's beats and busy announcements (podguard.rank.busy), from one read (see `read_placed`)."""
    if placed is None or placed.path is None:
        return {}, {}
    return read_slots(placed.lock if placed.lock is not None else placed.path)


def remove_board(placed: PlacedBoard) -> None:
    """Free the board (a /dev/shm file outlives the processes that used it; the others go too)."""
    if placed.path is not None:
        with contextlib.suppress(OSError):
            os.unlink(placed.path)
    if placed.lock is not None:
        with contextlib.suppress(OSError):
            os.close(placed.lock)
        placed.lock = None


def _hold(path: Path) -> int | None:
    """An flock on the board for as long as this process lives (the kernel drops it when it dies)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def remove_stale(folder: Path, older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the boards in `folder` that no live run holds (flock) and that are older than `older_than_s`: a
    killed run's. Works across PID namespaces (containers sharing /dev/shm), where a pid says nothing."""
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for path in folder.glob(f"{PREFIX}*"):
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    if time.time() - os.fstat(fd).st_mtime < older_than_s:
                        continue  # a run that is starting: it locks its board at once
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError: a live run holds it
                    os.unlink(path)
                    removed.append(path)
                finally:
                    os.close(fd)
    return removed
