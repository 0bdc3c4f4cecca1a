"""MASTER_PORT for a run: parsed from user input, or leased so concurrent runs on a host never share one.

    with allocate_master_port(master_port_from_env()) as lease:   # the user's port, else a free one
        env.update(lease.env())                                   # {"MASTER_PORT": "29500"}

A lease is a flock on `<state dir>/leases/ports-<host>/<port>.lock`, held for the run's life (the kernel
drops it when podguard dies, however it dies), taken *before* the bind test so two runs starting at the
same instant cannot pick the same port; and a second on the same name in a host-local folder, so that runs with
different state dirs on one host see each other too. Where the state dir's filesystem has no flock (some network
volumes) the locks live in a host-local folder instead. Why ports are leased: docs/torchrun.md.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from podguard import state
from podguard.errors import ExitCode, PodguardError, UsageError

__all__ = [
    "DEFAULT_PORT_START",
    "PORT_SEARCH_SPAN",
    "PortLease",
    "allocate_master_port",
    "master_port_from_env",
    "parse_port",
    "port_in_use",
]

DEFAULT_PORT_START = 29500  # torch's default MASTER_PORT
PORT_SEARCH_SPAN = 2000
_PORT_RE = re.compile(r"[+-]?\d+")


def parse_int(raw: str | int, name: str, valid: str) -> int:
    """A whole number from user input (str or int), else a UsageError naming `name` and what is valid."""
    if isinstance(raw, bool):
        raise UsageError(f"{name}={raw!r} is not a whole number; {valid}")
    if isinstance(raw, int):
        return raw
    text = raw.strip()
    if not _PORT_RE.fullmatch(text):
        raise UsageError(f"{name}={raw!r} is not a whole number; {valid}")
    return int(text)


def parse_port(raw: str | int, name: str = "MASTER_PORT") -> int:
    """A TCP port from user input: a whole number in 1..65535, else a usage error naming `name`."""
    port = parse_int(raw, name, "expected a TCP port in 1..65535")
    if not 1 <= port <= 65535:
        raise UsageError(f"{name}={port} is out of range; expected a TCP port in 1..65535")
    return port


def master_port_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """MASTER_PORT from the environment, validated (exit 64 for junk); None when unset."""
    env = os.environ if environ is None else environ
    raw = env.get("MASTER_PORT")
    return parse_port(raw, "MASTER_PORT") if raw not in (None, "") else None


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
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            # EADDRNOTAVAIL and friends: that address family is not usable here; not a conflict
        finally:
            sock.close()
    return False


class PortLease:
    """A MASTER_PORT reserved for this run (against other podguard runs: the flock; against everything
    else: it was free when bind-tested). A context manager; `release()` is idempotent."""

    def __init__(self, port: int, fd: int | None, path: Path | None, host_fd: int | None = None) -> None:
        self.port = port
        self.path = path
        self._fd = fd
        self._host_fd = host_fd  # the same port's lease in the host-local folder (see _host_dir)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        host_fd, self._host_fd = self._host_fd, None
        for held in (fd, host_fd):
            if held is not None:
                _unlock(held)

    def env(self) -> dict[str, str]:
        return {"MASTER_PORT": str(self.port)}

    def __enter__(self) -> PortLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"PortLease(port={self.port}, held={self.held})"


def _port_dir(lease_dir: Path | None) -> Path:
    """`<lease dir>/ports-<host>`: ports belong to a host's network namespace, not to a shared volume."""
    if lease_dir is None:
        lease_dir = state.subdir(state.state_dir(), "leases")
        if not state.flock_supported(lease_dir):
            lease_dir = state.local_lock_dir("leases")
    path = Path(lease_dir) / f"ports-{state.host_id()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _host_dir(lease_dir: Path | None) -> Path | None:
    """A second, host-local folder of port leases (the temp dir's `podguard-ports-<uid>`): two runs on one host
    with different state dirs (a sweep per PODGUARD_STATE_DIR) see each other's ports there. None where the caller
    chose the folder, or the temp dir cannot hold it."""
    if lease_dir is not None:
        return None

    try:
        path = state.local_lock_dir("ports") / f"ports-{state.host_id()}"
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return None


