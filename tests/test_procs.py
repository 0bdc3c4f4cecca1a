"""The /proc snapshot: real processes holding stand-in NVIDIA device files in a temp dev dir.

This module also holds the small process helpers (`Spawner`) that `test_holders.py` and
`test_cleanup.py` import: real processes, real fds, real signals, and a finalizer that kills every
process a test started (by pid, after checking its start time) even when the test fails.
"""

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

import pytest

from podguard.procs import (
    ProcessTable,
    ProcInfo,
    _names_of,
    find_device_files,
    gpu_minor,
    read_stat,
    resolve_dev_dir,
    scan_processes,
)

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
    """Poll `pred` every few ms; fail the test (not hang it) after `timeout`."""
    end = time.monotonic() + timeout
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


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------


def test_scan_sees_holder_devices_tree_and_identity(spawner: Spawner) -> None:
    pid, kids = spawner.holder("nvidia0", "nvidiactl", "nvidia-uvm", fork=2)
    table = scan_processes(spawner.dev)
    p = table.get(pid)
    assert p is not None
    assert p.devices == ("nvidia-uvm", "nvidia0", "nvidiactl")
    assert p.gpu_minors == (0,)
    assert p.ppid == os.getpid()
    assert p.cmdline[:3] == (PY, "-S", "-c") and p.uid == os.geteuid()
    assert p.inspected and not p.zombie and p.start_time > 0
    for kid in kids:  # forked children inherit the fds: the evidence NVML does not give
        child = table.get(kid)
        assert child is not None and child.devices == p.devices and child.ppid == pid
    assert set(table.descendants(pid)) == set(kids)
    assert table.children(pid) == tuple(sorted(kids))
    assert set(table.holders_of_minor(0)) == {pid, *kids}
    me = table.get(os.getpid())
    assert me is not None and me.devices == ()
    chain = table.ancestors(pid)
    assert chain[0] == os.getpid() and chain[-1] == 1


def test_monitor_with_only_nvidiactl_holds_no_gpu(spawner: Spawner) -> None:
    pid, _ = spawner.holder("nvidiactl")
    p = scan_processes(spawner.dev).get(pid)
    assert p is not None and p.devices == ("nvidiactl",) and p.gpu_minors == ()


def test_same_device_under_another_path_matches_by_inode(spawner: Spawner, tmp_path: Path) -> None:
    elsewhere = tmp_path / "mnt"
    elsewhere.mkdir()
    os.link(spawner.dev / "nvidia1", elsewhere / "nvidia-gpu-1")  # same inode, other name and dir
    proc = subprocess.Popen(
        [PY, "-S", "-c", HOLDER_SRC, json.dumps({"open": [str(elsewhere / "nvidia-gpu-1")]})],
        stdout=subprocess.PIPE,
    )
    spawner._popens.append(proc)
    spawner.track(proc.pid)
    pid = spawner._ready(proc)["pid"]
    p = scan_processes(spawner.dev).get(pid)
    assert p is not None and p.devices == ("nvidia1",)


def test_dev_dir_given_through_a_symlink_still_matches(spawner: Spawner, tmp_path: Path) -> None:
    link = tmp_path / "devlink"
    link.symlink_to(spawner.dev)
    pid, _ = spawner.holder("nvidia2")
    p = scan_processes(link).get(pid)
    assert p is not None and p.devices == ("nvidia2",)


def test_dev_dir_from_environment(monkeypatch: pytest.MonkeyPatch, spawner: Spawner) -> None:
    monkeypatch.setenv("PODGUARD_DEV_DIR", str(spawner.dev))
    assert resolve_dev_dir() == spawner.dev
    assert resolve_dev_dir("/elsewhere") == Path("/elsewhere")
    monkeypatch.delenv("PODGUARD_DEV_DIR")
    assert resolve_dev_dir() == Path("/dev")
    devs = find_device_files(spawner.dev)
    assert set(devs.names) == set(DEVICES)
    assert find_device_files(spawner.root / "missing").names == ()


def test_gpu_minor_parsing() -> None:
    assert gpu_minor("nvidia0") == 0 and gpu_minor("nvidia12") == 12
    assert gpu_minor("nvidiactl") is None and gpu_minor("nvidia-uvm") is None
    assert gpu_minor("nvidia-caps/nvidia-cap1") is None


