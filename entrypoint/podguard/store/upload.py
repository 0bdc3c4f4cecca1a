"""Copy one whole checkpoint from DIR to the store: its files first, its manifest last.

    manifest = upload_checkpoint(backend, checkpoint, directory, progress=count)

A checkpoint that changes or disappears under DIR during its upload (a save into the same folder, HF's
`save_total_limit` rotation) is abandoned: `Cancelled` is raised, no manifest is written, and what was copied of it
is deleted again (best effort). Each file's CRC-32 is computed by podguard as it reads the file, and the store
must report the same bytes back (store/s3.py, store/local.py) before the manifest names it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from podguard.checkpoints import Checkpoint
from podguard.store.backend import Backend, BytesMoved, Cancelled, StoreError, crc32_of, crc_text
from podguard.store.manifest import Manifest, StoredFile, manifest_key

__all__ = ["LocalFile", "Others", "checkpoint_files", "commit", "remove", "upload_checkpoint", "upload_files"]

CHECK_EVERY_S = 0.5  # how often a transfer looks whether its checkpoint is still there
Others = Callable[[str, list[StoredFile], Callable[[], str | None]], list[StoredFile]]  # (name, own files, gone)


@dataclass(frozen=True)
class LocalFile:
    path: str  # absolute
    rel: str  # relative to the checkpoint folder ("/"-separated); a file checkpoint: its name
    size: int
    mtime: float


def checkpoint_files(path: str) -> list[LocalFile]:
    """The regular files a checkpoint is made of (a folder: every file below it, hidden ones such as DCP's
    `.metadata` included; symlinks to files are read as the file). OSError when it cannot be read."""
    if not os.path.isdir(path):
        st = os.stat(path)
        return [LocalFile(path, os.path.basename(path), st.st_size, st.st_mtime)]
    out: list[LocalFile] = []
    for top, dirs, names in os.walk(path, onerror=_raise):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(top, name)
            st = os.stat(full)
            if not os.path.isfile(full):
                continue  # a FIFO, a socket: no checkpoint is made of those
            out.append(LocalFile(full, os.path.relpath(full, path).replace(os.sep, "/"), st.st_size, st.st_mtime))
    return out


def _raise(exc: OSError) -> None:
    raise exc


def upload_files(
    backend: Backend,
    name: str,
    folder: bool,
    files: Sequence[LocalFile],
    *,
    progress: BytesMoved,
    gone: Callable[[], str | None],
) -> list[StoredFile]:
    """Copy `files` under `name` in the store; Cancelled as soon as `gone()` says why the checkpoint went."""
    last = [0.0]

    def watched(n: int) -> None:
        now = time.monotonic()
        if now - last[0] >= CHECK_EVERY_S:
            last[0] = now
            if (why := gone()) is not None:
                raise Cancelled(why)
        progress(n)

    stored: list[StoredFile] = []
    for f in files:
        if (why := gone()) is not None:
            raise Cancelled(why)
        try:
            crc = crc32_of(f.path, f.size, watched)
        except OSError as exc:
            raise Cancelled(gone() or f"{f.rel} changed during the upload ({exc.strerror or exc})") from None
        key = f"{name}/{f.rel}" if folder else f.rel
        backend.upload_file(f.path, key, f.size, crc, watched)
        stored.append(StoredFile(f.rel, f.size, crc_text(crc), f.mtime))
    return stored


def commit(backend: Backend, manifest: Manifest) -> None:
    backend.write_bytes(manifest.key, manifest.to_json())


def remove(backend: Backend, keys: Sequence[str]) -> None:
    """Delete keys in order (the manifest first: a checkpoint is never whole with files missing); best effort."""
    for key in keys:
        with contextlib.suppress(StoreError):
            backend.delete(key)


def upload_checkpoint(
    backend: Backend,
    checkpoint: Checkpoint,
    directory: str,
    *,
    progress: BytesMoved,
    stop: Callable[[], bool] = lambda: False,
    previous: Manifest | None = None,
    others: Others | None = None,
    nodes: int = 1,
) -> Manifest:
    """Files first, then the manifest. `previous`: the store's manifest of the same name (a rolling save such as
    `latest/`), removed first, so that the store never calls a mix of two saves whole. `others` (node 0 of a
    multi-node run, store/nodes.py): the files the other nodes added, once they all reported."""
    name = os.path.relpath(checkpoint.path, directory).replace(os.sep, "/")
    folder = os.path.isdir(checkpoint.path)
    files = checkpoint_files(checkpoint.path)
    before = {f.rel: (f.size, f.mtime) for f in files}

    def gone() -> str | None:
        if stop():
            return "podguard is ending"
        if not os.path.lexists(checkpoint.path):
            return f"{name} was deleted under {directory} during its upload"
        return None

    if previous is not None:
        backend.delete(previous.key)
    try:
        stored = upload_files(backend, name, folder, files, progress=progress, gone=gone)
        try:
            now = {f.rel: (f.size, f.mtime) for f in checkpoint_files(checkpoint.path)}
        except OSError:
            now = {}
        if now != before:
            raise Cancelled(gone() or f"{name} changed under {directory} during its upload")
        added = others(name, stored, gone) if others is not None else []
        stored = [*stored, *added]
    except Cancelled:
        keys = [f"{name}/{f.rel}" if folder else f.rel for f in files]
        if folder:  # (and what other nodes put there)
            with contextlib.suppress(StoreError):
                keys = sorted({*keys, *(f"{name}/{rel}" for rel in backend.list_tree(name))})
        remove(backend, [manifest_key(name, folder=folder), *keys])
        raise
    manifest = Manifest(
        name=name,
        folder=folder,
        layout=str(checkpoint.layout),
        step=checkpoint.step,
        # (with other nodes' files: the checkpoint as a restore lays it out, all files in one folder)
        written_at=max([checkpoint.mtime, *(f.mtime for f in added)]),
        size=checkpoint.size + sum(f.size for f in added),
        files=tuple(stored),
        stored_at=time.time(),
        nodes=nodes,
    )
    commit(backend, manifest)
    return manifest
