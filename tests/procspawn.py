"""Real helper processes for the /proc, planner and cleanup tests: holders of fake device files,
launchers that respawn them, and synthetic process tables for the pure planning logic."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loadfactor import scaled
from podguard.preflight.cleanup.devices import find_device_files
from podguard.preflight.cleanup.process_table import ProcessTable, ProcInfo, read_stat, scan_processes

PY = sys.executable
DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3")

# A stand-in GPU process: opens the given files, optionally renames itself (prctl PR_SET_NAME),
# ignores SIGTERM, forks children that inherit the fds, then reports its pid and waits for signals.
HOLDER_SRC = r"""
import json, os, signal, sys
cfg = json.loads(sys.argv[1])
if cfg.get("comm"):
    import ctypes
    ctypes.CDLL(None).prctl(15, cfg["comm"].encode(), 0, 0, 0)
if cfg.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
fds = [os.open(p, os.O_RDONLY) for p in cfg.get("open", [])]
kids = []
for _ in range(cfg.get("fork", 0)):
    pid = os.fork()
    if pid == 0:
        while True:
            signal.pause()
    kids.append(pid)
print(json.dumps({"pid": os.getpid(), "children": kids}), flush=True)
while True:
    signal.pause()
"""

# A stand-in torchrun agent: starts a worker, restarts it whenever it dies; on SIGTERM it stops its
# worker and exits (like torchrun), or ignores SIGTERM entirely (a badly behaved launcher).
LAUNCHER_SRC = r"""
import json, os, signal, subprocess, sys, time
cfg = json.loads(sys.argv[1])
log = open(cfg["log"], "a")
worker = None
def spawn():
    p = subprocess.Popen(cfg["worker_argv"], stdout=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    p.stdout.readline()
    log.write(f"{p.pid}\n")
    log.flush()
    return p
def on_term(signum, frame):
    if worker is not None and worker.poll() is None:
        worker.terminate()
        worker.wait()
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if cfg.get("ignore_term") else on_term)
worker = spawn()
print(json.dumps({"pid": os.getpid(), "worker": worker.pid}), flush=True)
while True:
    if worker.poll() is not None:
        worker = spawn()
    time.sleep(0.005)
"""


def wait_until(pred: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll `pred` every few ms; fail the test (not hang it) after `timeout` (for an idle machine, stretched by the
    load factor: tests/loadfactor.py)."""
    end = time.monotonic() + scaled(timeout)
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state not in ("Z", "X")


