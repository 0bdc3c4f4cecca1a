"""torch Distributed Checkpoint folders: whole once `.metadata` exists and every file it names is there and long
enough. The rule reads sizes and one pickle of metadata, never the data, and holds for a copy, whose mtimes mean
nothing (`cp -r`, rsync without `-t`, a download in name order all leave the shards newer than `.metadata`).

    files = dcp_files("/ckpt/step_40/.metadata")   # {"__0_0.distcp": 29009, ...}: each file, where its last item ends
    why = dcp_why(tree)                              # "" when whole, else why not (a Tree: folders.read_tree)

The format (torch/distributed/checkpoint/filesystem.py and metadata.py, torch 2.13): each rank writes its items
into `__<rank>_<i>.distcp` files (`_write_files_from_queue`; a file opened "wb" and written item after item), then
the coordinator's `finish()` pickles a `Metadata` into `.metadata.tmp` and renames it to `.metadata`, so `.metadata`
appears only once every file is written. Its `storage_data` maps each item to a `_StorageInfo(relative_path, offset,
length)`: where its bytes are. Without collectives (`dcp.save(..., use_collectives=False)`) each rank writes its
own `__<rank>.metadata` naming its own files, and a loader reads its rank's.

A save under way, and how it is told apart: into a new folder, there is no `.metadata` yet; into the same folder
(DCP's default `overwrite=True`), the old `.metadata` stays while each shard is rewritten in place (opened "wb":
cut to 0 bytes, then grown), so a shard is shorter than the old metadata says; while `finish()` writes the new
metadata, `.metadata.tmp` is there (and stays there when the save died in between: the shards are then the new
save's and `.metadata` the old one's). A copy under way has a file missing or short.

`.metadata` is a pickle: it is read by an unpickler whose every class and function is an inert stand-in, so no
code named in the file runs and torch is never imported.
"""

from __future__ import annotations

import gc
import pickle
import re
from typing import Any

from podguard.checkpoints.checkpoint import short_of

__all__ = ["METADATA", "dcp_files", "dcp_why", "is_dcp"]

METADATA = ".metadata"
SHARD_SUFFIX = ".distcp"
_RANK_METADATA = re.compile(r"^__(\d+)\.metadata$")
_RANK_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")


class Unreadable(Exception):
    """The metadata cannot be read; the message says why (one phrase)."""


class _Inert:
    """What every class or function named in the pickle becomes: called or built, it only keeps its state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if type(state) is dict:  # (the hot path: one call per object of the pickle)
            self.__dict__.update(state)
            return
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slots state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)

    def __setitem__(self, key: Any, value: Any) -> None:  # a dict subclass (OrderedDict) filled item by item
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value: Any) -> None:  # a list subclass filled item by item
        self.__dict__.setdefault("values", []).append(value)

    def extend(self, values: Any) -> None:
        self.__dict__.setdefault("values", []).extend(values)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not DCP metadata")


def dcp_files(path: str) -> dict[str, int]:
    """The files a DCP metadata file names, each with where its last item ends (offset + length); Unreadable when
    the file does not unpickle (cut short) or names no files (not DCP metadata)."""
    collecting = gc.isenabled()
    gc.disable()  # tens of thousands of small objects and no cycle among them: the collector would double the cost
    try:
        with open(path, "rb") as f:
            metadata = _Unpickler(f).load()  # (streamed: a large run's index is hundreds of MB)
    except OSError as exc:
        raise Unreadable(f"cannot be read ({exc.strerror})") from None
    except Exception:  # any malformed pickle: cut short, or not a pickle at all
        raise Unreadable("does not read (cut short?)") from None
    finally:
        if collecting:
            gc.enable()
    storage = getattr(metadata, "__dict__", {}).get("storage_data") if isinstance(metadata, _Inert) else None
    ends: dict[str, int] = {}
    if isinstance(storage, dict):
        for info in storage.values():
            fields = getattr(info, "__dict__", {})
            name, offset, length = fields.get("relative_path"), fields.get("offset"), fields.get("length")
            if isinstance(name, str) and isinstance(offset, int) and isinstance(length, int):
                ends[name] = max(ends.get(name, 0), offset + length)
    if not ends:
        raise Unreadable("names no files (not torch DCP metadata?)")
    return ends


def is_dcp(names: list[str]) -> bool:
    """Whether a folder's own entries make it a DCP folder: `.metadata`, a rank's `__<r>.metadata`, a shard."""
    return any(n == METADATA or n.endswith(SHARD_SUFFIX) or _RANK_METADATA.match(n) for n in names)


def dcp_why(tree: Any, prefix: str = "", path: str = "") -> str:
    """ "" when the DCP folder (`prefix`: a subfolder of the tree, e.g. "model/") is whole, else why not. `tree`:
    folders.Tree (files: relative name -> (size, mtime)); `path`: the folder the tree was read from."""
    files: dict[str, tuple[int, float]] = tree.files
    top = {n[len(prefix) :]: v for n, v in files.items() if n.startswith(prefix) and "/" not in n[len(prefix) :]}
    tmp = next((n for n in top if n.endswith(f"{METADATA}.tmp")), None)
    if tmp is not None:
        return f"{prefix}{tmp} is there: a save into this folder did not finish"
    if METADATA in top:
        return _named_why(path, prefix, METADATA, top)
    ranks = sorted(int(m.group(1)) for n in top if (m := _RANK_METADATA.match(n)))
    if not ranks:
        return f"no {prefix}{METADATA} (torch DCP writes it last: the save did not finish)"
    for name in sorted(top):  # a rank's shards without its metadata: that rank did not finish
        if (m := _RANK_SHARD.match(name)) and int(m.group(1)) not in ranks:
            rank = m.group(1)
            return f"no {prefix}__{rank}{METADATA} for {prefix}{name} (rank {rank}'s save did not finish)"
    for rank in range(max(ranks) + 1):
        if rank not in ranks:
            return f"no {prefix}__{rank}{METADATA} (rank {rank}'s save did not finish)"
    for rank in ranks:
        if why := _named_why(path, prefix, f"__{rank}{METADATA}", top):
            return why
    return ""


def _named_why(path: str, prefix: str, meta: str, top: dict[str, tuple[int, float]]) -> str:
    """Every file `meta` names is in `top` and at least as long as its last item ends."""
    if top[meta][0] == 0:
        return f"{prefix}{meta} is empty"
    try:
        ends = dcp_files(f"{path}/{prefix}{meta}" if path else f"{prefix}{meta}")
    except Unreadable as exc:
        return f"{prefix}{meta} {exc}"
    count = f"{len(ends)} file" + ("s" if len(ends) != 1 else "")
    for name, end in sorted(ends.items()):
        if name not in top:
            return f"{prefix}{name} is missing ({prefix}{meta} names {count})"
        size = top[name][0]
        if size < end:
            return f"{prefix}{name} is {short_of(size, end)} ({prefix}{meta} names {count})"
    return ""
