"""A snapshot of this PID namespace's process table, and which processes hold NVIDIA device files.

Why this exists: NVML's process lists are not enough to decide what to stop. NVML may report host PIDs
from another PID namespace (which may collide with unrelated local PIDs), and it does not list forked
children (DataLoader workers) that inherited a CUDA process's device files. The local truth is in
`/proc/<pid>/fd`: a process that has `<dev_dir>/nvidia<N>` open holds GPU minor N. This module reads that
evidence, fast, and never guesses: a process whose fds we may not read (EACCES) is recorded as
uninspectable.

Public API:

* `scan_processes(dev_dir=None, *, fds=True) -> ProcessTable`: one pass over `/proc`.
* `ProcessTable`: `get`, `children`, `ancestors`, `descendants`, `holders_of_minor`, `uninspectable`.
* `ProcInfo`: one process (pid, ppid, comm, state, pgid, sid, start_time, devices, and lazily
  `cmdline` / `uid`), with `names` used for protected-name and launcher matching.
* `find_device_files(dev_dir) -> NvidiaDeviceFiles`: the NVIDIA device files to look for.
* `read_stat(pid) -> ProcStat | None`: a fresh (state, start time) read, used to detect PID reuse.
* `resolve_dev_dir(explicit=None) -> Path`: `explicit`, else `$PODGUARD_DEV_DIR`, else `/dev`.

Speed: the scan uses `os.listdir`/`os.readlink`/`os.read` directly (psutil's `open_files()` measured
~6x slower here, and it hides EACCES). A device is matched by the fd's link text first (no extra
syscall); only fds whose target looks like a device (`/dev/...` or a basename starting with `nvidia`)
are `stat`ed, to compare `(st_dev, st_ino)` and, for character devices, `st_rdev` — inside containers the
same device may appear under another path. `cmdline` and `uid` cost two more syscalls per process and
are needed only for the few processes that are looked at, so they are read on first access.
"""

from __future__ import annotations

import errno
import os
import re
import stat as stat_mod
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_DEV_DIR = "PODGUARD_DEV_DIR"
DEFAULT_DEV_DIR = "/dev"
PROC = "/proc"

_GPU_DEVICE = re.compile(r"^nvidia(\d+)$")
_PF_KTHREAD = 0x00200000  # task flag of kernel threads: they have no fds worth reading

# Programs that run other programs; `names` looks through them to the script or module they run.
_INTERPRETERS = re.compile(r"^(python[0-9.]*m?|pypy[0-9.]*|node|nodejs|perl|ruby|env|uv|uvx)$")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "tcsh", "csh", "ash", "busybox"})
_PY_OPTS_WITH_ARG = frozenset({"-W", "-X", "-Q"})


def resolve_dev_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the NVIDIA device files live: the explicit value, else `$PODGUARD_DEV_DIR`, else `/dev`."""
    raw = explicit if explicit not in (None, "") else os.environ.get(ENV_DEV_DIR) or DEFAULT_DEV_DIR
    return Path(raw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NvidiaDeviceFiles:
    """The NVIDIA device files found in a dev dir, indexed every way an fd may refer to them.

    `paths` maps both the path as listed and its resolved form to the device name (`nvidia0`,
    `nvidiactl`, `nvidia-uvm`, `nvidia-caps/nvidia-cap1`, ...). `inodes` maps `(st_dev, st_ino)` and
    `rdevs` maps a character device's `st_rdev` to the same name.
    """

    dev_dir: str
    paths: Mapping[str, str] = field(default_factory=dict)
    inodes: Mapping[tuple[int, int], str] = field(default_factory=dict)
    rdevs: Mapping[int, str] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.paths.values())))

    def match_link(self, target: str) -> str | None:
        """The device name for an fd's link text, without any syscall; None if it is not one of ours."""
        return self.paths.get(target)

    def worth_stat(self, target: str) -> bool:
        """Whether an fd whose link text did not match could still be one of our devices."""
        if not target.startswith("/"):
            return False  # socket:[..], pipe:[..], anon_inode:..
        return target.startswith("/dev/") or os.path.basename(target).startswith("nvidia")

    def match_stat(self, st: os.stat_result) -> str | None:
        if stat_mod.S_ISCHR(st.st_mode) and st.st_rdev in self.rdevs:
            return self.rdevs[st.st_rdev]
        return self.inodes.get((st.st_dev, st.st_ino))


def gpu_minor(device: str) -> int | None:
    """`nvidia3` -> 3; None for `nvidiactl`, `nvidia-uvm` and the like (they are not one GPU)."""
    m = _GPU_DEVICE.match(device)
    return int(m.group(1)) if m else None


