"""What the store holds: its checkpoints, newest first, each whole or not (and why not).

    stored = list_stored(backend)                     # every checkpoint under the store's root
    newest = newest_whole(backend)                    # the newest whole one (a Stored), or None

A checkpoint in the store is whole exactly when its manifest is there and every file the manifest lists is there
with that size (store/manifest.py). The listing is the root's (one ListObjectsV2 with a delimiter), one manifest
read per folder, and one listing of each folder that has a manifest: no file is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from podguard.checkpoints.steps import step_from_name
from podguard.store.backend import Backend
from podguard.store.manifest import MANIFEST, Manifest, manifest_key, rank_key

__all__ = ["Stored", "list_stored", "newest_whole"]


@dataclass(frozen=True)
class Stored:
    name: str
    folder: bool
    manifest: Manifest | None
    why: str = ""  # "" when whole
    size: int = 0  # what the store holds of it (bytes)

    @property
    def whole(self) -> bool:
        return self.manifest is not None and not self.why

    @property
    def step(self) -> int | None:
        return self.manifest.step if self.manifest is not None else step_from_name(self.name)

    def rank(self) -> tuple[bool, int, float]:
        if self.manifest is not None:
            return self.manifest.rank()
        return rank_key(self.step, 0.0)

    def keys(self, backend: Backend) -> list[str]:
        """Every key of it the store holds, the manifest first (what deleting it removes): a folder's whole listing
        (other nodes' reports and the files of an upload that never finished included)."""
        first = manifest_key(self.name, folder=self.folder)
        if not self.folder:
            return [first, self.name]
        held = [f"{self.name}/{rel}" for rel in sorted(backend.list_tree(self.name))]
        return [first, *(k for k in held if k != first)]


def list_stored(backend: Backend, *, until_whole: bool = False) -> list[Stored]:
    """The store's checkpoints, newest first (a whole one by its manifest's step and time; one without a manifest
    by the step in its name). `until_whole`: stop judging after the first whole one (what a restore needs)."""
    folders, files = backend.list_top()
    candidates: list[tuple[str, bool]] = [(f, True) for f in folders if not f.startswith(".")]
    for name in files:
        if name.endswith(MANIFEST):
            candidates.append((name[: -len(MANIFEST)], False))
        elif not name.startswith(".") and f"{name}{MANIFEST}" not in files:
            candidates.append((name, False))  # a file without its manifest: an upload that did not finish
    candidates.sort(key=lambda c: rank_key(step_from_name(c[0]), 0.0), reverse=True)
    out: list[Stored] = []
    for name, folder in candidates:
        out.append(_judge(backend, name, folder, files))
    out.sort(key=Stored.rank, reverse=True)
    if until_whole:
        first = next((i for i, s in enumerate(out) if s.whole), None)
        return out if first is None else out[: first + 1]
    return out


def newest_whole(backend: Backend) -> Stored | None:
    return next((s for s in list_stored(backend, until_whole=True) if s.whole), None)


def _judge(backend: Backend, name: str, folder: bool, top: dict[str, int]) -> Stored:
    raw = backend.read_bytes(manifest_key(name, folder=folder))
    listing: Callable[[], dict[str, int]]
    if folder:
        listing = lambda: backend.list_tree(name)  # noqa: E731
    else:
        listing = lambda: {name: top[name]} if name in top else {}  # noqa: E731
    if raw is None:
        held = listing()
        return Stored(name, folder, None, "no manifest (its upload did not finish)", sum(held.values()))
    try:
        manifest = Manifest.from_json(raw)
    except (ValueError, KeyError, TypeError) as exc:
        return Stored(name, folder, None, f"its manifest does not read ({exc})")
    if manifest.name != name or manifest.folder != folder:
        return Stored(name, folder, None, f"its manifest names {manifest.name!r}")
    held = listing()
    return Stored(name, folder, manifest, manifest.why_not(held), sum(held.values()))
