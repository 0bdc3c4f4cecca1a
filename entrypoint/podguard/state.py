"""Where podguard keeps its state (reports, counters, leases, per-run logs), how it writes there, how it locks there.

    state = state_dir()                       # PODGUARD_STATE_DIR, else /workspace/.podguard, else ~/.local/state
    write_private(subdir(state, "reports") / "latest.json", text)   # atomic, owner-only (0600)
    fd = open_lock(path)                      # owner-only, close-on-exec
    try:
        got = try_flock(fd)                   # False: another process holds it
    except NoFlock:                           # ENOLCK & co: this filesystem has no flock; lock host-locally instead
        fd = open_lock(local_lock_dir("prepare") / path.name)

`/workspace` is RunPod's persistent volume: keeping state there means a container restart can see what
the previous run did (its outcome, its crash count) instead of blindly doing it again.

A flock on such a volume may be refused (ENOLCK without a lock daemon) or kept host-local (other pods do
not see it), so a lock there only ever coordinates processes of one host; names that must not collide
across pods come from `unique_suffix()` (host, pid and a random part, not a PID alone).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import socket
import sys
import tempfile
from pathlib import Path

from podguard.errors import UsageError
from podguard.redact import redact_command

__all__ = [
    "ENV_STATE_DIR",
    "NO_FLOCK_ERRNOS",
    "NoFlock",
    "default_state_dir",
    "flock_supported",
    "holder_command",
    "host_id",
    "local_lock_dir",
    "lock_blocking",
    "open_lock",
    "state_dir",
    "subdir",
    "try_flock",
    "unique_suffix",
    "write_private",
]

ENV_STATE_DIR = "PODGUARD_STATE_DIR"


def default_state_dir() -> Path:
    if Path("/workspace").is_dir() and os.access("/workspace", os.W_OK):
        return Path("/workspace/.podguard")
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "podguard"
    home = Path.home()
    if os.access(home, os.W_OK):
        return home / ".local" / "state" / "podguard"
    return Path(tempfile.gettempdir()) / "podguard"


def state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The state dir, created if needed. An unusable explicit path is a usage error (exit 64)."""
    raw = explicit if explicit not in (None, "") else os.environ.get(ENV_STATE_DIR) or None
    path = Path(raw) if raw is not None else default_state_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"state dir {str(path)!r} cannot be created ({exc.strerror}); set {ENV_STATE_DIR} to a writable directory"
        ) from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"state dir {str(path)!r} is not writable; set {ENV_STATE_DIR} to a writable directory")
    return path


def subdir(base: Path, name: str) -> Path:
    """A named area inside the state dir (reports, locks, leases, logs, runs), created on demand."""
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_private(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` atomically, owner-only (0600): a temp file in the same folder, fsync, rename.

    The state dir often lives on a volume other pods mount: nothing in it is for other users to read.
    On failure (ENOSPC, EROFS, ...) the temp file is removed and the OSError propagates: callers that
    treat the write as best-effort catch it and warn once.
    """
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- locks that hold up on a volume several pods mount (RunPod network volumes: NFS/FUSE) ---

NO_FLOCK_ERRNOS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})
_BUSY_ERRNOS = frozenset({errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES})


class NoFlock(OSError):
    """The filesystem refused flock itself (not "held by someone else")."""


def host_id() -> str:
    """This host's name, safe for a file name ("pod-abc123"); pods sharing a volume have different ones."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def unique_suffix() -> str:
    """`<host>-<pid>-<random>`: unique across pods on one volume, where small container PIDs repeat."""
    import secrets  # noqa: PLC0415  lazy: ~5 ms of imports (hmac, random) that the health path skips

    return f"{host_id()}-{os.getpid()}-{secrets.token_hex(4)}"


def open_lock(path: Path) -> int:
    """Open (create 0600) a lock file; the fd is close-on-exec so programs we start do not inherit it."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _flock(fd: int, op: int) -> bool:
    try:
        fcntl.flock(fd, op)
    except OSError as exc:
        if exc.errno in _BUSY_ERRNOS and op & fcntl.LOCK_NB:
            return False
        if exc.errno in NO_FLOCK_ERRNOS:
            raise NoFlock(exc.errno, f"file locks are not supported here ({os.strerror(exc.errno)})") from None
        raise
    return True


def try_flock(fd: int, *, shared: bool = False) -> bool:
    """Take the lock without waiting: True when taken, False when another process holds it.

    Raises NoFlock when the filesystem has no flock (callers fall back to `local_lock_dir`)."""
    return _flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)


def lock_blocking(fd: int) -> None:
    """Wait in the kernel for the exclusive lock; NoFlock when the filesystem has none."""
    _flock(fd, fcntl.LOCK_EX)


def flock_supported(directory: Path) -> bool:
    """Whether flock works in `directory` (probed on `.flock-probe`); True when the probe cannot tell."""
    try:
        fd = open_lock(directory / ".flock-probe")
    except OSError:
        return True
    try:
        try_flock(fd, shared=True)
    except NoFlock:
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
    return True


def local_lock_dir(area: str) -> Path:
    """A host-local folder (in the temp dir, owner-only) for locks whose volume has no flock."""
    path = Path(tempfile.gettempdir()) / f"podguard-{area}-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def holder_command() -> str:
    """This process's command line, redacted and shortened, for lock and lease files ("podguard train -- ...")."""
    argv = list(sys.argv) or ["python"]
    argv[0] = os.path.basename(argv[0])
    if argv[0] == "__main__.py":
        argv[0] = "podguard"
    text = redact_command(argv)
    return text if len(text) <= 200 else text[:199] + "…"
