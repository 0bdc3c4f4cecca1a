"""Multi-node checkpoints: a checkpoint whose files several nodes write (each its shards, on its own disk) is
whole in the store only when every node's files are in. Node 0 commits; the others report through the store.

    # node 0, after its own files are in (store/upload.py calls it before the manifest):
    others = gather(backend, "step_1200", own_files, nnodes=2, stop=stop)   # blocks until every node reported
    # node k > 0, every look of its mirror:
    answer_request(backend, "/workspace/ckpt", node=1, answered=seen, stop=stop, progress=count)

The request is one small object at the store's root (`.podguard-request.json`: the checkpoint, a fresh token, and
the files node 0 holds); node k uploads its own files of that checkpoint folder that node 0 did not hold (on a
DIR every node shares, none: nothing is copied twice) and writes its report (`<folder>/.podguard-node-<k>-<token>.json`:
its files, sizes, CRC-32s); node 0 writes the manifest, naming every node's files, once every report is there.
A node that does not report within PODGUARD_STORE_NODE_TIMEOUT (default 10 min) leaves the checkpoint uncommitted
(tried again with the next look). The store is the channel, so nothing here needs a port between the nodes, and a
node 0 that restarts finds the reports where they were.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from podguard.store.backend import Backend, BytesMoved, Cancelled, StoreError
from podguard.store.manifest import StoredFile
from podguard.store.upload import checkpoint_files, upload_files

__all__ = ["REQUEST", "NodeRole", "answer_request", "gather", "node_timeout"]

REQUEST = ".podguard-request.json"
ENV_NODE_TIMEOUT = "PODGUARD_STORE_NODE_TIMEOUT"
NODE_TIMEOUT_S = 600.0
POLL_S = 1.0


@dataclass(frozen=True)
class NodeRole:
    node: int  # this node's rank
    nnodes: int

    @property
    def commits(self) -> bool:
        return self.node == 0


def node_timeout() -> float:
    raw = os.environ.get(ENV_NODE_TIMEOUT, "").strip()
    try:
        return max(1.0, float(raw)) if raw else NODE_TIMEOUT_S
    except ValueError:
        return NODE_TIMEOUT_S


def _report_key(name: str, node: int, token: str) -> str:
    return f"{name}/.podguard-node-{node}-{token}.json"


def _files_data(files: list[StoredFile]) -> list[dict[str, object]]:
    return [f.to_data() for f in files]


def _files_of(data: object) -> list[StoredFile]:
    if not isinstance(data, list):
        raise ValueError("not a list of files")
    return [StoredFile(str(f["path"]), int(f["size"]), str(f["crc32"]), float(f.get("mtime", 0.0))) for f in data]


def gather(
    backend: Backend,
    name: str,
    own: list[StoredFile],
    *,
    nnodes: int,
    stop: Callable[[], str | None],
) -> list[StoredFile]:
    """Node 0: ask the other nodes for their files of `name` and wait for every report; the files they added.
    Cancelled when `stop()` says why (the checkpoint went, podguard ends) or a node does not report in time."""
    token = f"{time.time_ns():x}{secrets.token_hex(4)}"
    request = {"name": name, "token": token, "files": _files_data(own), "nodes": nnodes}
    backend.write_bytes(REQUEST, json.dumps(request).encode())
    deadline = time.monotonic() + node_timeout()
    reports: dict[int, list[StoredFile]] = {}
    while len(reports) < nnodes - 1:
        for node in range(1, nnodes):
            if node in reports:
                continue
            raw = backend.read_bytes(_report_key(name, node, token))
            if raw is not None:
                try:
                    reports[node] = _files_of(json.loads(raw).get("files"))
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise StoreError(f"node {node}'s report on {name} does not read ({exc})") from None
        if len(reports) == nnodes - 1:
            break
        if (why := stop()) is not None:
            raise Cancelled(why)
        if time.monotonic() >= deadline:
            missing = ", ".join(str(n) for n in range(1, nnodes) if n not in reports)
            raise Cancelled(f"node(s) {missing} did not report their files of {name} within {node_timeout():g} s")
        time.sleep(POLL_S)
    seen = {f.path: f for f in own}
    added: list[StoredFile] = []
    for node in sorted(reports):
        for f in reports[node]:
            held = seen.get(f.path)
            if held is None:
                seen[f.path] = f
                added.append(f)
            elif (held.size, held.crc32) != (f.size, f.crc32):
                raise StoreError(f"{name}/{f.path} differs between node 0 and node {node}")
    return added


def answer_request(
    backend: Backend,
    directory: str,
    *,
    node: int,
    answered: set[str],
    stop: Callable[[], bool],
    progress: BytesMoved,
) -> str | None:
    """Node k > 0: when node 0 asked for a checkpoint's files (and this node has not answered that request), upload
    this node's files of it that node 0 does not hold, then report them. The checkpoint's name, or None."""
    raw = backend.read_bytes(REQUEST)
    if raw is None:
        return None
    try:
        request = json.loads(raw)
        name, token = str(request["name"]), str(request["token"])
        theirs = {(f.path, f.size) for f in _files_of(request["files"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{REQUEST} does not read ({exc})") from None
    if token in answered or "/" in name or name.startswith("."):
        return None
    path = os.path.join(directory, name)
    mine: list[StoredFile] = []
    if os.path.isdir(path):
        todo = [f for f in checkpoint_files(path) if (f.rel, f.size) not in theirs]

        def gone() -> str | None:
            return "podguard is ending" if stop() else None

        mine = upload_files(backend, name, True, todo, progress=progress, gone=gone)
    backend.write_bytes(_report_key(name, node, token), json.dumps({"files": _files_data(mine)}).encode())
    answered.add(token)
    return name
