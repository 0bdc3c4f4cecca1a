"""A snapshot of this PID namespace's process table, and which NVIDIA device files each process holds.

    table = scan_processes("/dev")
    table.holders_of_minor(0)       # pids with /dev/nvidia0 open
    table.ancestors(pid), table.descendants(pid)

One pass over `/proc` with `os.listdir`/`os.readlink`/`os.read` (psutil measured ~6x slower and hides
EACCES); a process whose fds cannot be read is recorded as uninspectable, never guessed about. Why fd
evidence matters and how it is used: docs/cleanup.md.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from podguard.preflight.cleanup.devices import NvidiaDeviceFiles, find_device_files, gpu_minor, resolve_dev_dir
from podguard.preflight.cleanup.names import SHELLS, names_of
from podguard.procfs import PROC, ProcStat, parse_stat, read_bytes, read_stat
from podguard.redact import redact_argv

__all__ = [
    "ProcInfo",
    "ProcStat",
    "ProcessTable",
    "read_cmdline",
    "read_stat",
    "read_uid",
    "scan_processes",
    "ticks_now",
]

_PF_KTHREAD = 0x00200000  # task flag of kernel threads: they have no fds worth reading


def ticks_now() -> int:
    """Clock ticks since boot now, the unit of `ProcInfo.start_time`: a process with a later start time
    was started after this call (0 when /proc/uptime cannot be read: then every process counts as new)."""
    try:
        uptime = float(read_bytes(f"{PROC}/uptime", 64).split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return int(uptime * os.sysconf("SC_CLK_TCK"))


def read_cmdline(pid: int) -> tuple[str, ...]:
    """argv as the process sees it now; () for kernel threads, zombies and processes that are gone."""
    try:
        raw = read_bytes(f"{PROC}/{pid}/cmdline", 1 << 17)
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
    def safe_command(self) -> str:
        """`command` with secret values masked (podguard.redact): the form reports and logs show."""
        if "safe" not in self._lazy:
            argv = self.cmdline
            self._lazy["safe"] = " ".join(redact_argv(argv)) if argv else f"[{self.comm}]"
        return self._lazy["safe"]  # type: ignore[return-value]

    @property
    def display_name(self) -> str:
        """argv[0]'s basename (comm when there is no argv)."""
        return os.path.basename(self.cmdline[0]) if self.cmdline else self.comm

    @property
    def names(self) -> frozenset[str]:
        if "names" not in self._lazy:
            self._lazy["names"] = names_of(self.comm, self.cmdline)
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
            st = parse_stat(pid, read_bytes(f"{PROC}/{entry}/stat"))
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
