"""GPU lease files: what a lease file records, how one is locked and read, and who holds which lease now.

    current_gpu_leases()   # lease key -> LeaseHolder (None when its record is unreadable)
    leased_pids()          # pid -> "pid 12 (podguard train -- python a.py) since 12:03": other live runs here

The flock is the truth; a file's content only says who holds it (docs/cleanup.md, "Leases").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from podguard.gpu.selected import SelectedGpu
from podguard.procfs import read_stat
from podguard.redact import redact_text
from podguard.state import flock_supported, local_lock_dir, open_lock, state_dir, subdir, try_flock

__all__ = [
    "LeaseHolder",
    "card_key",
    "current_gpu_leases",
    "default_lease_dir",
    "gpu_lease_key",
    "is_locked",
    "leased_pids",
    "live_gpu_leases",
    "read_holder",
    "try_lock",
    "unlock",
]


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a lease, as recorded in its file (informational; the flock is the truth)."""

    pid: int
    command: str
    started: float
    host: str
    start_time: int = 0  # the holder's /proc start time: a reused pid is not the holder
    parent: str = ""  # a MIG lease: the lease key of its card

    @property
    def local(self) -> bool:
        return self.host in ("", socket.gethostname())

    def alive(self) -> bool:
        """Whether the recorded holder still runs (only answerable on its own host: True elsewhere)."""
        if not self.local:
            return True
        st = read_stat(self.pid)
        return st is not None and st.state not in ("Z", "X") and self.start_time in (0, st.start_time)

    def describe(self) -> str:
        """ "pid 1234 (podguard train -- python a.py) since 12:03" """
        text = f"pid {self.pid}"
        if not self.local:
            text += f" on {self.host}"
        if self.command:
            text += f" ({self.command})"
        if self.started:
            lt = time.localtime(self.started)
            fmt = "%H:%M" if time.strftime("%Y-%m-%d", lt) == time.strftime("%Y-%m-%d") else "%Y-%m-%d %H:%M"
            text += f" since {time.strftime(fmt, lt)}"
        return text


def read_holder(path: Path) -> LeaseHolder | None:
    """The recorded holder, or None when the record is missing, torn, or names a dead local process."""
    try:
        data = json.loads(path.read_text(errors="replace") or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    holder = LeaseHolder(
        pid=data["pid"],
        command=str(data.get("command") or ""),
        started=float(data.get("started") or 0.0),
        host=str(data.get("host") or ""),
        start_time=int(data.get("start") or 0),
        parent=str(data.get("parent") or ""),
    )
    return holder if holder.alive() else None  # a dead holder's record while a new one takes the lock


def record_bytes(command: str, parent: str) -> bytes:
    st = read_stat(os.getpid())
    record = {
        "pid": os.getpid(),
        "start": st.start_time if st else 0,
        "command": redact_text(command),
        "started": time.time(),
        "host": socket.gethostname(),
        "parent": parent,
    }
    return json.dumps(record).encode() + b"\n"


def try_lock(path: Path, command: str, *, shared: bool = False, parent: str = "") -> int | None:
    """Lock `path` without blocking (and, exclusive, record ourselves in it); the fd, or None when held.
    A file we may not open is another user's lease: held."""
    try:
        fd = open_lock(path)
    except PermissionError:
        return None
    try:
        got = try_flock(fd, shared=shared)
    except BaseException:
        os.close(fd)
        raise
    if not got:
        os.close(fd)
        return None
    if not shared:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, record_bytes(command, parent), 0)
    return fd


def unlock(fd: int, shared: bool) -> None:
    if not shared:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # the next reader must not see us as the holder
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the only fd of the open file description drops the flock


def default_lease_dir() -> Path:
    """`<state dir>/leases`; a host-local folder when that filesystem has no flock (some network volumes),
    so that leases still work (all runs on the host make the same choice)."""
    base = subdir(state_dir(), "leases")
    return base if flock_supported(base) else local_lock_dir("leases")


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def gpu_lease_key(gpu: SelectedGpu) -> str:
    """The lease file name of a GPU: its UUID (MIG UUID for a MIG device), else index@hostname."""
    if gpu.visible_id.startswith("MIG-"):
        return safe_name(gpu.visible_id)
    if gpu.uuid:
        return safe_name(gpu.uuid)
    return safe_name(f"index-{gpu.index}@{socket.gethostname()}")


def card_key(gpu: SelectedGpu) -> str | None:
    """For a MIG device, the lease key of its whole card (held shared); None for a whole GPU."""
    if gpu.visible_id.startswith("MIG-") and gpu.uuid:
        return safe_name(gpu.uuid)
    return None


# --------------------------------------------------------------------------------------------------
# Who holds what right now


def lease_dirs(lease_dir: Path | None) -> list[Path]:
    """Where GPU leases are: the given dir, else the one every run on this host chooses (default_lease_dir)."""
    return [(lease_dir if lease_dir is not None else default_lease_dir()) / "gpus"]


def current_gpu_leases(lease_dir: Path | None = None, *, skip: Collection[Path] = ()) -> dict[str, LeaseHolder | None]:
    """Lease key -> holder for every GPU lease held right now (the files in `skip`, our own, left out)."""
    out: dict[str, LeaseHolder | None] = {}
    for gdir in lease_dirs(lease_dir):
        if not gdir.is_dir():
            continue
        for path in sorted(gdir.glob("*.lock")):
            if path not in skip and is_locked(path):
                out[path.stem] = read_holder(path)
    return out


def live_gpu_leases(
    lease_dir: Path | None = None, *, exclude_pid: int | None = None, skip: Collection[Path] = ()
) -> dict[str, LeaseHolder]:
    """The leases held by a live podguard run on this host (other than `exclude_pid`), by lease key.
    (`read_holder` already dropped records of dead local holders.)"""
    me = os.getpid() if exclude_pid is None else exclude_pid
    leases = current_gpu_leases(lease_dir, skip=skip)
    return {key: h for key, h in leases.items() if h is not None and h.local and h.pid != me}


def leased_pids(lease_dir: Path | None = None, *, exclude_pid: int | None = None) -> dict[int, str]:
    """pid -> description of every other live podguard run on this host that holds a GPU lease: a
    cleanup never touches those runs nor anything they started."""
    return {h.pid: h.describe() for h in live_gpu_leases(lease_dir, exclude_pid=exclude_pid).values()}


def is_locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return not try_flock(fd, shared=True)
    except OSError:
        return False
    finally:
        os.close(fd)  # also drops the shared probe lock