def find_device_files(dev_dir: str | os.PathLike[str] | None = None) -> NvidiaDeviceFiles:
    """List `<dev_dir>/nvidia*` (and `<dev_dir>/nvidia-caps/*`). A missing dir gives an empty set."""
    root = resolve_dev_dir(dev_dir)
    paths: dict[str, str] = {}
    inodes: dict[tuple[int, int], str] = {}
    rdevs: dict[int, str] = {}

    def add(path: str, name: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if stat_mod.S_ISDIR(st.st_mode):
            return
        paths[path] = name
        paths[os.path.realpath(path)] = name
        inodes[(st.st_dev, st.st_ino)] = name
        if stat_mod.S_ISCHR(st.st_mode):
            rdevs[st.st_rdev] = name

    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.startswith("nvidia"):
            continue
        full = os.path.join(root, entry)
        if entry == "nvidia-caps" and os.path.isdir(full):
            for cap in sorted(os.listdir(full)):
                add(os.path.join(full, cap), f"nvidia-caps/{cap}")
            continue
        add(full, entry)
    return NvidiaDeviceFiles(dev_dir=str(root), paths=paths, inodes=inodes, rdevs=rdevs)


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


def _read_bytes(path: str, size: int = 4096) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def _parse_stat(pid: int, raw: bytes) -> ProcStat:
    text = raw.decode("utf-8", "replace")
    lpar = text.index("(")
    rpar = text.rindex(")")  # comm may itself contain ")" and spaces
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
        return _parse_stat(pid, _read_bytes(f"{PROC}/{pid}/stat"))
    except (OSError, ValueError, IndexError):
        return None


def read_cmdline(pid: int) -> tuple[str, ...]:
    """argv as the process sees it now; () for kernel threads, zombies and processes that are gone."""
    try:
        raw = _read_bytes(f"{PROC}/{pid}/cmdline", 1 << 17)
    except OSError:
        return ()
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()  # the usual trailing NUL; a process that rewrote its title may have none
    return tuple(part.decode("utf-8", "replace") for part in parts)


def read_uid(pid: int) -> int | None:
    """The owner of `/proc/<pid>`: the process's effective uid (for dumpable processes)."""
    try:
        return os.stat(f"{PROC}/{pid}").st_uid
    except OSError:
        return None


def _names_of(comm: str, argv: tuple[str, ...]) -> frozenset[str]:
    """Every name a person would call this process by: comm, argv[0], and what an interpreter runs.

    `python -m torch.distributed.run` -> {"python3", "torch.distributed.run", ...};
    `/usr/bin/python3 /usr/local/bin/jupyter-lab` -> {"python3", "jupyter-lab"}; `-bash` -> {"bash"}.
    """
    names = {comm}
    i = 0
    for _hop in range(3):  # env python3 -u script.py: at most a few hops
        if i >= len(argv):
            break
        prog = os.path.basename(argv[i]).lstrip("-")
        if not prog:
            break
        names.add(prog)
        if not _INTERPRETERS.match(prog):
            break
        i += 1
        nxt: int | None = None
        while i < len(argv):
            arg = argv[i]
            if arg == "-m" and i + 1 < len(argv):
                module = argv[i + 1]
                names.add(module)
                return frozenset(names)
            if arg.startswith("-m") and len(arg) > 2:
                names.add(arg[2:])
                return frozenset(names)
            if arg == "-c" or arg.startswith("-c"):
                return frozenset(names)
            if arg in _PY_OPTS_WITH_ARG:
                i += 2
                continue
            if arg.startswith("-") or (prog == "env" and "=" in arg) or (prog in ("uv", "uvx") and arg == "run"):
                i += 1
                continue
            nxt = i
            break
        if nxt is None:
            break
        i = nxt
    return frozenset(n for n in names if n)


@dataclass(frozen=True)
class ProcInfo:
    """One process as seen at scan time.

    `devices` are the NVIDIA device files it has open (sorted names, e.g. `("nvidia0", "nvidiactl")`).
    `fd_error` is None when its fds were read, else why not (`"EACCES"`): such a process is
    "uninspectable", never assumed to hold or not hold a GPU.
    """

    pid: int
    ppid: int
    comm: str
    state: str
    pgid: int
    sid: int
    start_time: int
    kernel_thread: bool = False
    devices: tuple[str, ...] = ()
    fd_error: str | None = None
    _lazy: dict[str, object] = field(default_factory=dict, compare=False, repr=False, hash=False)

    @property
    def inspected(self) -> bool:
        return self.fd_error is None

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")

    @property
    def uninterruptible(self) -> bool:
        return self.state == "D"

    @property
    def cmdline(self) -> tuple[str, ...]:
        if "cmdline" not in self._lazy:
            self._lazy["cmdline"] = read_cmdline(self.pid)
        return self._lazy["cmdline"]  # type: ignore[return-value]

    @property
    def uid(self) -> int | None:
        if "uid" not in self._lazy:
            self._lazy["uid"] = read_uid(self.pid)
        return self._lazy["uid"]  # type: ignore[return-value]

    @property
    def command(self) -> str:
        """The command line as one string (`[comm]` like ps when there is none)."""
        argv = self.cmdline
        return " ".join(argv) if argv else f"[{self.comm}]"

    @property
    def names(self) -> frozenset[str]:
        if "names" not in self._lazy:
            self._lazy["names"] = _names_of(self.comm, self.cmdline)
        return self._lazy["names"]  # type: ignore[return-value]

    @property
    def is_shell(self) -> bool:
        argv0 = os.path.basename(self.cmdline[0]).lstrip("-") if self.cmdline else ""
        return self.comm in SHELLS or argv0 in SHELLS

    @property
    def interactive_shell(self) -> bool:
        """A shell with neither a script nor `-c`: somebody's terminal, never part of a job."""
        if not self.is_shell:
            return False
        args = self.cmdline[1:]
        return not any(a == "-c" or not a.startswith("-") for a in args)

    @property
    def gpu_minors(self) -> tuple[int, ...]:
        return tuple(sorted(m for m in (gpu_minor(d) for d in self.devices) if m is not None))


class ProcessTable:
    """A snapshot of the processes of this PID namespace, with parent/child links.

    Treat it as immutable: it is what `/proc` said at `taken_at` (time.monotonic()).
    """

    def __init__(
        self, procs: Mapping[int, ProcInfo], devices: NvidiaDeviceFiles, scan_ms: float, taken_at: float
    ) -> None:
        self.procs: Mapping[int, ProcInfo] = procs
        self.devices = devices
        self.scan_ms = scan_ms
        self.taken_at = taken_at
        kids: dict[int, list[int]] = {}
        for p in procs.values():
            kids.setdefault(p.ppid, []).append(p.pid)
        self._children = {k: tuple(sorted(v)) for k, v in kids.items()}

    def __contains__(self, pid: object) -> bool:
        return pid in self.procs

    def __iter__(self) -> Iterator[ProcInfo]:
        return iter(self.procs.values())

    def __len__(self) -> int:
        return len(self.procs)

    def get(self, pid: int) -> ProcInfo | None:
        return self.procs.get(pid)

    def children(self, pid: int) -> tuple[int, ...]:
        return self._children.get(pid, ())

    def ancestors(self, pid: int) -> tuple[int, ...]:
        """Parent first, up to the namespace's root (PID 1, or the last one visible)."""
        out: list[int] = []
        seen = {pid}
        p = self.procs.get(pid)
        while p is not None and p.ppid > 0 and p.ppid not in seen:
            out.append(p.ppid)
            seen.add(p.ppid)
            p = self.procs.get(p.ppid)
        return tuple(out)

    def descendants(self, pid: int) -> tuple[int, ...]:
        """Every process below `pid`, top-down (breadth first), `pid` itself excluded."""
        out: list[int] = []
        frontier = [pid]
        seen = {pid}
        while frontier:
            nxt: list[int] = []
            for parent in frontier:
                for child in self.children(parent):
                    if child not in seen:
                        seen.add(child)
                        out.append(child)
                        nxt.append(child)
            frontier = nxt
        return tuple(out)

    def holders_of_minor(self, minor: int) -> tuple[int, ...]:
        """PIDs that have `<dev_dir>/nvidia<minor>` open."""
        name = f"nvidia{minor}"
        return tuple(p.pid for p in self.procs.values() if name in p.devices)

    @property
    def uninspectable(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.procs.values() if not p.inspected)


def _read_devices(pid: int, devices: NvidiaDeviceFiles) -> tuple[tuple[str, ...], str | None] | None:
    """NVIDIA devices held by `pid` and an error tag; None when the process vanished meanwhile."""
    if not devices.paths:
        return (), None  # no NVIDIA device files here (a CPU-only node): nothing to look for
    base = f"{PROC}/{pid}/fd/"
    try:
        fds = os.listdir(base)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return (), errno.errorcode.get(exc.errno or 0, str(exc.errno))
    found: set[str] = set()
    for fd in fds:
        path = base + fd
        try:
            target = os.readlink(path)
        except OSError:
            continue  # closed meanwhile
        name = devices.match_link(target)
        if name is None and devices.worth_stat(target):
            try:
                name = devices.match_stat(os.stat(path))
            except OSError:
                name = None
        if name is not None:
            found.add(name)
    return tuple(sorted(found)), None


def scan_processes(dev_dir: str | os.PathLike[str] | None = None, *, fds: bool = True) -> ProcessTable:
    """Read every process of this PID namespace; with `fds`, also which NVIDIA device files each holds.

    `fds=False` is the cheap variant (one read per process) used to re-list a job tree's members.
    """
    t0 = time.perf_counter()
    devices = find_device_files(dev_dir) if fds else NvidiaDeviceFiles(dev_dir=str(resolve_dev_dir(dev_dir)))
    procs: dict[int, ProcInfo] = {}
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            st = _parse_stat(pid, _read_bytes(f"{PROC}/{entry}/stat"))
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        kthread = bool(st.flags & _PF_KTHREAD)
        held: tuple[str, ...] = ()
        err: str | None = None
        if fds and not kthread:  # a "Z" leader may still have live threads holding the files
            res = _read_devices(pid, devices)
            if res is None:
                continue
            held, err = res
        procs[pid] = ProcInfo(
            pid=pid,
            ppid=st.ppid,
            comm=st.comm,
            state=st.state,
            pgid=st.pgid,
            sid=st.sid,
            start_time=st.start_time,
            kernel_thread=kthread,
            devices=held,
            fd_error=err,
        )
    return ProcessTable(procs, devices, (time.perf_counter() - t0) * 1000.0, time.monotonic())
