"""GPU and port leases: concurrent runs on one host get disjoint GPUs and distinct MASTER_PORTs.

The seed's sweeps started runs on `gpu_list=0,1` / `2,3` / ... with one shared MASTER_PORT and nothing
stopping two runs from landing on the same GPUs. A lease is one small file per GPU (or port) in the
lease dir, held with `flock(LOCK_EX)` for the life of the run:

* The kernel drops the lock when the holder dies, however it dies (SIGKILL, OOM killer, container
  stop): a crashed run frees its GPUs at once, there is no stale PID file to clean up, and no "is that
  pid still alive / reused" guessing decides ownership.
* Lease files are never unlinked (unlinking a lock file races with a process that just opened it and
  would let two holders lock two different inodes); they are a few bytes each.
* The file's *content* only explains who holds it (pid, command, start time, host) for messages like
  "GPU 2 is leased by pid 1234 (podguard train -- python a.py) since 12:03". Ownership is the lock.
* Locks are taken non-blocking, all-or-nothing, in a fixed order, and released if the whole set is not
  available: no run ever holds some GPUs while waiting for others, so two runs cannot deadlock.
* Lease fds are close-on-exec (Python's default, PEP 446): only podguard holds them, training children
  do not inherit them. podguard stops its workers before it exits, and the next run's preflight cleanup
  deals with any orphan that survived a SIGKILLed podguard. Had the workers inherited the locks, an
  orphan that hangs forever would keep the GPUs "leased" by a dead owner, with no one to name.
* GPU leases are keyed by UUID (globally unique, so a lease dir on a volume that several pods share
  cannot make one host's GPU 0 block another's), by index plus hostname only when NVML had no UUID.
  Port leases are keyed by port and hostname (a pod's ports are its own network namespace).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from podguard.errors import ExitCode, PodguardError, UsageError
from podguard.preflight.selection import SelectedGpu, Selection
from podguard.state import state_dir, subdir

DEFAULT_PORT_START = 29500  # torch's default MASTER_PORT
PORT_SEARCH_SPAN = 2000
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5
_PROGRESS_EVERY_S = 10.0
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS}


# --------------------------------------------------------------------------------------------------
# Lock files


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a lease, as recorded in its file (informational; the flock is the truth)."""

    pid: int
    command: str
    started: float
    host: str

    def describe(self) -> str:
        """ "pid 1234 (podguard train -- python a.py) since 12:03" """
        text = f"pid {self.pid}"
        if self.host and self.host != socket.gethostname():
            text += f" on {self.host}"
        if self.command:
            text += f" ({self.command})"
        if self.started:
            lt = time.localtime(self.started)
            fmt = "%H:%M" if time.strftime("%Y-%m-%d", lt) == time.strftime("%Y-%m-%d") else "%Y-%m-%d %H:%M"
            text += f" since {time.strftime(fmt, lt)}"
        return text


def default_command() -> str:
    """This process's command line, shortened, for lease files ("podguard train -- python a.py")."""
    argv = list(sys.argv) or ["python"]
    argv[0] = os.path.basename(argv[0])
    if argv[0] == "__main__.py":
        argv[0] = "podguard"
    text = shlex.join(argv)
    return text if len(text) <= 200 else text[:199] + "…"


def _read_holder(path: Path) -> LeaseHolder | None:
    """The recorded holder, or None when the record is missing, torn, or names a dead local pid."""
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
    )
    if holder.host in ("", socket.gethostname()) and not _pid_alive(holder.pid):
        return None  # a record left by a dead holder while a new one is just taking the lock
    return holder


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _NoFlock(Exception):
    """The filesystem under the lease dir does not support flock."""


