"""Where podguard keeps reports, counters, locks, leases and per-run logs.

`/workspace` is RunPod's persistent volume: keeping state there means a container restart can see what
the previous run did (its outcome, its crash count) instead of blindly doing it again.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from podguard.errors import UsageError

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
