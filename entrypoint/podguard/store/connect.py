"""The store's client for a URL: the S3 API (store/s3.py; boto3 is imported when it is made) or a folder.

backend = open_backend(parse_store_url("s3://b/run1"), attempts=3)
"""

from __future__ import annotations

from podguard.store.backend import Backend
from podguard.store.local import LocalBackend
from podguard.store.s3 import S3Backend
from podguard.store.url import StoreUrl

__all__ = ["open_backend"]


def open_backend(url: StoreUrl, *, attempts: int | None = None) -> Backend:
    """The store's client (no request yet). `attempts`: the S3 client's tries per request (default 10)."""
    if url.scheme == "file":
        return LocalBackend(url)
    return S3Backend(url, attempts=attempts)
