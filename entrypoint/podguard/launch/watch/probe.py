"""Before a rank is called hung, look at where it waits: its Python stacks, taken off the supervisor's loop.

    probe = RankProbe(on_done=lambda results: ...)         # results: {slot: RankStacks}, on the probe's thread
    probe.start({1: StackTarget(pid, 1, 1, None, "rank 1")})
    probe.running, probe.running_for(now)                   # one probe at a time; bounded by py-spy's timeout

A rank whose heartbeats stopped while the job goes on is hung, unless its main thread waits in a collective, a
barrier or a rendezvous for the others (verdict.py names those waits): then it waits, and the rank the others are
busy with (rank 0 evaluating alone) is what holds it. One py-spy per suspect, `timeout_s` each, into a private
temporary folder that is removed after (the state dir may be a network volume). Where stacks cannot be taken (no
py-spy, no ptrace), the rank's result carries the reason and the caller judges it on its heartbeats, as before.
docs/watch.md, "A rank that waits is not hung".
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from podguard.launch.watch.stack_model import RankStacks
from podguard.launch.watch.stacks import StackTarget, capture_stacks

__all__ = ["PROBE_TIMEOUT_S", "RankProbe", "waits"]

PROBE_TIMEOUT_S = 5.0  # py-spy's own bound per suspect (the evidence of a hang gets 10 s; this is a first look)


def waits(stacks: RankStacks | None) -> bool:
    """The rank's main thread waits for the others (a collective, a barrier, a rendezvous, an async wait)."""
    return stacks is not None and stacks.error is None and not stacks.stopped and stacks.collective is not None


class RankProbe:
    """See the module docstring."""

    def __init__(self, on_done: Callable[[dict[int, RankStacks]], None], *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self._on_done = on_done
        self.timeout_s = timeout_s
        self._started: float | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def running_for(self, now: float) -> float:
        return now - self._started if self.running and self._started is not None else 0.0

    def start(self, targets: Mapping[int, StackTarget]) -> bool:
        """Take the suspects' stacks on a daemon thread; False when a probe is still running."""
        if self.running or not targets:
            return False
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(dict(targets),), name="podguard-probe", daemon=True)
        self._thread.start()
        return True

    def _run(self, targets: dict[int, StackTarget]) -> None:
        results: dict[int, RankStacks] = {}
        folder = Path(tempfile.mkdtemp(prefix="podguard-probe-"))
        try:
            slots = list(targets)
            stacks = capture_stacks([targets[s] for s in slots], folder, timeout_s=self.timeout_s)
            results = dict(zip(slots, stacks, strict=True))
        except Exception:  # a first look is best effort: the caller judges the rank on its heartbeats
            results = {}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._on_done(results)