def _try_lock(path: Path, command: str) -> int | None:
    """Lock `path` without blocking and record ourselves in it; the fd, or None when it is held."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # non-inheritable (close-on-exec) by default
        writable = True
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)  # another user's file: we can still lock, not describe
        writable = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        if exc.errno in _NO_FLOCK:
            raise _NoFlock(str(path)) from None
        raise
    if writable:
        record = {"pid": os.getpid(), "command": command, "started": time.time(), "host": socket.gethostname()}
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
    return fd


def _lock_or_holder(path: Path, command: str) -> tuple[int | None, LeaseHolder | None]:
    """(fd, None) when we got the lock, else (None, the holder's record if any).

    A lock with no live holder record is retried a few times over ~30 ms: it is either a new holder
    that has not written its record yet, or a diagnostic probe (`current_gpu_leases`) that holds a
    shared lock for microseconds; neither should make a run refuse.
    """
    for attempt in range(4):
        fd = _try_lock(path, command)
        if fd is not None:
            return fd, None
        holder = _read_holder(path)
        if holder is not None:
            return None, holder
        if attempt < 3:
            time.sleep(0.01)
    return None, None


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)  # the next reader must not see us as the holder
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the only fd of the open file description drops the flock


def default_lease_dir() -> Path:
    """`<state dir>/leases`; a temp dir when the state dir's filesystem has no flock (some network
    volumes), so that leases still work (all runs on the host make the same choice)."""
    base = subdir(state_dir(), "leases")
    probe = base / ".flock-probe"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        fd = None
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return base
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                return base
        finally:
            os.close(fd)
    fallback = Path(tempfile.gettempdir()) / f"podguard-leases-{os.getuid()}"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


# --------------------------------------------------------------------------------------------------
# GPU leases


def gpu_lease_key(gpu: SelectedGpu) -> str:
    """The lease file name of a GPU: its UUID (MIG UUID for a MIG slice), else index@hostname."""
    if gpu.visible_id.startswith("MIG-"):
        return _safe(gpu.visible_id)
    if gpu.uuid:
        return _safe(gpu.uuid)
    return _safe(f"index-{gpu.index}@{socket.gethostname()}")


class GpuLease:
    """The GPUs this run holds. A context manager; `release()` is idempotent.

    Holding the object keeps the locks; the kernel drops them when the process dies.
    """

    def __init__(self, gpus: Sequence[SelectedGpu], fds: Sequence[int], paths: Sequence[Path]) -> None:
        self.gpus: tuple[SelectedGpu, ...] = tuple(gpus)
        self.paths: tuple[Path, ...] = tuple(paths)
        self._fds: list[int] = list(fds)

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    @property
    def held(self) -> bool:
        return bool(self._fds) or not self.gpus

    def restrict(self, selection: Selection) -> Selection:
        """The selection narrowed to the leased GPUs, in the selection's order."""
        keys = {gpu_lease_key(g) for g in self.gpus}
        return dataclasses.replace(selection, gpus=tuple(g for g in selection.gpus if gpu_lease_key(g) in keys))

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            _unlock(fd)

    def __enter__(self) -> GpuLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"GpuLease(indices={self.indices}, held={self.held})"


def _label(gpus: Sequence[SelectedGpu]) -> str:
    idx = ", ".join(str(g.index) for g in gpus)
    return f"GPU {idx}" if len(gpus) == 1 else f"GPUs {idx}"


def _busy_text(busy: Sequence[tuple[SelectedGpu, LeaseHolder | None]]) -> str:
    parts = []
    for gpu, holder in busy:
        who = holder.describe() if holder else "another process (no record)"
        parts.append(f"GPU {gpu.index} is leased by {who}")
    return "; ".join(parts)


def _try_set(
    gpus: Sequence[tuple[SelectedGpu, Path]], command: str
) -> tuple[list[int] | None, list[tuple[SelectedGpu, LeaseHolder | None]]]:
    """Lock every GPU of `gpus` (in order) or none: (fds, []) on success, (None, busy) otherwise."""
    fds: list[int] = []
    busy: list[tuple[SelectedGpu, LeaseHolder | None]] = []
    for gpu, path in gpus:
        fd, holder = _lock_or_holder(path, command)
        if fd is None:
            busy.append((gpu, holder))
        else:
            fds.append(fd)
    if busy:
        for fd in fds:
            _unlock(fd)
        return None, busy
    return fds, []


