"""The manifest: what makes a checkpoint whole in the store. Written last, after every file it lists is in.

    m = Manifest.of(checkpoint, files, stored_at=time.time())    # files: [StoredFile("model.safetensors", n, crc)]
    key = manifest_key("checkpoint-1200", folder=True)           # 'checkpoint-1200/.podguard-manifest.json'
    m.why_not(listing)                                           # "" when every file is there with its size

In the store a checkpoint is whole exactly when its manifest is there and every file it lists has that size
(docs/checkpoints.md, "Survive the host"). Pure: JSON in, JSON out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORMAT", "MANIFEST", "Manifest", "StoredFile", "manifest_key", "rank_key"]

FORMAT = "podguard-checkpoint/1"
MANIFEST = ".podguard-manifest.json"  # in a folder checkpoint; a file checkpoint's is `<file>.podguard-manifest.json`


@dataclass(frozen=True)
class StoredFile:
    path: str  # relative to the checkpoint folder ("/"-separated); a file checkpoint: its own name
    size: int
    crc32: str  # 8 hex digits (zlib's CRC-32, as S3's ChecksumCRC32)
    mtime: float = 0.0  # restored as the file's modification time

    def to_data(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "crc32": self.crc32, "mtime": self.mtime}


@dataclass(frozen=True)
class Manifest:
    name: str  # the checkpoint's path relative to DIR (a direct entry: `checkpoint-1200`, `step-900.pt`)
    folder: bool
    layout: str
    step: int | None
    written_at: float  # the checkpoint's mtime under DIR when it was stored (Unix seconds)
    size: int  # the checkpoint's size as the finder counted it
    files: tuple[StoredFile, ...]
    stored_at: float = 0.0
    nodes: int = 1  # multi-node: how many nodes' files it holds
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return manifest_key(self.name, folder=self.folder)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file_key(self, f: StoredFile) -> str:
        return f"{self.name}/{f.path}" if self.folder else f.path

    def rank(self) -> tuple[bool, int, float]:
        return rank_key(self.step, self.written_at)

    def same_as(self, name: str, mtime: float, size: int) -> bool:
        """This manifest stores that checkpoint as it is now (an unchanged checkpoint is not stored twice)."""
        return self.name == name and abs(self.written_at - mtime) < 1e-3 and self.size == size

    def why_not(self, listing: dict[str, int]) -> str:
        """ "" when every listed file is in `listing` (relative path -> size) with its size; else why not."""
        for f in self.files:
            held = listing.get(f.path)
            if held is None:
                return f"{f.path} is missing"
            if held != f.size:
                return f"{f.path} is {held} bytes of {f.size}"
        return ""

    def to_json(self) -> bytes:
        data = {
            "format": FORMAT,
            "name": self.name,
            "kind": "folder" if self.folder else "file",
            "layout": self.layout,
            "step": self.step,
            "written_at": self.written_at,
            "size": self.size,
            "stored_at": self.stored_at,
            "nodes": self.nodes,
            "files": [f.to_data() for f in self.files],
            **self.extra,
        }
        return (json.dumps(data, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """ValueError for anything that is not a manifest of this format."""
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} manifest")
        files = tuple(
            StoredFile(str(f["path"]), int(f["size"]), str(f["crc32"]), float(f.get("mtime", 0.0)))
            for f in data["files"]
        )
        for f in files:
            if f.path.startswith("/") or ".." in f.path.split("/") or not f.path:
                raise ValueError(f"a manifest's file path may not leave its checkpoint: {f.path!r}")
        name = str(data["name"])
        if "/" in name or name in ("", ".", "..") or name.startswith("."):
            raise ValueError(f"not a checkpoint name: {name!r}")
        step = data.get("step")
        return cls(
            name=name,
            folder=data.get("kind") == "folder",
            layout=str(data.get("layout", "")),
            step=None if step is None else int(step),
            written_at=float(data["written_at"]),
            size=int(data.get("size", 0)),
            files=files,
            stored_at=float(data.get("stored_at", 0.0)),
            nodes=int(data.get("nodes", 1)),
        )


def manifest_key(name: str, *, folder: bool) -> str:
    return f"{name}/{MANIFEST}" if folder else f"{name}{MANIFEST}"


def rank_key(step: int | None, mtime: float) -> tuple[bool, int, float]:
    """Newest = the highest step; one without a step never outranks one with a step; then the newest mtime."""
    return (step is not None, -1 if step is None else step, mtime)
