"""The checkpoint store's part of each attempt (`--checkpoint-store`): the check before anything runs, the restore
before each attempt, the mirror during the run, the store's newest checkpoint in RESTART and END, and the wait for
an upload at the end.

    sync = open_store_sync(settings.checkpoints, nnodes=2, node_rank=0)   # None without a store; 64: no bucket
    finding = sync.restore(finding, find)    # Handoff.before(): a newer whole checkpoint in the store comes first
    sync.fragment()                          # 'stored checkpoint-1200 (step 1200, written ...) in s3://b/run1'
    sync.flush(120.0)                        # the end of the run: the newest checkpoint's upload, within the grace
    sync.close()

docs/checkpoints.md, "Survive the host".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from podguard import console
from podguard.checkpoints import Checkpoint, Finding, format_size
from podguard.checkpoints.render import utc
from podguard.durations import format_duration
from podguard.store.backend import StoreError, took_text
from podguard.store.catalog import Stored, newest_whole
from podguard.store.connect import open_backend
from podguard.store.manifest import rank_key
from podguard.store.mirror import Mirror, StoreStats
from podguard.store.nodes import NodeRole
from podguard.store.restore import RestoreError, restore_checkpoint
from podguard.store.url import StoreUrl

if TYPE_CHECKING:
    from podguard.job.options import CheckpointSettings
    from podguard.metrics.state import Rows

__all__ = ["RESTORE_ATTEMPTS", "StoreSync", "UploadWait", "open_store_sync", "store_series"]


def store_series(stats: StoreStats) -> dict[str, Rows]:
    """The checkpoint store's series (docs/metrics.md), a metrics source: `metrics.add_source(lambda: ...)`."""
    rows: dict[str, Rows] = {
        "podguard_store_lag_seconds": (((), round(stats.lag_s, 3)),),
        "podguard_store_uploaded_bytes": (((), float(stats.uploaded_bytes)),),
        "podguard_store_uploads": ((("ok",), float(stats.ok)), (("failed",), float(stats.failed))),
    }
    if stats.step is not None:
        rows["podguard_store_checkpoint_step"] = (((), float(stats.step)),)
    return rows


RESTORE_ATTEMPTS = 3  # the restore's S3 client: a store that does not answer must not hold the start for minutes


def open_store_sync(
    checkpoints: CheckpointSettings | None,
    publish: Callable[[StoreStats], None] | None = None,
    *,
    nnodes: int | None = None,
    node_rank: int | None = None,
) -> StoreSync | None:
    """The store of `--checkpoint-store`, checked (64 before the job starts), or None without one."""
    url: StoreUrl | None = checkpoints.store if checkpoints is not None else None
    if url is None or checkpoints is None:
        return None
    role = None
    if (nnodes or 1) > 1:  # multi-node: node 0 commits, the others report their files (store/nodes.py)
        if node_rank is None:
            console.warn("a multi-node run without NODE_RANK: each node stores its own checkpoints alone")
        else:
            role = NodeRole(node_rank, nnodes or 1)
    sync = StoreSync(url, checkpoints.folder, checkpoints.store_keep, publish, role=role)
    sync.check()
    return sync