class Spawner:
    """Starts stand-in processes for one test and guarantees they are all gone afterwards."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dev = root / "dev"
        self.dev.mkdir()
        for name in DEVICES:
            (self.dev / name).write_bytes(b"")
        self._popens: list[subprocess.Popen[bytes]] = []
        self._tracked: list[tuple[int, int]] = []

    def path(self, device: str) -> str:
        return str(self.dev / device)

    def track(self, pid: int) -> None:
        st = read_stat(pid)
        if st is not None:
            self._tracked.append((pid, st.start_time))

    def _start(self, argv: Sequence[str], *, argv0: str | None, new_session: bool) -> subprocess.Popen[bytes]:
        real = list(argv)
        executable = None
        if argv0 is not None:
            executable = real[0]
            real[0] = argv0
        proc = subprocess.Popen(
            real,
            executable=executable,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
        )
        self._popens.append(proc)
        self.track(proc.pid)
        return proc

    def _ready(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> dict[str, Any]:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"helper {proc.args!r} did not report ready")
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"helper {proc.args!r} exited early (rc={proc.poll()})")
        info: dict[str, Any] = json.loads(line)
        for pid in info.get("children", []):
            self.track(pid)
        if "worker" in info:
            self.track(info["worker"])
        return info

    def holder_argv(
        self, *devices: str, comm: str | None = None, ignore_term: bool = False, fork: int = 0
    ) -> list[str]:
        cfg = {"open": [self.path(d) for d in devices], "comm": comm, "ignore_term": ignore_term, "fork": fork}
        return [PY, "-S", "-c", HOLDER_SRC, json.dumps(cfg)]

    def holder(
        self,
        *devices: str,
        argv0: str | None = None,
        comm: str | None = None,
        ignore_term: bool = False,
        fork: int = 0,
        new_session: bool = False,
    ) -> tuple[int, list[int]]:
        """A process holding `devices` (names in the dev dir); returns (pid, pids of forked children)."""
        proc = self._start(
            self.holder_argv(*devices, comm=comm, ignore_term=ignore_term, fork=fork),
            argv0=argv0,
            new_session=new_session,
        )
        info = self._ready(proc)
        return info["pid"], info["children"]

    def holders(self, *specs: dict[str, Any]) -> list[tuple[int, list[int]]]:
        """Several holders started in parallel (each spec: `devices` plus `holder()`'s keywords)."""
        procs = []
        for spec in specs:
            kw = dict(spec)
            devices = kw.pop("devices")
            argv0, new_session = kw.pop("argv0", None), kw.pop("new_session", False)
            procs.append(self._start(self.holder_argv(*devices, **kw), argv0=argv0, new_session=new_session))
        return [(info["pid"], info["children"]) for info in map(self._ready, procs)]

    def launcher(
        self,
        *devices: str,
        argv0: str = "torchrun",
        ignore_term: bool = False,
        new_session: bool = False,
        extra_args: Sequence[str] = (),
    ) -> tuple[int, int, Path]:
        """A respawning launcher whose worker holds `devices`; returns (launcher, worker, worker log)."""
        log = self.root / f"workers-{len(self._popens)}.log"
        cfg = {"log": str(log), "worker_argv": self.holder_argv(*devices), "ignore_term": ignore_term}
        proc = self._start(
            [PY, "-S", "-c", LAUNCHER_SRC, json.dumps(cfg), *extra_args], argv0=argv0, new_session=new_session
        )
        info = self._ready(proc)
        return info["pid"], info["worker"], log

    def plain(self, argv: Sequence[str], *, argv0: str | None = None, new_session: bool = False) -> int:
        """A process that holds nothing (started with its fds closed); returns its pid."""
        proc = self._start(argv, argv0=argv0, new_session=new_session)
        return proc.pid

    def shell(self, script: str, *, new_session: bool = False) -> int:
        proc = self._start(["bash", "-c", script], argv0=None, new_session=new_session)
        return proc.pid

    @staticmethod
    def worker_pids(log: Path) -> list[int]:
        return [int(x) for x in log.read_text().split()] if log.exists() else []

    def close(self) -> None:
        """SIGKILL everything this test started (roots, recorded pids and their descendants), by pid."""
        table = scan_processes(self.dev, fds=False)
        targets = dict(self._tracked)
        for pid, _ in list(self._tracked):
            for d in table.descendants(pid):
                p = table.get(d)
                if p is not None:
                    targets.setdefault(d, p.start_time)
        for pid, start in targets.items():
            st = read_stat(pid)
            if st is not None and st.start_time == start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self._popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()


def synthetic(
    pid: int,
    ppid: int,
    argv: Sequence[str],
    *,
    devices: Sequence[str] = (),
    pgid: int | None = None,
    sid: int = 1,
    state: str = "S",
    uid: int = 0,
    fd_error: str | None = None,
    comm: str | None = None,
) -> ProcInfo:
    """A ProcInfo for pure rule tests (no /proc access: cmdline and uid are pre-filled)."""
    name = comm if comm is not None else os.path.basename(argv[0])[:15] if argv else "?"
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        comm=name,
        state=state,
        pgid=pid if pgid is None else pgid,
        sid=sid,
        start_time=1000 + pid,
        devices=tuple(sorted(devices)),
        fd_error=fd_error,
        _lazy={"cmdline": tuple(argv), "uid": uid},
    )


def synthetic_table(procs: Sequence[ProcInfo], dev_dir: str = "/dev") -> ProcessTable:
    return ProcessTable({p.pid: p for p in procs}, find_device_files(dev_dir), 0.0, time.monotonic())
