"""Tiny readers of `/proc` shared by the preflight and the launch side (standard library only).

    read_stat(pid).pgid           # None when the process is gone
    children_of(os.getpid())      # direct children, zombies included
    environ_has(pid, b"PODGUARD_JOB_ID=123-456")

Every reader returns None / an empty result for a process that is gone or unreadable: callers decide
what "cannot tell" means for them, nothing here guesses.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

__all__ = [
    "PROC",
    "ProcStat",
    "children_of",
    "environ_has",
    "list_pids",
    "parse_stat",
    "pid_exists",
    "read_bytes",
    "read_comm",
    "read_stat",
]

PROC = "/proc"


@dataclass(frozen=True)
class ProcStat:
    """The fields of `/proc/<pid>/stat` podguard uses. `start_time` (clock ticks since boot) plus the pid
    identifies a process: a reused pid has a later start time."""

    pid: int
    comm: str
    state: str  # R S D Z T t X I ...
    ppid: int
    pgid: int
    sid: int
    flags: int
    start_time: int


def pid_exists(pid: int) -> bool:
    """A process of this pid exists (ours or another user's: EPERM means it does); a zombie counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_bytes(path: str, size: int = 4096) -> bytes:
    """Up to `size` bytes of a /proc file in one read (the kernel builds it per read call)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def parse_stat(pid: int, raw: bytes) -> ProcStat:
    """Parse the text of `/proc/<pid>/stat` (comm may itself contain ')' and spaces)."""
    text = raw.decode("utf-8", "replace")
    lpar = text.index("(")
    rpar = text.rindex(")")
    rest = text[rpar + 2 :].split()
    return ProcStat(
        pid=pid,
        comm=text[lpar + 1 : rpar],
        state=rest[0],
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        sid=int(rest[3]),
        flags=int(rest[6]),
        start_time=int(rest[19]),
    )


def read_stat(pid: int) -> ProcStat | None:
    """A fresh read of one process's stat; None when it no longer exists."""
    try:
        return parse_stat(pid, read_bytes(f"{PROC}/{pid}/stat"))
    except (OSError, ValueError, IndexError):
        return None


def read_comm(pid: int) -> str:
    """The process's short name (`comm`), or '?' when it is gone."""
    try:
        return read_bytes(f"{PROC}/{pid}/comm").decode("utf-8", "replace").strip()
    except OSError:
        return "?"


def list_pids() -> list[int]:
    """Every pid in this PID namespace right now."""
    try:
        return [int(entry) for entry in os.listdir(PROC) if entry.isdigit()]
    except OSError:
        return []


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is `pid`, zombies included (`task/*/children`, else a scan of every stat)."""
    task_dir = f"{PROC}/{pid}/task"
    try:
        tids = os.listdir(task_dir)
        first = read_bytes(f"{task_dir}/{tids[0]}/children", 1 << 16)
    except (OSError, IndexError):
        first = None
    if first is not None:  # CONFIG_PROC_CHILDREN: exact and cheap
        found = [int(p) for p in first.split()]
        for tid in tids[1:]:
            with contextlib.suppress(OSError):
                found.extend(int(p) for p in read_bytes(f"{task_dir}/{tid}/children", 1 << 16).split())
        return found
    return [p for p in list_pids() if (st := read_stat(p)) is not None and st.ppid == pid]


def environ_has(pid: int, entry: bytes) -> bool | None:
    """Whether `KEY=VALUE` (bytes) is in the process's initial environment; None when unreadable."""
    try:
        fd = os.open(f"{PROC}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while data := os.read(fd, 1 << 16):
            chunks.append(data)
    except OSError:
        return None
    finally:
        os.close(fd)
    return entry in b"".join(chunks).split(b"\0")
