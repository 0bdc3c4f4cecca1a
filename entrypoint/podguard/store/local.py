"""A mounted folder as a checkpoint store (`file:///PATH`: a network volume, an NFS share, a second disk).

    backend = LocalBackend(parse_store_url("file:///mnt/volume/ckpt"))

Each file is copied to a hidden temporary name beside its place, its CRC-32 computed as it is read, flushed to
the disk (fsync), read back and checked against that CRC-32 (the store's own verification), then renamed into
place: a copy cut short never has a checkpoint file's name. A folder that cannot be written is said as it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import zlib

from podguard.errors import UsageError
from podguard.store.backend import CHUNK, BytesMoved, StoreError, StoreRefused, StoreUnreachable, crc32_of, crc_text
from podguard.store.url import StoreUrl

__all__ = ["LocalBackend"]

_GONE = (errno.ENOENT, errno.ESTALE, errno.EIO, errno.ENOTCONN, errno.EHOSTDOWN, errno.ETIMEDOUT)


class LocalBackend:
    """See the module docstring."""

    def __init__(self, url: StoreUrl) -> None:
        self.store_url = url
        self.url = url.text
        self.root = url.path

    def describe_credentials(self) -> str:
        return f"this process's user (uid {os.getuid()})"

    def where(self) -> str:
        return self.url

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def check(self) -> None:
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise UsageError(f"--checkpoint-store={self.url}: {self.root} is not a folder")
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--checkpoint-store={self.url}: cannot create {self.root} ({exc.strerror})") from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            who = self.describe_credentials()
            raise UsageError(f"--checkpoint-store={self.url}: {self.root} is not writable by {who}")

    def list_top(self) -> tuple[set[str], dict[str, int]]:
        folders: set[str] = set()
        files: dict[str, int] = {}
        try:
            with os.scandir(self.root) as it:
                for entry in it:
                    if entry.name.startswith(".podguard-copy-"):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        folders.add(entry.name)
                    elif entry.is_file(follow_symlinks=False):
                        files[entry.name] = entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            return set(), {}
        except OSError as exc:
            raise _error(exc, self.root) from None
        return folders, files

    def list_tree(self, folder: str) -> dict[str, int]:
        base = self._path(folder)
        out: dict[str, int] = {}
        for top, _dirs, names in os.walk(base):
            for name in names:
                if name.startswith(".podguard-copy-"):
                    continue
                full = os.path.join(top, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                out[os.path.relpath(full, base).replace(os.sep, "/")] = st.st_size
        return out

    def read_bytes(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _error(exc, self._path(key)) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._temp(path)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(os.path.dirname(path))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise _error(exc, path) from None

    def upload_file(self, path: str, key: str, size: int, crc: int, progress: BytesMoved) -> None:
        target = self._path(key)
        tmp = self._temp(target)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            copied, seen = _copy(path, tmp, progress)
            if seen != size or copied != crc:
                raise StoreError(f"{key}: {path} changed while it was copied")
            held = crc32_of(tmp, size)  # read back: what the store holds is what was read
            if held != crc:
                raise StoreError(f"{key}: the copy's CRC-32 is {crc_text(held)}, the file's {crc_text(crc)}")
            os.replace(tmp, target)
            _fsync_dir(os.path.dirname(target))
        except OSError as exc:
            raise _error(exc, target) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def download_file(self, key: str, path: str, progress: BytesMoved) -> None:
        source = self._path(key)
        try:
            _copy(source, path, progress)
        except OSError as exc:
            raise _error(exc, source) from None

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _error(exc, path) from None
        parent = os.path.dirname(path)  # empty folders go too (a store folder is a checkpoint's)
        while parent != self.root and parent.startswith(self.root):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)

    def close(self) -> None:
        pass

    @staticmethod
    def _temp(path: str) -> str:
        folder, name = os.path.split(path)
        return os.path.join(folder, f".podguard-copy-{name}-{os.getpid()}")


def _copy(source: str, target: str, progress: BytesMoved) -> tuple[int, int]:
    """Copy in CHUNK-sized pieces, flushed to the disk: (CRC-32, bytes)."""
    crc = seen = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(source, "rb", buffering=0) as src, open(target, "wb", buffering=0) as dst:
        while n := src.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            dst.write(view[:n])
            seen += n
            progress(n)
        os.fsync(dst.fileno())
    return crc, seen


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _error(exc: OSError, path: str) -> StoreError:
    text = f"{path}: {exc.strerror or exc}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
        return StoreRefused(text)
    if exc.errno in _GONE:
        return StoreUnreachable(text)
    return StoreError(text)