def acquire_gpus(
    candidates: Sequence[SelectedGpu],
    count: int | None = None,
    *,
    explicit: bool,
    wait: bool = False,
    timeout_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    lease_dir: Path | None = None,
    command: str | None = None,
) -> GpuLease:
    """Lease GPUs for this run.

    explicit=True (GPU_LIST / CUDA_VISIBLE_DEVICES named them): all `candidates`, exactly; `count`, if
    given, must equal their number. explicit=False: the first `count` (default: all) free candidates,
    so concurrent runs end up on disjoint sets. When they are not free: refuse at once with exit 75
    naming the holders (wait=False), or poll with backoff, reporting through `progress`, until they are
    (wait=True) or `timeout_s` passes (None = no limit), then exit 75.
    No candidates (a CPU-only run) gives an empty lease.
    """
    cands = list(dict.fromkeys(candidates))
    if explicit:
        if count is not None and count != len(cands):
            raise UsageError(
                f"{count} GPUs requested but {len(cands)} named explicitly ({_label(cands)}); "
                "name exactly the GPUs to use"
            )
        need = len(cands)
    else:
        need = len(cands) if count is None else count
        if need < 0:
            raise UsageError(f"GPU count {need} is invalid; expected a number >= 0")
        if need > len(cands):
            raise PodguardError(
                f"{need} GPUs needed but this node offers {len(cands)}" + (f" ({_label(cands)})" if cands else ""),
                ExitCode.GPUS_MISSING,
            )
    if timeout_s is not None and timeout_s < 0:
        raise UsageError(f"GPU wait timeout {timeout_s} is invalid; expected seconds >= 0")
    if need == 0:
        return GpuLease((), (), ())

    base = lease_dir if lease_dir is not None else default_lease_dir()
    gdir = base / "gpus"
    gdir.mkdir(parents=True, exist_ok=True)
    cmd = command or default_command()
    paths = {gpu_lease_key(g): gdir / f"{gpu_lease_key(g)}.lock" for g in cands}

    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    delay = _POLL_FIRST_S
    last_report = -_PROGRESS_EVERY_S
    last_busy_text = ""
    while True:
        busy: list[tuple[SelectedGpu, LeaseHolder | None]]
        if explicit:
            ordered = sorted(cands, key=gpu_lease_key)  # one global order: no lock-order deadlocks
            fds, busy = _try_set([(g, paths[gpu_lease_key(g)]) for g in ordered], cmd)
            if fds is not None:
                by_key = dict(zip((gpu_lease_key(g) for g in ordered), fds, strict=True))
                return GpuLease(
                    cands, [by_key[gpu_lease_key(g)] for g in cands], [paths[gpu_lease_key(g)] for g in cands]
                )
        else:
            got: list[tuple[SelectedGpu, int]] = []
            busy = []
            for g in cands:  # candidates are tried one by one, so nothing is ever waited on while held
                fd, holder = _lock_or_holder(paths[gpu_lease_key(g)], cmd)
                if fd is None:
                    busy.append((g, holder))
                    continue
                got.append((g, fd))
                if len(got) == need:
                    break
            if len(got) == need:
                return GpuLease([g for g, _ in got], [fd for _, fd in got], [paths[gpu_lease_key(g)] for g, _ in got])
            for _, fd in got:
                _unlock(fd)

        now = time.monotonic()
        text = _busy_text(busy)
        if not explicit:
            text = f"{need} free GPUs needed, {len(cands) - len(busy)} of {len(cands)} free: {text}"
        if not wait:
            raise PodguardError(
                f"{text}; wait for them with --wait-for-gpus, "
                + ("or choose other GPUs with GPU_LIST" if explicit else "or ask for fewer GPUs"),
                ExitCode.GPUS_BUSY,
            )
        if deadline is not None and now >= deadline:
            raise PodguardError(
                f"still busy after waiting {now - start:.0f}s: {text}; a retry may succeed once they are released",
                ExitCode.GPUS_BUSY,
            )
        if progress is not None and (text != last_busy_text or now - last_report >= _PROGRESS_EVERY_S):
            limit = "" if timeout_s is None else f" of {timeout_s:.0f}s"
            progress(f"waiting for GPUs ({now - start:.0f}s{limit}): {text}")
            last_report, last_busy_text = now, text
        sleep = delay if deadline is None else max(0.0, min(delay, deadline - now))
        time.sleep(sleep)
        delay = min(delay * 1.5, _POLL_MAX_S)


def current_gpu_leases(lease_dir: Path | None = None) -> dict[str, LeaseHolder | None]:
    """Lease key -> holder for every GPU lease held right now (for `podguard doctor` / `gpus`)."""
    base = lease_dir if lease_dir is not None else default_lease_dir()
    out: dict[str, LeaseHolder | None] = {}
    gdir = base / "gpus"
    if not gdir.is_dir():
        return out
    for path in sorted(gdir.glob("*.lock")):
        if _is_locked(path):
            out[path.stem] = _read_holder(path)
    return out