class StoreSync:
    """See the module docstring."""

    def __init__(
        self,
        url: StoreUrl,
        directory: Path,
        keep: int,
        publish: Callable[[StoreStats], None] | None = None,
        *,
        role: NodeRole | None = None,
    ) -> None:
        self.url = url
        self.directory = os.path.abspath(directory)
        self.backend = open_backend(url)
        self.quick = self.backend if url.scheme == "file" else open_backend(url, attempts=RESTORE_ATTEMPTS)
        self.mirror = Mirror(self.backend, self.directory, keep=keep, publish=publish, role=role)
        self.reachable = True

    def check(self) -> None:
        """UsageError (64) when the store cannot work; a warning when it does not answer now."""
        try:
            self.quick.check()
        except StoreError as exc:
            self.reachable = False
            console.warn(
                f"the checkpoint store does not answer now ({exc}); the job goes on, podguard tries the "
                "store again in the background"
            )

    # -- before each attempt ------------------------------------------------------------------------------------
    def restore(self, finding: Finding, find: Callable[[], Finding]) -> Finding:
        """When the store holds a whole checkpoint newer than `finding.chosen`, bring it into DIR and find again."""
        try:
            return self._restore(finding, find)
        finally:
            self.mirror.start()  # (once: after the first attempt's restore, so that it is not stored again)

    def _restore(self, finding: Finding, find: Callable[[], Finding]) -> Finding:
        if not self.reachable:  # it did not answer a moment ago (said then): the first attempt does not wait again
            self.reachable = True
            return finding
        try:
            stored = newest_whole(self.quick)
        except StoreError as exc:
            console.warn(f"cannot list the checkpoint store {self.url} ({exc}); resuming from what DIR holds")
            return finding
        if stored is None or stored.manifest is None:
            self.mirror.note_listed(None)
            return finding
        self.mirror.note_listed(stored.manifest)
        local = finding.chosen
        if local is not None and rank_key(local.step, local.mtime) >= stored.rank():
            return finding
        if local is not None and stored.manifest.same_as(self._name(local), local.mtime, local.size):
            return finding
        return self._bring(stored, finding, find)

    def _bring(self, stored: Stored, finding: Finding, find: Callable[[], Finding]) -> Finding:
        m = stored.manifest
        assert m is not None
        t0 = time.monotonic()
        try:
            restore_checkpoint(self.quick, stored, self.directory)
        except RestoreError as exc:
            fallback = finding.chosen.path if finding.chosen is not None else "none: the job starts from scratch"
            console.warn(f"could not restore {m.name} from {self.url}: {exc}; falling back to {fallback}")
            return finding
        step = f" (step {m.step})" if m.step is not None else ""
        took = took_text(time.monotonic() - t0)
        console.say(f"restored {m.name}{step} from {self.url}: {format_size(m.bytes)} in {took}")
        self.mirror.note_restored(m)
        return find()

    def _name(self, c: Checkpoint) -> str:
        return os.path.relpath(c.path, self.directory).replace(os.sep, "/")

    # -- lines and the end -------------------------------------------------------------------------------------
    def fragment(self) -> str:
        """RESTART's and END's part: the newest whole checkpoint in the store (outcome_lines.stored_checkpoint)."""
        m = self.mirror.stored
        if m is None:
            return f"nothing stored yet in {self.url}" if self.mirror.known else f"store {self.url} not reached"
        step = f"step {m.step}, " if m.step is not None else ""
        return f"stored {m.name} ({step}written {utc(m.written_at)}) in {self.url}"

    def flush(self, timeout_s: float) -> None:
        """The newest whole local checkpoint into the store before the run ends, within `timeout_s`."""
        pending = self._pending_after_a_look()
        if self.mirror.role is not None and not self.mirror.role.commits:
            self.mirror.refresh()  # (node 0 commits: this node's END names what it committed)
        if pending is None:
            return
        name = self._name(pending)
        console.say(f"waiting up to {format_duration(timeout_s)} for {name} to reach {self.url}")
        if not self.mirror.wait_for(pending, timeout_s):
            took = format_duration(timeout_s)
            console.warn(f"{name} is not in {self.url}: its upload did not finish within {took}")

    def _pending_after_a_look(self) -> Checkpoint | None:
        """The mirror's pending checkpoint once it has looked at DIR since now (bounded: a few polls)."""
        deadline = time.monotonic() + 3.0
        seen = self.mirror.looks
        while self.mirror.looks < seen + 2 and time.monotonic() < deadline and self.mirror.alive:
            self.mirror.kick()
            time.sleep(0.05)
        return self.mirror.pending()

    def upload_wait(self) -> UploadWait:
        return UploadWait(self.mirror, str(self.url))

    def close(self) -> None:
        self.mirror.close()
        self.backend.close()
        if self.quick is not self.backend:
            self.quick.close()


class UploadWait:
    """The save before a stop, with a store: the saved checkpoint's upload too (guards/save.py polls `note`)."""

    def __init__(self, mirror: Mirror, url: str) -> None:
        self.mirror = mirror
        self.url = url

    def note(self, checkpoint: Checkpoint, out_of_time: bool) -> str | None:
        """None while the upload may still come; else whether it reached the store."""
        if self.mirror.holds(checkpoint):
            return f"stored in {self.url}"
        self.mirror.kick()
        if out_of_time:
            return f"not in {self.url} within the save grace (its upload goes on until the job ends)"
        return None
