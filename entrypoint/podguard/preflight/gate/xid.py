"""Collect XID events in a background thread while the probe children run.

    watcher = XidWatcher(backend, [0, 1], timeout_s=61.0)   # start it after the probe children exist
    events = watcher.stop()

NVML's event wait blocks; `stop` ends the wait within the backend's 100 ms slice as soon as the probes
are done, so the gate window costs no more than the probes themselves.
"""

from __future__ import annotations

import logging
import threading

from podguard.gpu.backend import GpuBackend, XidEvent

__all__ = ["XidWatcher"]

log = logging.getLogger("podguard.gate")


class XidWatcher:
    """A daemon thread running `backend.watch_xid` until `stop()`; a watcher failure never fails the gate."""

    def __init__(self, backend: GpuBackend, indices: list[int], timeout_s: float) -> None:
        self._events: list[XidEvent] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(backend, indices, timeout_s), name="podguard-xid", daemon=True
        )
        self._thread.start()

    def _run(self, backend: GpuBackend, indices: list[int], timeout_s: float) -> None:
        try:
            self._events.extend(backend.watch_xid(indices, timeout_s, stop=self._stop))
        except Exception as exc:  # a watcher failure must never fail the gate by itself
            log.debug("XID watch failed: %s", exc)

    def stop(self) -> list[XidEvent]:
        self._stop.set()
        self._thread.join(timeout=0.5)
        return list(self._events)