def _is_locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the shared probe lock
    return False


# --------------------------------------------------------------------------------------------------
# Port leases


class PortLease:
    """A MASTER_PORT reserved for this run (against other podguard runs: a flock on ports/<port>.lock;
    against everything else: it was free when bind-tested). A context manager; `release()` is idempotent.
    """

    def __init__(self, port: int, fd: int | None, path: Path | None) -> None:
        self.port = port
        self.path = path
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            _unlock(fd)

    def env(self) -> dict[str, str]:
        return {"MASTER_PORT": str(self.port)}

    def __enter__(self) -> PortLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"PortLease(port={self.port}, held={self._fd is not None})"


def port_in_use(port: int) -> bool:
    """True when binding `port` fails on 0.0.0.0, 127.0.0.1 or [::] (someone listens on it).

    SO_REUSEADDR is set like torch's TCPStore does, so a port that only has TIME_WAIT leftovers counts
    as free (the store will be able to bind it).
    """
    targets: list[tuple[socket.AddressFamily, str]] = [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1")]
    if socket.has_ipv6:
        targets.append((socket.AF_INET6, "::"))
    for family, host in targets:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 in this container
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE or exc.errno == errno.EACCES:
                return True
            # EADDRNOTAVAIL and friends: that address family is not usable here; not a conflict
        finally:
            sock.close()
    return False


def master_port_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """MASTER_PORT from the environment, validated (exit 64 for junk); None when unset."""
    from podguard.launch.torchrun.command import parse_port  # local: keeps `import podguard.preflight.leases` light

    env = os.environ if environ is None else environ
    raw = env.get("MASTER_PORT")
    return parse_port(raw, "MASTER_PORT") if raw not in (None, "") else None


def allocate_master_port(
    preferred: int | None = None,
    *,
    start: int = DEFAULT_PORT_START,
    span: int = PORT_SEARCH_SPAN,
    lease_dir: Path | None = None,
    command: str | None = None,
) -> PortLease:
    """A MASTER_PORT distinct from every other podguard run on this host, and free right now.

    preferred (the user's MASTER_PORT): honoured when free; when another run leases it or something
    listens on it, exit 64 naming the port and its holder; a fixed port that is taken is a
    configuration conflict (the seed's sweeps all used 12345), and the fix is to unset MASTER_PORT so
    that podguard picks one. Otherwise the first port from `start` (29500, torch's default) upward that
    no podguard run leases and nothing listens on; exit 75 if the whole span is taken.
    The lock is taken *before* the bind test, so two runs starting at the same instant cannot both pick
    the same port. A port can still be taken by a non-podguard process between the test and the
    store's bind; that race is inherent to choosing ports and is rare.
    """
    for name, value in (("MASTER_PORT", preferred), ("port search start", start)):
        if value is not None and not 1 <= value <= 65535:
            raise UsageError(f"{name}={value} is out of range; expected a TCP port in 1..65535")
    base = lease_dir if lease_dir is not None else default_lease_dir()
    pdir = base / f"ports-{_safe(socket.gethostname())}"
    pdir.mkdir(parents=True, exist_ok=True)
    cmd = command or default_command()

    if preferred is not None:
        path = pdir / f"{preferred}.lock"
        fd, holder = _lock_or_holder(path, cmd)
        if fd is None:
            who = holder.describe() if holder else "another podguard run"
            raise UsageError(
                f"MASTER_PORT={preferred} is leased by {who}; unset MASTER_PORT to let podguard pick "
                "a free port for each run, or choose another port"
            )
        if port_in_use(preferred):
            _unlock(fd)
            raise UsageError(
                f"MASTER_PORT={preferred} is in use by another program on this host; unset MASTER_PORT "
                "to let podguard pick a free port, or choose another port"
            )
        return PortLease(preferred, fd, path)

    end = min(65535, start + max(1, span) - 1)
    for port in range(start, end + 1):
        path = pdir / f"{port}.lock"
        fd = _try_lock(path, cmd)
        if fd is None:
            continue
        if port_in_use(port):
            _unlock(fd)
            continue
        return PortLease(port, fd, path)
    raise PodguardError(
        f"no free port for MASTER_PORT in {start}..{end} (all leased or in use); set MASTER_PORT to a free port",
        ExitCode.GPUS_BUSY,
    )
