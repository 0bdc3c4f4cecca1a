"""Bring a whole checkpoint from the store into DIR: downloaded into a hidden folder, checked against its
manifest, then renamed into place (nothing half-written ever has a checkpoint's name).

    path = restore_checkpoint(backend, stored, "/workspace/ckpt")   # '/workspace/ckpt/checkpoint-1200'

Each file must have its manifest's size and CRC-32, and gets its original modification time back (the finder
then sees the checkpoint as it was written: same age, and the mirror does not store it again). A checkpoint whose
folder exists under DIR already (another node's part of it, on a multi-node run with node-local disks) gets only
its missing files, and only when every file it has matches the manifest; otherwise RestoreError, and DIR is left
as it was. A download that fails leaves nothing behind (RestoreError).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time

from podguard import console
from podguard.checkpoints import format_size
from podguard.procfs import pid_exists
from podguard.store.backend import Backend, StoreError, crc32_of, crc_text
from podguard.store.catalog import Stored
from podguard.store.manifest import Manifest, StoredFile

__all__ = ["TEMP_PREFIX", "RestoreError", "clear_stale", "restore_checkpoint"]

TEMP_PREFIX = ".podguard-restore-"
PROGRESS_EVERY_S = 10.0


class RestoreError(Exception):
    """Why a checkpoint could not be restored (one line); DIR holds nothing new."""


def restore_checkpoint(backend: Backend, stored: Stored, directory: str) -> str:
    manifest = stored.manifest
    assert manifest is not None
    os.makedirs(directory, exist_ok=True)
    clear_stale(directory)
    target = os.path.join(directory, manifest.name)
    temp = os.path.join(directory, f"{TEMP_PREFIX}{manifest.name}-{os.getpid()}")
    todo = list(manifest.files)
    if os.path.lexists(target):
        todo = _missing_in_place(manifest, target)
    meter = _Meter(manifest, sum(f.size for f in todo), backend.url)
    try:
        for f in todo:
            local = os.path.join(temp, *f.path.split("/")) if manifest.folder else temp
            os.makedirs(os.path.dirname(local), exist_ok=True)
            backend.download_file(manifest.file_key(f), local, meter.add)
            _verify(local, f)
        _place(manifest, temp, target, todo)
    except (StoreError, OSError, RestoreError) as exc:
        _discard(temp)
        if isinstance(exc, RestoreError):
            raise
        text = str(exc) if isinstance(exc, StoreError) else f"{exc.strerror or exc}"
        raise RestoreError(f"downloading {manifest.name} failed: {text}") from None
    return target


def _missing_in_place(manifest: Manifest, target: str) -> list[StoredFile]:
    """The manifest's files that `target` lacks; RestoreError when a file it has differs from the store's."""
    if not manifest.folder or not os.path.isdir(target):
        raise RestoreError(f"{target} exists already and is not the store's {manifest.name}: left as it is")
    missing = []
    for f in manifest.files:
        path = os.path.join(target, *f.path.split("/"))
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            missing.append(f)
            continue
        except OSError as exc:
            raise RestoreError(f"{target}/{f.path} cannot be read ({exc.strerror})") from None
        if size != f.size or crc_text(crc32_of(path)) != f.crc32:
            raise RestoreError(
                f"{target} exists and differs from the store's {manifest.name} ({f.path} is {size} bytes with "
                "another checksum): left as it is"
            )
    return missing


def _verify(path: str, f: StoredFile) -> None:
    size = os.stat(path).st_size
    if size != f.size:
        raise RestoreError(f"{f.path} came as {size} bytes, its manifest says {f.size}")
    got = crc_text(crc32_of(path, f.size))
    if got != f.crc32:
        raise RestoreError(f"{f.path} came with CRC-32 {got}, its manifest says {f.crc32}")
    if f.mtime:
        os.utime(path, (f.mtime, f.mtime))


def _place(manifest: Manifest, temp: str, target: str, todo: list[StoredFile]) -> None:
    """Rename into place. A target that appeared meanwhile (another node restoring into a shared DIR) is kept."""
    if not os.path.lexists(target):
        if manifest.folder:
            with contextlib.suppress(OSError):
                os.utime(temp, (manifest.written_at, manifest.written_at))
            try:
                os.rename(temp, target)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                _discard(temp)
        else:
            try:
                os.link(temp, target)  # never over a file that appeared meanwhile
            except FileExistsError:
                pass
            except OSError:  # a filesystem without hard links
                os.rename(temp, target)
            _discard(temp)
        _fsync(os.path.dirname(target))
        return
    for f in todo:  # the missing files of a folder that exists (checked by _missing_in_place)
        dest = os.path.join(target, *f.path.split("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.lexists(dest):
            os.rename(os.path.join(temp, *f.path.split("/")), dest)
    _discard(temp)
    _fsync(target)


def clear_stale(directory: str) -> None:
    """Remove the hidden folders of restores whose podguard is gone (killed mid-download)."""
    with contextlib.suppress(OSError), os.scandir(directory) as it:
        for entry in it:
            if not entry.name.startswith(TEMP_PREFIX):
                continue
            pid = entry.name.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and pid_exists(int(pid)):
                continue
            _discard(entry.path)


def _discard(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _fsync(folder: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Meter:
    """Counts the bytes and says how far a long download is, every PROGRESS_EVERY_S."""

    def __init__(self, manifest: Manifest, total: int, url: str) -> None:
        self.manifest, self.total, self.url = manifest, total, url
        self.done = 0
        self.next = time.monotonic() + PROGRESS_EVERY_S

    def add(self, n: int) -> None:
        self.done += n
        if time.monotonic() >= self.next:
            self.next = time.monotonic() + PROGRESS_EVERY_S
            console.say(
                f"restoring {self.manifest.name} from {self.url}: {format_size(self.done)} of {format_size(self.total)}"
            )
