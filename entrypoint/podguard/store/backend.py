"""What a checkpoint store must do, whatever it is: the S3 API (store/s3.py) or a mounted folder (store/local.py).

    backend = open_backend(parse_store_url("s3://b/run1"))   # no request yet
    backend.check()                                          # UsageError (64): no bucket, credentials refused
    backend.upload_file("/ckpt/checkpoint-5/model.safetensors", "checkpoint-5/model.safetensors", crc, progress)
    backend.list_top()                                       # ({"checkpoint-5"}, {"step-9.pt": 1234, ...})

Keys are relative to the store's root (PREFIX/ of s3://BUCKET/PREFIX, PATH of file:///PATH), "/"-separated.
Every method may raise `StoreUnreachable` (the network, a 5xx after the client's own retries, a timeout: tried
again later) or `StoreRefused` (4xx: the request itself is wrong, e.g. the credentials were revoked).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "CHUNK",
    "Backend",
    "BytesMoved",
    "Cancelled",
    "StoreError",
    "StoreRefused",
    "StoreUnreachable",
    "crc32_of",
    "crc_text",
    "rate_text",
    "took_text",
]

CHUNK = 8 << 20  # bytes per read when podguard itself reads a file (its checksum, the file store's copy)

BytesMoved = Callable[[int], None]  # bytes moved since the last call; may raise Cancelled to stop the transfer


class StoreError(Exception):
    """A store request that failed; `str()` is one line for people (never a secret)."""


class StoreUnreachable(StoreError):
    """The store did not answer (connection refused or dropped, a timeout, a 5xx after the retries)."""


class StoreRefused(StoreError):
    """The store answered no (403, 404 of the bucket, 400): retrying the same request will not help soon."""


class Cancelled(StoreError):
    """The transfer was stopped on purpose (the checkpoint was deleted under DIR, podguard is ending)."""


class Backend(Protocol):
    url: str  # the store's root as people see it (s3://b/run1, file:///mnt/ckpt)

    def describe_credentials(self) -> str:
        """Where the credentials come from (`environment (AWS_ACCESS_KEY_ID ...WXYZ)`), never the secret."""
        ...

    def check(self) -> None:
        """UsageError when the store cannot work at all (no such bucket, credentials refused); StoreUnreachable
        when it does not answer now (the job goes on: the mirror retries)."""
        ...

    def list_top(self) -> tuple[set[str], dict[str, int]]:
        """The folders and the files (name -> size) directly under the root."""
        ...

    def list_tree(self, folder: str) -> dict[str, int]:
        """Every file under `folder` (relative path -> size)."""
        ...

    def read_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        ...

    def write_bytes(self, key: str, data: bytes) -> None: ...

    def upload_file(self, path: str, key: str, size: int, crc: int, progress: BytesMoved) -> None:
        """Copy the file at `path` (`size` bytes, CRC-32 `crc`) to `key`; StoreError when the store does not hold
        exactly those bytes afterwards (its size, and its CRC-32 where the store reports one)."""
        ...

    def download_file(self, key: str, path: str, progress: BytesMoved) -> None:
        """Write the object to `path` (a new file)."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object (no error when it is not there)."""
        ...

    def close(self) -> None: ...


def crc32_of(path: str, size: int | None = None, progress: BytesMoved | None = None) -> int:
    """The CRC-32 (zlib's, as S3's `ChecksumCRC32`) of a file, read in CHUNK-sized pieces (zlib releases the GIL
    on each: the supervisor's loop is not held). With `size`: OSError when the file is not that long (it changed)."""
    crc = 0
    seen = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            seen += n
            if progress is not None:
                progress(0)  # (a cancellation point: the bytes count when they are sent)
    if size is not None and seen != size:
        raise OSError(f"{path} is {seen} bytes, not {size} (it changed)")
    return crc


def took_text(seconds: float) -> str:
    """A transfer's time as the store's lines say it: `0.4 s`, `41 s`, `12 min 5 s`."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 600:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s"


def rate_text(size: int, seconds: float) -> str:
    """`80 MB/s`, `4.2 MB/s`, `950 KB/s` (decimal units, as format_size)."""
    value = size / max(seconds, 1e-6)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            v = value / scale
            return f"{v:.1f} {unit}/s" if v < 10 else f"{v:.0f} {unit}/s"
    return f"{value:.0f} B/s"


def crc_text(crc: int) -> str:
    """The manifest's spelling: 8 lower-case hex digits."""
    return f"{crc & 0xFFFFFFFF:08x}"
