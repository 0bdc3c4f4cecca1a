"""The kill sequence: a signal to every live worker's process group now, SIGKILL after the grace period.

    shutdown = KillSequence(grace_s=7.0)
    shutdown.begin(workers.values(), orphans)            # SIGTERM (or the signal podguard got) now
    if shutdown.due(time.monotonic()): shutdown.kill_now(workers.values(), orphans)

Each worker is its own process group, so one `killpg` reaches everything it started (tini's model); a
worker whose leader already exited still has its group killed at SIGKILL time. docs/supervisor.md.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable

from podguard.launch.orphans import Orphans
from podguard.launch.process import Worker

__all__ = ["KillSequence"]


class KillSequence:
    """State of the shutdown: not started, stopping (SIGKILL due at `kill_at`), or killed."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.stopping = False  # the first signal was sent
        self.killed = False  # SIGKILL was sent
        self.kill_at: float | None = None

    @property
    def current_signal(self) -> int:
        """What a process that joins the job late (a new orphan, a late worker) gets now."""
        return signal.SIGKILL if self.killed else signal.SIGTERM

    def deadline(self) -> float | None:
        """When SIGKILL is due (None when not stopping, or already sent)."""
        return self.kill_at if self.stopping and not self.killed else None

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def begin(self, workers: Iterable[Worker], orphans: Orphans, signum: int = signal.SIGTERM) -> bool:
        """Send `signum` to every live worker's group and SIGTERM to leftovers; False if already stopping."""
        if self.stopping:
            return False
        self.stopping = True
        self.kill_at = time.monotonic() + self.grace_s
        for worker in workers:
            if worker.alive:
                worker.stopped_by_podguard = True
                worker.signal_group(signum)
        orphans.signal_all(signal.SIGTERM)
        return True

    def shorten(self, grace_s: float) -> None:
        """SIGKILL no later than `grace_s` from now: a deadline that came after the shutdown began (a hung job's
        end, whose budget a long --grace given to a SIGTERM must not stretch)."""
        if self.stopping and not self.killed and self.kill_at is not None:
            self.kill_at = min(self.kill_at, time.monotonic() + max(grace_s, 0.0))

    def forward(self, workers: Iterable[Worker], signum: int) -> None:
        """Exact forwarding during the shutdown: pass a repeated signal on; the deadline stays."""
        for worker in workers:
            if worker.alive:
                worker.signal_group(signum)

    def kill_now(self, workers: Iterable[Worker], orphans: Orphans) -> None:
        """SIGKILL every worker group (exited leaders too: their group may live on) and every leftover."""
        self.stopping = True
        self.killed = True
        self.kill_at = time.monotonic()
        for worker in workers:
            if worker.alive:
                worker.stopped_by_podguard = True
            worker.signal_group(signal.SIGKILL)
        orphans.signal_all(signal.SIGKILL)

    def late_joiner(self, worker: Worker) -> None:
        """A worker started while stopping (a race in a controller): stop it too."""
        worker.stopped_by_podguard = True
        worker.signal_group(self.current_signal)
