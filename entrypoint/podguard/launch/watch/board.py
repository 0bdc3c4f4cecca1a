"""Where the heartbeat board lives: in memory (`/dev/shm`), never on the state dir's network volume.

    placed = place_board(run_id, slots=2, fallbacks=(run_dir,))
    placed.path          # /dev/shm/podguard-hb-<run_id>, or a fallback, or None (no board: heartbeats no-op)
    placed.warnings      # one line each where a place could not take it (told once, never a traceback)
    remove_board(placed)

The board is one 32-byte slot per rank plus a 64-byte header: sized for every rank that can appear on this node
(`MIN_SLOTS`, 1024 slots, 32 KiB: CPU workers, launchers that start their own ranks), so no local rank finds
its slot missing. It is written whole at creation, so every page is allocated then: a store through the
workers' mmap can never hit a full tmpfs later (that would be SIGBUS in the training process). Where `/dev/shm`
cannot take it (missing, read-only, or full, as Docker's 64 MB default can be once NCCL and data loaders use
it), the run dir, then a temp dir, with a warning; where none can, the job runs without a board (heartbeats are
then no-ops, output lines still count as progress). docs/watch.md, "Heartbeats".
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from podguard.rank.progress import create_board

__all__ = ["MIN_SLOTS", "SHM", "PlacedBoard", "place_board", "remove_board"]

SHM = Path("/dev/shm")
MIN_SLOTS = 1024  # every local rank a launcher may start on one node (32 KiB)


@dataclass
class PlacedBoard:
    path: Path | None
    in_memory: bool = False  # under /dev/shm
    warnings: list[str] = field(default_factory=list)


def place_board(run_id: str, slots: int, fallbacks: Sequence[Path] = (), shm: Path = SHM) -> PlacedBoard:
    """Create the board in `shm`, else in the first fallback folder that takes it, else a temp dir."""
    size = max(slots, MIN_SLOTS)
    name = f"podguard-hb-{run_id}"
    placed = PlacedBoard(None)
    places = [(shm / name, True), *((p / "heartbeats", False) for p in fallbacks)]
    places.append((Path(tempfile.gettempdir()) / name, False))
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
        placed.path, placed.in_memory = path, in_memory
        if placed.warnings:
            placed.warnings[-1] += f"; it is in {path}"
        return placed
    placed.warnings.append("no heartbeat board: heartbeat() does nothing in this run (output lines still count)")
    return placed


def remove_board(placed: PlacedBoard) -> None:
    """Free the board (a /dev/shm file outlives the processes that used it; the others go too)."""
    if placed.path is not None:
        with contextlib.suppress(OSError):
            os.unlink(placed.path)
