"""The checkpoint store (`--checkpoint-store URL`): whole checkpoints mirrored off the pod, and restored from it on
any new pod. docs/checkpoints.md, "Survive the host".

    url = parse_store_url("s3://my-bucket/llm-train")    # 64 for a bad URL, no request
    backend = open_backend(url)                           # S3 (boto3: the podguard[store] extra) or a folder
    backend.check()                                       # 64: no such bucket, credentials refused
    mirror = Mirror(backend, "/workspace/ckpt", keep=2, say=print); mirror.start()
    newest = newest_whole(backend)                        # the newest whole checkpoint in the store
    restore_checkpoint(backend, newest, "/workspace/ckpt", say=print)

Layout in the store: a checkpoint at its path relative to DIR under the root (`PREFIX/checkpoint-1200/...`,
`PREFIX/step-900.pt`), and its manifest, written last (`PREFIX/checkpoint-1200/.podguard-manifest.json`,
`PREFIX/step-900.pt.podguard-manifest.json`).
"""

from __future__ import annotations

from podguard.store.backend import Backend, StoreError, StoreRefused, StoreUnreachable
from podguard.store.catalog import Stored, list_stored, newest_whole
from podguard.store.local import LocalBackend
from podguard.store.manifest import Manifest
from podguard.store.mirror import Mirror, StoreStats
from podguard.store.restore import RestoreError, restore_checkpoint
from podguard.store.s3 import S3Backend
from podguard.store.url import StoreUrl, parse_store_url

__all__ = [
    "Backend",
    "Manifest",
    "Mirror",
    "RestoreError",
    "StoreError",
    "StoreRefused",
    "StoreStats",
    "StoreUnreachable",
    "StoreUrl",
    "Stored",
    "list_stored",
    "newest_whole",
    "open_backend",
    "parse_store_url",
    "restore_checkpoint",
]


def open_backend(url: StoreUrl, *, attempts: int | None = None) -> Backend:
    """The store's client (no request yet). `attempts`: the S3 client's tries per request (default 10)."""
    if url.scheme == "file":
        return LocalBackend(url)
    return S3Backend(url, attempts=attempts)
