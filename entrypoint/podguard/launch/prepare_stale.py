"""What interrupted prepare runs left in a cache root, and when it is safe to remove it.

    clean_stale(root, key, has_stamp=lambda folder: ...)  # under the key's lock, before a new run

A lock on a network volume may be host-local, so holding it says nothing about other pods: a temp folder
goes only when the process on this host that made it is gone, or when nothing in it changed for
STALE_TEMP_S; an unstamped result folder is moved aside and its stamp checked again before it goes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from podguard import console
from podguard.procfs import pid_exists
from podguard.state import host_id, unique_suffix

__all__ = ["STALE_TEMP_S", "TMP_PREFIX", "TRASH_PREFIX", "clean_stale", "temp_owner"]

TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
STALE_TEMP_S = 24 * 3600.0  # a temp folder of another pod that long untouched is abandoned


def clean_stale(root: Path, key: str, *, has_stamp: Callable[[Path], bool], now: float | None = None) -> None:
    """Remove the key's abandoned temp folders and an unstamped (half-made) result folder."""
    for prefix in (TMP_PREFIX, TRASH_PREFIX):
        for leftover in sorted(root.glob(f"{prefix}{key}-*")):
            why = _stale_reason(leftover, prefix, key, now)
            if why is not None:
                console.say(f"prepare {key}: removing {leftover.name} ({why})")
                _remove(leftover)
    _remove_unstamped(root / key, key, has_stamp)


def temp_owner(name: str, prefix: str, key: str) -> tuple[str, int] | None:
    """(host, pid) of `<prefix><key>-<host>-<pid>-<random>`; None for a name of another form."""
    rest = name.removeprefix(f"{prefix}{key}-")
    parts = rest.rsplit("-", 2)
    if rest == name or len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def _stale_reason(path: Path, prefix: str, key: str, now: float | None) -> str | None:
    owner = temp_owner(path.name, prefix, key)
    if owner is not None and owner[0] == host_id() and not pid_exists(owner[1]):
        return "left by an interrupted run on this host"
    age = (time.time() if now is None else now) - _last_change(path)
    if age > STALE_TEMP_S:
        return f"untouched for {age / 3600:.0f} h"
    return None


def _remove_unstamped(final: Path, key: str, has_stamp: Callable[[Path], bool]) -> None:
    """A result folder without a stamp is debris (a run killed between its rename and its stamp, by an
    older podguard that stamped last). Move it aside first and look again: if it is complete after all,
    put it back; only then delete it."""
    if not os.path.lexists(final) or has_stamp(final):
        return
    trash = final.with_name(f"{TRASH_PREFIX}{key}-{unique_suffix()}")
    try:
        os.rename(final, trash)
    except FileNotFoundError:
        return
    if has_stamp(trash):
        with contextlib.suppress(OSError):
            os.rename(trash, final)
        if not os.path.lexists(trash):
            return
    console.say(f"prepare {key}: removing {final} (no stamp: an interrupted run)")
    _remove(trash)


def _last_change(path: Path) -> float:
    """The newest mtime of the folder and its direct entries (not a full walk: results can be huge)."""
    try:
        newest = path.lstat().st_mtime
    except OSError:
        return time.time()
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()