@pytest.mark.parametrize(
    ("comm", "argv", "expected"),
    [
        ("python3", ["python3", "-u", "-m", "torch.distributed.run", "--nproc-per-node=8", "t.py"],
         {"python3", "torch.distributed.run"}),
        ("jupyter-lab", ["/usr/bin/python3", "/usr/local/bin/jupyter-lab", "--ip=0.0.0.0"],
         {"python3", "jupyter-lab"}),
        ("bash", ["-bash"], {"bash"}),
        ("python3", ["/usr/bin/env", "PYTHONUNBUFFERED=1", "python3", "-X", "dev", "train.py"],
         {"env", "python3", "train.py"}),
        ("sshd", ["sleep", "100"], {"sshd", "sleep"}),
        ("python", ["python", "-c", "import x"], {"python"}),
        ("python", ["python", "-mdeepspeed.launcher.launch"], {"python", "deepspeed.launcher.launch"}),
    ],
)  # fmt: skip
def test_names_look_through_interpreters(comm: str, argv: list[str], expected: set[str]) -> None:
    assert _names_of(comm, tuple(argv)) == expected


def test_renamed_processes_are_seen_by_comm_and_argv0(spawner: Spawner) -> None:
    by_prctl, _ = spawner.holder("nvidia0", comm="sshd")
    by_argv0, _ = spawner.holder("nvidia0", argv0="jupyter-lab")
    table = scan_processes(spawner.dev)
    a, b = table.get(by_prctl), table.get(by_argv0)
    assert a is not None and a.comm == "sshd" and "sshd" in a.names
    assert b is not None and b.cmdline[0] == "jupyter-lab" and "jupyter-lab" in b.names


def test_shell_kinds() -> None:
    assert synthetic(10, 1, ["-bash"]).interactive_shell
    assert synthetic(10, 1, ["bash", "-l"]).interactive_shell
    assert not synthetic(10, 1, ["bash", "-c", "x"]).interactive_shell
    assert not synthetic(10, 1, ["/bin/sh", "run.sh"]).interactive_shell
    assert synthetic(10, 1, ["/bin/sh", "run.sh"]).is_shell
    assert not synthetic(10, 1, ["python3", "x.py"]).is_shell


def test_read_stat_tracks_identity(spawner: Spawner) -> None:
    pid = spawner.plain(["sleep", "30"])
    st = read_stat(pid)
    assert st is not None and st.ppid == os.getpid() and st.comm == "sleep"
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), what="sleep to die")
    st2 = read_stat(pid)
    assert st2 is None or st2.state == "Z"
    assert read_stat(2**22 + 12345) is None


def test_fd_scan_skipped_when_asked(spawner: Spawner) -> None:
    pid, _ = spawner.holder("nvidia0")
    p = scan_processes(spawner.dev, fds=False).get(pid)
    assert p is not None and p.devices == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a scan as another user")
def test_unreadable_fds_are_recorded_not_guessed(spawner: Spawner) -> None:
    import tempfile

    # The dev dir must be visible to the unprivileged scanner (pytest's tmp dirs are private).
    public = Path(tempfile.mkdtemp(prefix="podguard-dev-"))
    public.chmod(0o755)
    (public / "nvidia0").write_bytes(b"")
    proc = subprocess.Popen(
        [PY, "-S", "-c", HOLDER_SRC, json.dumps({"open": [str(public / "nvidia0")]})], stdout=subprocess.PIPE
    )
    spawner._popens.append(proc)
    spawner.track(proc.pid)
    pid = spawner._ready(proc)["pid"]
    code = (  # import first: the interpreter's own files may not be readable by nobody
        "import json, os, sys; sys.path[:0] = json.loads(sys.argv[2]); "
        "from podguard.procs import scan_processes; "
        "os.setgid(65534); os.setuid(65534); "
        "p = scan_processes(sys.argv[1]).get(int(sys.argv[3])); "
        "print(json.dumps([p.fd_error, list(p.devices)]))"
    )
    import podguard

    pkg_root = str(Path(podguard.__file__).resolve().parent.parent)
    try:
        out = subprocess.run(
            [PY, "-S", "-c", code, str(public), json.dumps([pkg_root]), str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        (public / "nvidia0").unlink()
        public.rmdir()
    if out.returncode != 0:
        pytest.skip(f"cannot run as nobody here: {out.stderr.strip()[-200:]}")
    fd_error, devices = json.loads(out.stdout)
    assert fd_error == "EACCES" and devices == []


def test_scan_of_many_processes_is_fast(spawner: Spawner) -> None:
    """A smoke figure, not a benchmark: 200 extra processes with device files open."""
    spawner.holder("nvidia0", "nvidiactl", fork=200)
    table = scan_processes(spawner.dev)
    assert len(table.holders_of_minor(0)) == 201
    assert table.scan_ms < 1000  # measured ~10-25 ms here; the bound only catches pathologies
