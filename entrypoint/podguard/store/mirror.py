"""The mirror: a thread of podguard's own process that copies each new whole checkpoint under DIR to the store.

    mirror = Mirror(backend, "/workspace/ckpt", keep=2)   # its lines: the console (from its thread)
    mirror.start()
    mirror.holds(checkpoint)              # the store has it (or a newer one), whole
    mirror.wait_for(checkpoint, 30.0)     # ... waiting up to 30 s (the save before a stop, the end of the run)
    mirror.close()

Every POLL_S it lists DIR (names, sizes, mtimes: cheap) and, when that changed, asks the finder for the newest
whole checkpoint. One that is newer than the store's newest whole one is uploaded (store/upload.py): files first,
the manifest last; then the store keeps the newest `keep` whole ones. Nothing here runs on the supervisor's loop
and nothing of it is the training process: a slow or unreachable store slows no step (one warning per outage,
then retries with backoff; a checkpoint whose upload failed is tried again, or the newer one that came meanwhile).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from podguard import console
from podguard.checkpoints import Checkpoint, Key, find_checkpoints, format_size, list_keys
from podguard.store.backend import Backend, Cancelled, StoreError, rate_text, took_text
from podguard.store.catalog import list_stored
from podguard.store.manifest import Manifest, StoredFile, rank_key
from podguard.store.nodes import NodeRole, answer_request, gather
from podguard.store.upload import remove, upload_checkpoint

__all__ = ["Mirror", "StoreStats"]

POLL_S = 2.0
BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 60.0
ENV_BACKOFF_MAX = "PODGUARD_STORE_BACKOFF_MAX"  # seconds (tests shorten it)
PROGRESS_EVERY_S = 60.0


@dataclass(frozen=True)
class StoreStats:
    """What the metrics show (podguard_store_*)."""

    step: int | None  # the newest whole checkpoint in the store
    lag_s: float  # age of the newest whole local checkpoint not yet in the store; 0 when none waits
    uploaded_bytes: int
    ok: int
    failed: int


class Mirror:
    """See the module docstring."""

    def __init__(
        self,
        backend: Backend,
        directory: str,
        *,
        keep: int,
        publish: Callable[[StoreStats], None] | None = None,
        poll_s: float = POLL_S,
        stored: Manifest | None = None,
        known: bool = False,
        role: NodeRole | None = None,
    ) -> None:
        self.backend = backend
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.publish = publish
        self.poll_s = poll_s
        self.stored = stored  # the store's newest whole checkpoint, as far as this mirror knows
        self.known = known  # the store has been listed (else `stored` means nothing yet)
        self.uploaded_bytes = self.ok = self.failed = 0
        self.uploading: str | None = None
        self.looks = 0  # cycles done (a caller can wait for the next look at DIR)
        self.role = role if role is not None and role.nnodes > 1 else None  # multi-node (store/nodes.py)
        self._answered: set[str] = set()
        self._pending: Checkpoint | None = None
        self._keys: frozenset[Key] | None = None
        self._chosen: Checkpoint | None = None
        self._failures = 0
        self._warned = False
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="podguard-store-mirror", daemon=True)

    # -- from other threads ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread (once; a closed mirror stays closed)."""
        if not self._thread.is_alive() and not self._stop.is_set() and self.looks == 0:
            self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def kick(self) -> None:
        """Look at DIR now (a save was asked for, the run is ending)."""
        self._wake.set()

    def holds(self, checkpoint: Checkpoint) -> bool:
        """The store's newest whole checkpoint is this one (as it is now) or a newer one."""
        with self._cond:
            return self._holds(checkpoint)

    def _holds(self, c: Checkpoint) -> bool:
        s = self.stored
        if s is None:
            return False
        if s.rank() > rank_key(c.step, c.mtime) or s.same_as(self._name(c), c.mtime, c.size):
            return True
        # the same save, stored with other nodes' files (a bigger size, their mtimes): not to be stored again; a
        # folder saved again under its name (a rolling `latest/`) is newer than what the store holds
        return s.name == self._name(c) and s.step == c.step and s.written_at >= c.mtime - 1e-3

    def wait_for(self, checkpoint: Checkpoint, timeout_s: float) -> bool:
        """Until the store holds `checkpoint` (True) or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        self.kick()
        with self._cond:
            while not self._holds(checkpoint):
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def pending(self) -> Checkpoint | None:
        """The newest whole local checkpoint the store does not hold yet (None when none waits)."""
        with self._cond:
            c = self._pending
            return None if c is None or self._holds(c) else c

    def note_listed(self, manifest: Manifest | None) -> None:
        """The store's newest whole checkpoint as a listing outside the thread found it (before an attempt)."""
        with self._cond:
            self.known = True
            if manifest is not None and (self.stored is None or manifest.rank() >= self.stored.rank()):
                self.stored = manifest
            self._cond.notify_all()

    def refresh(self) -> None:
        """List the store now (a node that only contributes learns what node 0 committed); quiet on failure."""
        with contextlib.suppress(StoreError):
            self._list_store()

    def note_restored(self, manifest: Manifest) -> None:
        self.note_listed(manifest)

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the thread -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        _lower_priority()
        while not self._stop.is_set():
            delay = self.poll_s
            try:
                delay = self._cycle()
                self.looks += 1
            except Exception as exc:  # a bug must not end the mirror silently, nor the job
                self._fail(f"{type(exc).__name__}: {exc}")
                delay = self._backoff()
            self._wake.wait(delay)
            self._wake.clear()

    def _cycle(self) -> float:
        if self.role is not None and not self.role.commits:
            return self._contribute()
        if not self.known:
            try:
                self._list_store()
            except StoreError as exc:
                self._fail(f"cannot list {self.backend.url}: {exc}")
                return self._backoff()
        local = self._newest_local()
        with self._cond:
            self._pending = local if local is not None and not self._holds(local) else None
            pending = self._pending
        self._publish()
        if pending is None:
            return self.poll_s
        return self.poll_s if self._upload(pending) else self._backoff()

    def _list_store(self) -> None:
        whole = [s for s in list_stored(self.backend, until_whole=True) if s.whole]
        with self._cond:
            self.stored = whole[0].manifest if whole else None
            self.known = True
            self._cond.notify_all()

    def _newest_local(self) -> Checkpoint | None:
        """The newest whole local checkpoint (judged again only when DIR's listing changed). One that changes while
        it is uploaded is abandoned and looked at again (store/upload.py), so a save still under way costs a retry,
        never a mix of two saves in the store."""
        try:
            keys = list_keys(self.directory)
            if keys != self._keys:
                self._chosen = find_checkpoints(self.directory, until_whole=True).chosen
                self._keys = keys
        except OSError:  # not there yet, or not readable (said before each attempt)
            return None
        return self._chosen

    def _upload(self, checkpoint: Checkpoint) -> bool:
        name = self._name(checkpoint)
        previous = self.stored if self.stored is not None and self.stored.name == name else None
        t0 = time.monotonic()
        moved = [0]
        next_say = [t0 + PROGRESS_EVERY_S]

        def progress(n: int) -> None:
            moved[0] += n
            if time.monotonic() >= next_say[0]:
                next_say[0] = time.monotonic() + PROGRESS_EVERY_S
                console.say(f"storing {name} in {self.backend.url}: {format_size(moved[0])} of {format_size(total)}")

        total = checkpoint.size
        self.uploading = name
        try:
            manifest = upload_checkpoint(
                self.backend,
                checkpoint,
                self.directory,
                progress=progress,
                stop=self._stop.is_set,
                previous=previous,
                others=self._gather if self.role is not None else None,
                nodes=self.role.nnodes if self.role is not None else 1,
            )
        except Cancelled as exc:
            if not self._stop.is_set():
                console.say(f"not storing {name}: {exc}")
            self._keys = None  # look again (a newer one, most likely)
            return True
        except (StoreError, OSError) as exc:
            self.failed += 1
            self._fail(f"cannot store {name} in {self.backend.url}: {exc}")
            return False
        finally:
            self.uploading = None
            self.uploaded_bytes += moved[0]
        elapsed = max(time.monotonic() - t0, 1e-6)
        rate = rate_text(manifest.bytes, elapsed)
        console.say(  # (before the waiters hear of it: their next line comes after this one)
            f"stored {name} in {self.backend.url} ({format_size(manifest.bytes)} in {took_text(elapsed)}, {rate})"
        )
        with self._cond:
            self.stored = manifest
            self.ok += 1
            self._failures = 0
            self._warned = False
            self._cond.notify_all()
        self._publish()
        self._prune()
        return True

    def _gather(self, name: str, own: list[StoredFile], gone: Callable[[], str | None]) -> list[StoredFile]:
        """Node 0: the other nodes' files of `name`, once every node reported (store/nodes.py)."""
        assert self.role is not None
        return gather(self.backend, name, own, nnodes=self.role.nnodes, stop=gone)

    def _contribute(self) -> float:
        """Node k > 0: answer node 0's request for a checkpoint's files (this node's shards of it)."""
        assert self.role is not None
        moved = [0]

        def progress(n: int) -> None:
            moved[0] += n

        try:
            name = answer_request(
                self.backend,
                self.directory,
                node=self.role.node,
                answered=self._answered,
                stop=self._stop.is_set,
                progress=progress,
            )
        except (StoreError, OSError) as exc:
            self._fail(f"cannot store node {self.role.node}'s files in {self.backend.url}: {exc}")
            return self._backoff()
        finally:
            self.uploaded_bytes += moved[0]
        if name is not None:
            self._failures, self._warned = 0, False
            console.say(
                f"stored node {self.role.node}'s files of {name} in {self.backend.url} ({format_size(moved[0])})"
            )
        return self.poll_s

    def _prune(self) -> None:
        """Keep the newest `keep` whole checkpoints; older ones, and leftovers of uploads that never finished
        and are older than the newest whole one, go (each manifest first)."""
        try:
            stored = list_stored(self.backend)
        except StoreError as exc:
            console.warn(f"cannot list {self.backend.url} to keep {self.keep} checkpoint(s): {exc}")
            return
        whole = [s for s in stored if s.whole]
        if not whole:
            return
        newest = whole[0].rank()
        doomed = whole[self.keep :] + [s for s in stored if not s.whole and s.rank() < newest and s.step is not None]
        for s in doomed:
            if s.name != self.uploading:
                try:
                    remove(self.backend, s.keys(self.backend))
                except StoreError as exc:
                    console.warn(f"cannot remove {s.name} from {self.backend.url}: {exc}")
        if doomed:
            names = ", ".join(s.name for s in doomed)
            console.say(f"store {self.backend.url}: removed {names} (--store-keep {self.keep})")

    # -- helpers ------------------------------------------------------------------------------------------------
    def _name(self, c: Checkpoint) -> str:
        return os.path.relpath(c.path, self.directory).replace(os.sep, "/")

    def _fail(self, text: str) -> None:
        self._failures += 1
        if not self._warned:
            self._warned = True
            console.warn(f"{text}; the job goes on, podguard tries again with backoff")
        self._publish()

    def _backoff(self) -> float:
        cap = _env_seconds(ENV_BACKOFF_MAX, BACKOFF_MAX_S)
        return min(cap, BACKOFF_MIN_S * 2 ** max(0, self._failures - 1))

    def stats(self) -> StoreStats:
        with self._cond:
            stored = self.stored
            pending = self._pending if self._pending is not None and not self._holds(self._pending) else None
        lag = max(0.0, time.time() - pending.mtime) if pending is not None else 0.0
        return StoreStats(stored.step if stored else None, lag, self.uploaded_bytes, self.ok, self.failed)

    def _publish(self) -> None:
        if self.publish is not None:
            self.publish(self.stats())


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return max(0.05, float(raw)) if raw else default
    except ValueError:
        return default


NICE = 10  # the mirror's threads yield the CPU to the training processes (nice 0): an upload never slows a step


def _lower_priority() -> None:
    """Nice this thread (Linux's nice is per thread, and the transfer manager's threads, started from this one,
    inherit it); the supervisor's loop and the job keep theirs."""
    with contextlib.suppress(OSError, AttributeError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), NICE))
