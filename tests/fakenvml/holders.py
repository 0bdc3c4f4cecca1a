"""Start real stand-in GPU processes (see gpuproc.py) and keep track of them for teardown.

Why: the cleanup and gate tests need real holders with real PIDs, real open device files and real signal
behaviour (ignoring SIGTERM, a forked child that inherits the device files, a `torchrun`-like launcher
that respawns its worker). `spawn_gpu_holder` returns only once the process is ready (it polls a ready
file the process writes atomically), so tests never sleep blindly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

try:
    from loadfactor import scaled
except ImportError:  # `python -m tests.fakenvml.build` from the repo root: tests/ is not on sys.path there
    from tests.loadfactor import scaled

from .gpuproc import proc_start_time, read_ready

GPUPROC = Path(__file__).with_name("gpuproc.py")


def pid_alive(pid: int, start: int | None = None) -> bool:
    """Alive and not a zombie; with `start`, also the same process (not a recycled PID)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X", b"x"):
        return False
    return start is None or int(fields[19]) == start


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.002) -> bool:
    """Poll `predicate()` until true or `timeout` (no blind sleeps: small steps, bounded). The timeout is a deadline
    for an idle machine, stretched by the load factor (tests/loadfactor.py)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class GpuHolder(subprocess.Popen):  # type: ignore[type-arg]
    """The Popen of a stand-in GPU process, plus what it reported when ready.

    * `holder_pid`: the process that holds the GPU and is registered with NVML (the worker for a
      launcher, else the process itself).
    * `child_pid`: the forked DataLoader-like child (fork_child_holder=True), else None.
    * `worker_pids()`: every worker a launcher has started so far (respawns included), oldest first.
    """

    ready_file: Path
    ready_info: dict[str, str]
    holder_pid: int
    child_pid: int | None
    _starts: dict[int, int]

    def _load_ready(self) -> None:
        self.ready_info = read_ready(self.ready_file)
        self._starts = {self.pid: int(self.ready_info["start"])}
        self.child_pid = int(self.ready_info["child"]) if "child" in self.ready_info else None
        if self.child_pid:
            self._starts[self.child_pid] = int(self.ready_info["child_start"])
        worker = self.ready_info.get("worker")
        self.holder_pid = int(worker) if worker else self.pid
        for pid, start in self._workers():
            self._starts[pid] = start

    def _workers(self) -> list[tuple[int, int]]:
        path = self.ready_file.with_name(self.ready_file.name + ".workers")
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            pid, _, start = line.partition(" ")
            if pid and start:
                out.append((int(pid), int(start)))
        return out

    def worker_pids(self) -> list[int]:
        workers = self._workers()
        for pid, start in workers:
            self._starts.setdefault(pid, start)
        return [pid for pid, _ in workers]

    def current_worker_pid(self) -> int | None:
        pids = self.worker_pids()
        return pids[-1] if pids else None

    def wait_for_respawn(self, old_pid: int, timeout: float = 5.0) -> int:
        """Wait until the launcher has started a worker other than `old_pid`; return its PID."""
        found: list[int] = []

        def respawned() -> bool:
            pid = self.current_worker_pid()
            if pid is not None and pid != old_pid:
                found.append(pid)
                return True
            return False

        if not wait_until(respawned, timeout):
            raise TimeoutError(f"launcher {self.pid} did not respawn worker {old_pid} within {timeout}s")
        return found[0]

    def known_pids(self) -> list[int]:
        """Every process this holder started that is still the same process (start time checked)."""
        self.worker_pids()
        return [pid for pid, start in self._starts.items() if pid_alive(pid, start)]

    def kill_all(self) -> None:
        """SIGKILL the whole family (launcher first so it cannot respawn), only processes we started."""
        for pid in [self.pid] + [p for p in self._starts if p != self.pid]:
            start = self._starts.get(pid)
            if start is not None and pid_alive(pid, start):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(timeout=5)


def spawn_gpu_holder(
    gpu: int,
    mem_mib: int,
    dev_dir: Path,
    procs_dir: Path,
    *,
    ignore_sigterm: bool = False,
    register: bool = True,
    fork_child_holder: bool = False,
    child_dies_with_parent: bool = False,
    respawn_worker: bool = False,
    monitor: bool = False,
    bystander: bool = False,
    name: str | None = None,
    kind: str = "compute",
    new_session: bool = False,
    env: dict[str, str] | None = None,
    state_dir: Path | None = None,
    ready_timeout: float = 10.0,
    max_respawns: int = 50,
    grace_s: float = 1.0,
    mig: int | None = None,
    respawn_delay_s: float = 0.0,
    open_all: bool = False,
    open_delay_s: float = 0.0,
) -> GpuHolder:
    """Start a real stand-in GPU process and return once it is ready.

    gpu/mem_mib: the GPU index (device file `nvidia<gpu>`) and the memory its context uses.
    ignore_sigterm: the holder ignores SIGTERM (only SIGKILL stops it).
    register=False: holds the device files but NVML does not list it (e.g. another PID namespace).
    fork_child_holder: forks a child that inherits the device files and is not listed by NVML; the
        memory stays in use while either lives. child_dies_with_parent: the child gets PDEATHSIG.
    respawn_worker: start a launcher (argv[0] and comm `torchrun` unless `name` says otherwise) whose
        worker holds the GPU and is respawned whenever it dies.
    monitor: a process that opens only `nvidiactl` (not a GPU holder, never registered).
    bystander: a process that opens no device file at all (give it a `name` such as "sshd").
    name: argv[0] and comm (prctl) of the started process.
    mig: the MIG slot of `gpu` its context is on (NVML lists it on that MIG device).
    open_delay_s: wait this long before opening the device files (a launcher's workers too), as a training
        script does while it imports torch.
    open_all: also open every nvidia<N> (what nvmlInit does in a metrics thread or logger).
    respawn_delay_s: a launcher waits this long after its worker died before starting the next one.
    new_session: start it in a new session (setsid), as a leftover job from another shell would be.
    """
    state_dir = Path(state_dir) if state_dir else Path(procs_dir).parent / "holders"
    state_dir.mkdir(parents=True, exist_ok=True)
    ready_file = state_dir / f"holder-{uuid.uuid4().hex[:12]}.ready"
    mode = "launcher" if respawn_worker else "monitor" if monitor else "idle" if bystander else "holder"
    if name is None and respawn_worker:
        name = "torchrun"
    argv0 = name or "python"
    cmd = [
        argv0,
        "-S",
        "-E",
        str(GPUPROC),
        f"--mode={mode}",
        f"--gpu={gpu}",
        f"--mem-mib={mem_mib}",
        f"--dev-dir={dev_dir}",
        f"--procs-dir={procs_dir}",
        f"--ready-file={ready_file}",
        f"--kind={kind}",
        f"--python={sys.executable}",
        f"--max-respawns={max_respawns}",
        f"--grace-s={grace_s}",
        f"--respawn-delay-s={respawn_delay_s}",
    ]
    if name:
        cmd.append(f"--name={name}")
    if mig is not None:
        cmd.append(f"--mig={mig}")
    if open_all:
        cmd.append("--open-all")
    if open_delay_s:
        cmd.append(f"--open-delay-s={open_delay_s}")
    if ignore_sigterm:
        cmd.append("--ignore-sigterm")
    if not register:
        cmd.append("--no-register")
    if fork_child_holder:
        cmd.append("--fork-child")
    if child_dies_with_parent:
        cmd.append("--child-dies-with-parent")
    proc = GpuHolder(
        cmd,
        executable=sys.executable,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=new_session,
    )
    proc.ready_file = ready_file
    proc._starts = {}
    proc.child_pid = None
    proc.holder_pid = proc.pid
    with contextlib.suppress(OSError):
        proc._starts[proc.pid] = proc_start_time(proc.pid)
    if not wait_until(lambda: ready_file.exists() or proc.poll() is not None, ready_timeout):
        proc.kill_all()
        raise TimeoutError(f"GPU holder {proc.pid} not ready within {ready_timeout}s: {' '.join(cmd)}")
    if not ready_file.exists():
        raise RuntimeError(f"GPU holder exited early with code {proc.returncode}: {' '.join(cmd)}")
    proc._load_ready()
    return proc
