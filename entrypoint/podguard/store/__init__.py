"""The checkpoint store (`--checkpoint-store URL`): whole checkpoints mirrored off the pod, and restored from it on
any new pod. docs/checkpoints.md, "Survive the host".

    url = parse_store_url("s3://my-bucket/llm-train")    # 64 for a bad URL, no request (store/url.py)
    backend = open_backend(url)                           # store/connect.py: S3 (boto3: podguard[store]) or a folder
    backend.check()                                       # 64: no such bucket, credentials refused
    mirror = Mirror(backend, "/workspace/ckpt", keep=2); mirror.start()   # store/mirror.py (says: the console)
    newest = newest_whole(backend)                        # store/catalog.py: the newest whole checkpoint in the store
    restore_checkpoint(backend, newest, "/workspace/ckpt")                 # store/restore.py

Layout in the store: a checkpoint at its path relative to DIR under the root (`PREFIX/checkpoint-1200/...`,
`PREFIX/step-900.pt`), and its manifest, written last (`PREFIX/checkpoint-1200/.podguard-manifest.json`,
`PREFIX/step-900.pt.podguard-manifest.json`). This package's top imports only the URL parser (what every
`podguard train|run` parses its options with); the rest is imported where a store is used.
"""

from __future__ import annotations

from podguard.store.url import StoreUrl, parse_store_url

__all__ = ["StoreUrl", "parse_store_url"]
