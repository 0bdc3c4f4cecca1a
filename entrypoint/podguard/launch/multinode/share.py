"""Progress shared across the nodes of a multi-node run, so that a hang is the job's verdict, not one node's.

    share = ProgressShare(settings, count=lambda: watch.progress.events)   # settings: the cluster gate's
    share.start()
    seen = share.remote()     # (this node's monotonic time, "node 1") of the newest progress of another node
    share.close()

Each node counts the progress its own workers make (output lines, `--progress` matches, heartbeats) and adds
what is new to its counter `podguard/progress/<session>/node/<rank>` in a TCPStore that node 0 hosts on the
cluster gate's port (PRIMARY_ADDR, PODGUARD_CLUSTER_PORT, default PRIMARY_PORT + 1: the gate's own store is gone
by then); every `interval_s` it reads the other nodes' counters. A counter that grew is progress of the job,
stamped with this node's own clock when it was seen, so the nodes' clocks never need to agree. Only a node's
own progress is published (never what it heard), so silence on every node stays silence. A node 0 that restarts
draws a new session: the counters read before are forgotten, so its fresh counts are progress. Every store call runs
on this thread with a timeout; a node that cannot reach node 0's store judges on its own progress (said once).
torch is imported here, on the thread: on multi-node runs only (the gate needs it too). docs/watch.md.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from podguard import console
from podguard.launch.multinode.protocol import _bind, _timedelta, load_store_class
from podguard.launch.multinode.verdicts import GateSettings

__all__ = ["ROOT", "ProgressShare"]

ROOT = "podguard/progress"
SESSION_KEY = f"{ROOT}/session"
INTERVAL_S = 1.0
OP_TIMEOUT_S = 5.0  # one store call, at most
SAY_AFTER_S = 30.0  # a node that has not reached node 0's store this long says so (once)


class ProgressShare:
    """See the module docstring. `count()`: this node's own progress events so far (read on the thread). Its
    warning is said from the thread (the console hands it to the supervisor's loop)."""

    def __init__(
        self,
        settings: GateSettings,
        count: Callable[[], int],
        *,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.settings = settings
        self.count = count
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._remote: tuple[float, str] | None = None
        self._seen: dict[int, int] = {}  # node -> its counter when last read
        self._sent = 0
        self.connected = False
        self._thread = threading.Thread(target=self._run, name="podguard-progress-share", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def remote(self) -> tuple[float, str] | None:
        """When (this node's time.monotonic()) another node last made progress, and which; None: not yet."""
        with self._lock:
            return self._remote

    # -- the thread --------------------------------------------------------------------------------------------
    def _run(self) -> None:
        started = time.monotonic()
        said = False
        store: Any = None
        session = why = ""
        while not self._stop.is_set():
            try:
                if store is None:
                    store, fresh = self._open()
                    if store is not None and fresh != session:  # node 0 restarted: its counters start from 0
                        self._seen.clear()
                        session = fresh
                if store is not None:
                    self._exchange(store, session)
                    self.connected = True
            except Exception as exc:  # node 0 went away or is not there yet (its port taken): connect again
                store, why = None, f" ({str(exc).splitlines()[0][:120]})" if str(exc) else ""
            if store is None and not said and time.monotonic() - started > SAY_AFTER_S:
                said = True
                what = "host the progress share on" if self.settings.hosts else "reach node 0's progress share at"
                console.warn(
                    f"cannot {what} {self.settings.endpoint}{why}: this node judges a hang on its own "
                    "workers' output only"
                )
            self._stop.wait(self.interval_s)

    def _open(self) -> tuple[Any, str]:
        """Node 0: host the store and draw the session; the others: connect and read it (None while absent)."""
        TCPStore = load_store_class()
        s = self.settings
        if s.hosts:
            sock = _bind(s.port)
            options = {"timeout": _timedelta(OP_TIMEOUT_S), "wait_for_workers": False}
            try:
                store = TCPStore("127.0.0.1", s.port, None, True, master_listen_fd=sock.fileno(), **options)
                sock.detach()
            except (TypeError, RuntimeError):
                sock.close()
                store = TCPStore("127.0.0.1", s.port, None, True, **options)
            session = secrets.token_hex(8)
            store.set(SESSION_KEY, session)
            return store, session
        store = TCPStore(s.addr, s.port, None, False, timeout=_timedelta(OP_TIMEOUT_S), wait_for_workers=False)
        if not store.check([SESSION_KEY]):
            return None, ""  # node 0's gate store, not yet its share: try again
        value = store.get(SESSION_KEY)
        return store, value.decode() if isinstance(value, bytes) else str(value)

    def _exchange(self, store: Any, session: str) -> None:
        """Add this node's new progress to its counter; read the others'."""
        own = self.count()
        if own > self._sent:
            store.add(f"{ROOT}/{session}/node/{self.settings.node_rank}", own - self._sent)
            self._sent = own
        for node in range(self.settings.nnodes):
            if node == self.settings.node_rank:
                continue
            value = int(store.add(f"{ROOT}/{session}/node/{node}", 0))
            if value > self._seen.get(node, 0):
                self._seen[node] = value
                with self._lock:
                    self._remote = (time.monotonic(), f"progress on node {node}")


def share_or_none(settings: GateSettings | None, count: Callable[[], int], **kw: Any) -> ProgressShare | None:
    """A started share on a multi-node run, else None."""
    if settings is None or settings.nnodes < 2:
        return None
    share = ProgressShare(settings, count, **kw)
    with contextlib.suppress(RuntimeError):
        share.start()
    return share