def _lock_port(pdir: Path, hdir: Path | None, port: int, command: str) -> tuple[int, int | None] | Path:
    """Both leases of `port` (the state dir's, the host's), or the lease file of whoever holds one."""
    fd = _try_lock(pdir / f"{port}.lock", command)
    if fd is None:
        return pdir / f"{port}.lock"
    if hdir is None:
        return fd, None
    try:
        host_fd = _try_lock(hdir / f"{port}.lock", command)
    except OSError:
        return fd, None  # the host folder went away: the state dir's lease still holds
    if host_fd is None:
        _unlock(fd)
        return hdir / f"{port}.lock"
    return fd, host_fd


def _try_lock(path: Path, command: str) -> int | None:
    """Lock `path` without waiting and record ourselves in it; the fd, or None when another run holds it."""

    try:
        fd = state.open_lock(path)
        writable = True
    except PermissionError:  # another user's lease file: we can still lock it, not describe ourselves
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        writable = False
    try:
        taken = state.try_flock(fd)
    except BaseException:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        return None
    if writable:
        record = {"pid": os.getpid(), "command": command, "started": time.time(), "host": socket.gethostname()}
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
    return fd


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)  # the next reader must not see us as the holder
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the only fd of the open file description drops the flock


def _holder(path: Path) -> str:
    """'pid 1234 (podguard train -- python a.py) since 12:03' from a lease file, or a generic phrase."""
    try:
        data = json.loads(path.read_text(errors="replace") or "null")
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return "another podguard run"
    text = f"pid {data['pid']}"
    if data.get("command"):
        text += f" ({data['command']})"
    if data.get("started"):
        text += time.strftime(" since %H:%M", time.localtime(float(data["started"])))
    return text


def _lease_preferred(pdir: Path, hdir: Path | None, port: int, command: str) -> PortLease:
    got = _lock_port(pdir, hdir, port, command)
    if isinstance(got, Path):
        raise UsageError(
            f"MASTER_PORT={port} is leased by {_holder(got)}; unset MASTER_PORT to let podguard pick "
            "a free port for each run, or choose another port"
        )
    if port_in_use(port):
        PortLease(port, got[0], None, got[1]).release()
        raise UsageError(
            f"MASTER_PORT={port} is in use by another program on this host; unset MASTER_PORT "
            "to let podguard pick a free port, or choose another port"
        )
    return PortLease(port, got[0], pdir / f"{port}.lock", got[1])


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
    listens on it, exit 64 naming the port and its holder (a fixed port that is taken is a configuration
    conflict: unset MASTER_PORT to let podguard pick). Otherwise the first port from `start` upward that
    no podguard run leases and nothing listens on; exit 75 if the whole span is taken. A non-podguard
    program can still take the port between the test and the store's bind; that race is inherent.
    """
    for name, value in (("MASTER_PORT", preferred), ("port search start", start)):
        if value is not None and not 1 <= value <= 65535:
            raise UsageError(f"{name}={value} is out of range; expected a TCP port in 1..65535")

    pdir, hdir = _port_dir(lease_dir), _host_dir(lease_dir)
    cmd = command or state.holder_command()
    try:
        if preferred is not None:
            return _lease_preferred(pdir, hdir, preferred, cmd)
        end = min(65535, start + max(1, span) - 1)
        for port in range(start, end + 1):
            got = _lock_port(pdir, hdir, port, cmd)
            if isinstance(got, Path):
                continue
            lease = PortLease(port, got[0], pdir / f"{port}.lock", got[1])
            if port_in_use(port):
                lease.release()
                continue
            return lease
    except state.NoFlock:
        if lease_dir is not None:
            raise
        fallback = state.local_lock_dir("leases")
        return allocate_master_port(preferred, start=start, span=span, lease_dir=fallback, command=cmd)
    raise PodguardError(
        f"no free port for MASTER_PORT in {start}..{end} (all leased or in use); set MASTER_PORT to a free port",
        ExitCode.GPUS_BUSY,
    )
