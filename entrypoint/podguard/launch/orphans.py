"""The job's orphans: podguard is a child subreaper, so descendants whose parent died come back to it.

    orphans = Orphans(job_id, preexisting=set(children_of(os.getpid())))
    fresh = orphans.scan(worker_pids)        # reap exited ones; the job's live ones are `orphans.live`
    orphans.signal_all(signal.SIGTERM)

Every orphan that comes back is reaped (no zombies, also as PID 1). Live ones are the job's leftovers
(torchrun's workers in their own sessions, a dataloader, a double-forked daemon) and are stopped at the
end of the job; as PID 1 in a container only those carrying this job's `PODGUARD_JOB_ID` count. Children
the calling process had before the job are never touched, nor are podguard's own helpers started with
`start_helper` (py-spy during a hang): their owner waits for them, and a reaper that took their exit status
would turn "ptrace not allowed" into an exit 0 with no output (Popen reads a child reaped behind its back as 0).

    proc = start_helper(["py-spy", "dump", ...], stdout=out)   # never reaped by a scan
    proc.wait(); release_helper(proc)                          # (also when given up: the reaper takes it back)

Details: docs/supervisor.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Iterable
from typing import Any

from podguard.launch.process import JOB_ID_ENV
from podguard.procfs import children_of, environ_has, read_comm

__all__ = ["Orphans", "describe_pids", "release_helper", "set_subreaper", "start_helper", "stop_helpers"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_HELPERS: set[int] = set()  # podguard's own children whose owner waits for them (start_helper)
_HELPERS_LOCK = threading.Lock()  # held from fork to registration: a scan never sees an unregistered helper
SCAN_WAIT_S = 0.05  # a scan that cannot take the lock now (a helper is being started) comes back next round


def start_helper(argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start a helper process of podguard's own (any thread): the orphan reaper leaves it to the caller, who
    waits for it and then calls `release_helper`."""
    with _HELPERS_LOCK:
        proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **popen)
        _HELPERS.add(proc.pid)
    return proc


def release_helper(proc: subprocess.Popen[bytes]) -> None:
    """The caller is done with the helper (waited for it, or gave up on it: then the reaper reaps it)."""
    with _HELPERS_LOCK:
        _HELPERS.discard(proc.pid)


def stop_helpers() -> list[int]:
    """The job is over: SIGKILL the helpers still running (a py-spy that the hang's deadline gave up on) and hand
    them to the reaper. Returns their pids."""
    with _HELPERS_LOCK:
        pids = sorted(_HELPERS)
        _HELPERS.clear()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids


def set_subreaper(on: bool) -> bool | None:
    """Set PR_SET_CHILD_SUBREAPER; returns the previous value (None where prctl is unavailable)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    previous = ctypes.c_int(0)
    if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
        return None
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        return None
    return bool(previous.value)


def describe_pids(pids: Iterable[int]) -> str:
    """'123 (python), 456 (bash)'."""
    return ", ".join(f"{pid} ({read_comm(pid)})" for pid in sorted(pids))


class Orphans:
    """The job's leftover processes among this process's children (see the module docstring)."""

    def __init__(self, job_id: str, *, preexisting: Collection[int] = (), ignore: Collection[int] = ()) -> None:
        self.marker = f"{JOB_ID_ENV}={job_id}".encode()
        self.preexisting = set(preexisting)
        self.ignore = set(ignore)  # our own helpers (the watchdog): reaped by their owner, never stopped
        self.pid1 = os.getpid() == 1
        self.live: dict[int, float] = {}  # orphan pid -> when first seen
        self._outsiders: set[int] = set()  # PID 1 only: orphans that are not the job's

    def scan(self, workers: Collection[int]) -> list[int]:
        """Reap exited orphans, refresh `live`; returns the pids that are new since the last scan."""
        if not _HELPERS_LOCK.acquire(timeout=SCAN_WAIT_S):
            return []  # a helper is being started: nothing is lost by scanning next round
        try:
            return self._scan(workers, frozenset(_HELPERS))
        finally:
            _HELPERS_LOCK.release()

    def _scan(self, workers: Collection[int], helpers: frozenset[int]) -> list[int]:
        now = time.monotonic()
        alive: dict[int, float] = {}
        for pid in children_of(os.getpid()):
            preexisting = pid in self.preexisting
            if pid in workers or pid in self.ignore or pid in helpers or (preexisting and not self.pid1):
                continue
            try:
                reaped, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if reaped or preexisting or not self._is_job_process(pid):
                continue
            alive[pid] = self.live.get(pid, now)
        fresh = sorted(set(alive) - set(self.live))
        self.live = alive
        return fresh

    def _is_job_process(self, pid: int) -> bool:
        if not self.pid1 or pid in self.live:
            return True
        if pid in self._outsiders:
            return False
        ours = environ_has(pid, self.marker)
        if ours is False:
            self._outsiders.add(pid)
            return False
        return True  # ours, or unreadable (exiting): the cautious side for GPU memory

    def signal_all(self, signum: int, pids: Iterable[int] | None = None) -> None:
        for pid in list(self.live) if pids is None else pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
