"""The GPU fault watch's NVML calls on a thread of their own, never on the supervisor's loop.

    poller = GpuPoller(watch, interval_s=1.0, after_poll=read_gauges, on_faults=wake_the_loop)
    poller.start()
    faults = poller.take()              # on the loop: the faults polled since the last take (never blocks)
    faults = poller.poll_now(0.5)       # a worker just died: one fresh poll, waited for at most 0.5 s
    if (s := poller.stuck_s()) is not None and s >= NVML_STALL_S: ...   # an NVML call that has not returned
    poller.close(1.0)

NVML can block for seconds (GSP timeouts, an Xid 79 in progress) or never return; on the loop that would
freeze output, signals and the hang watch. Here a call that does not return is itself a finding: the loop
sees how long the call has been in flight (`stuck_s`) and says the GPU is not answering; the thread is a
daemon and is given up at the end (the watch is then not closed: closing would call NVML too). A poll that found
faults calls `on_faults()` at once (the loop takes them then, not at its next tick: a fatal Xid ends the job
within about a second of the poll that saw it). docs/watch.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podguard.launch.watch.gpu_faults import GpuFault, GpuFaultWatch

__all__ = ["NVML_STALL_S", "GpuPoller"]

log = logging.getLogger("podguard.watch")

NVML_STALL_S = 10.0  # an NVML poll in flight this long: the GPU (or its driver) is not answering


class GpuPoller:
    """See the module docstring. `after_poll(watch)`: called on the thread after each poll (the metrics'
    GPU gauges, through the same NVML session); its errors are logged, never raised. `on_faults()`: called on the
    thread after a poll that found faults (the caller wakes its loop: `take()` them there)."""

    def __init__(
        self,
        watch: GpuFaultWatch,
        interval_s: float,
        after_poll: Callable[[GpuFaultWatch], None] | None = None,
        on_faults: Callable[[], None] | None = None,
    ) -> None:
        self.watch = watch
        self.interval_s = interval_s
        self.after_poll = after_poll
        self.on_faults = on_faults
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._faults: list[GpuFault] = []
        self._asked = 0  # polls asked for by poll_now
        self._done = 0  # polls finished
        self._busy_since: float | None = None  # when the poll now in flight started
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="podguard-gpu-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stop:
                    return
                self._busy_since = time.monotonic()
            faults = self._poll()
            with self._lock:
                self._busy_since = None
                self._faults.extend(faults)
                self._done += 1
                self._wake.notify_all()
            if faults and self.on_faults is not None:
                self._call(self.on_faults)
            with self._lock:
                if self._asked <= self._done:  # nobody waits for a fresh poll: sleep until the next
                    self._wake.wait_for(lambda: self._stop or self._asked > self._done, self.interval_s)

    def _poll(self) -> list[GpuFault]:
        faults = self.watch.poll()  # never raises by design
        if self.after_poll is not None:
            self._call(lambda: self.after_poll(self.watch))  # type: ignore[misc]
        return faults

    @staticmethod
    def _call(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:
            log.debug("GPU watch: a callback failed: %s", exc)

    def take(self) -> list[GpuFault]:
        """The faults polled since the last take (the loop thread; never blocks on NVML)."""
        with self._lock:
            faults, self._faults = self._faults, []
        return faults

    def poll_now(self, timeout_s: float) -> list[GpuFault]:
        """Ask for a fresh poll and wait for it at most `timeout_s`; then `take()`."""
        if self._thread.is_alive():
            with self._lock:
                self._asked = target = max(self._asked, self._done + 1)
                self._wake.notify_all()
                self._wake.wait_for(lambda: self._done >= target, timeout_s)
        return self.take()

    def stuck_s(self) -> float | None:
        """How long the poll now in flight has run (None: none in flight)."""
        with self._lock:
            since = self._busy_since
        return None if since is None else time.monotonic() - since

    def close(self, timeout_s: float) -> bool:
        """Stop the thread (waiting at most `timeout_s`) and close the watch; False when an NVML call still
        has not returned (then the watch is left open: closing it would call NVML too)."""
        with self._lock:
            self._stop = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        self.watch.close()
        return True
