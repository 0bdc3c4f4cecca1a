"""Critical XID events from NVML's event API: the gate's observation window, and the run-time watch's poll.

events = watch_xid(pynvml, handle_of, [0, 1], timeout_s=5.0, stop=threading.Event())   # blocks for the window
sub = open_xid_subscription(pynvml, handle_of, [0, 1])   # one event set, kept open for the run
sub.poll()                                               # what arrived since the last poll; never waits
sub.close()
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from podguard.gpu.backend import XidEvent
from podguard.gpu.nvml_support import (
    NVML_ERROR_TIMEOUT,
    NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
    XID_WAIT_SLICE_S,
    address_of,
    debug,
    describe_error,
    error_code,
    error_name,
    wait_until,
)

if TYPE_CHECKING:
    import threading

__all__ = ["NvmlXidSubscription", "open_xid_subscription", "watch_xid"]

MAX_EVENTS_PER_POLL = 64  # a poll drains at most this many (an event storm cannot make one poll unbounded)


def _register(
    nv: ModuleType,
    event_set: Any,
    handle_of: Callable[[int], Any],
    indices: Sequence[int],
    failures: dict[int, str] | None = None,
) -> dict[int, int]:
    """Register each GPU for XID events; handle address -> NVML index of those that could be. `failures`, when
    given, gets index -> NVML error name for those that could not."""
    watched: dict[int, int] = {}
    for index in indices:
        h = handle_of(index)
        if h is None:
            if failures is not None:
                failures[index] = "no handle"
            continue
        try:
            nv.nvmlDeviceRegisterEvents(h, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
        except nv.NVMLError as exc:
            debug("GPU %s: XID events unavailable: %s", index, describe_error(exc))
            if failures is not None:
                failures[index] = error_name(error_code(exc))
            continue
        address = address_of(h)
        if address is not None:
            watched[address] = index
    return watched


def watch_xid(
    nv: ModuleType,
    handle_of: Callable[[int], Any],
    indices: Sequence[int],
    timeout_s: float,
    stop: threading.Event | None = None,
) -> list[XidEvent]:
    """Critical XID events on `indices` until `timeout_s` passes or `stop` is set.

    Returns when the window ends, not before (so callers can use it as the gate's observation window),
    also when events are unsupported ([]). Waits in slices of at most 100 ms so `stop` is prompt."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    events: list[XidEvent] = []
    event_set = None
    try:
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            debug("NVML events unavailable: %s", describe_error(exc))
        watched = _register(nv, event_set, handle_of, indices) if event_set is not None else {}
        if not watched:
            wait_until(deadline, stop)
            return events
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        while not (stop is not None and stop.is_set()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                data = wait(event_set, max(1, math.ceil(min(remaining, XID_WAIT_SLICE_S) * 1000)))
            except nv.NVMLError as exc:
                if error_code(exc) == NVML_ERROR_TIMEOUT:
                    continue
                debug("NVML event wait failed: %s", describe_error(exc))
                wait_until(deadline, stop)
                break
            index = watched.get(address_of(data.device) or -1)
            if data.eventType & NVML_EVENT_TYPE_XID_CRITICAL_ERROR and index is not None:
                events.append(XidEvent(gpu_index=index, xid=int(data.eventData), timestamp=time.time()))
    finally:
        if event_set is not None:
            with contextlib.suppress(Exception):
                nv.nvmlEventSetFree(event_set)
    return events


class NvmlXidSubscription:
    """One NVML event set registered for critical Xid events, kept open and drained without waiting.

    NVML queues each event in every set registered for its GPU, so nothing is missed between polls; a poll
    is one nvmlEventSetWait_v2 call with a 0 ms timeout when nothing arrived (about 5 µs on an H100)."""

    def __init__(self, nv: ModuleType, event_set: Any, watched: dict[int, int], unwatched: dict[int, str]) -> None:
        self._nv = nv
        self._set: Any = event_set
        self._watched = watched  # handle address -> NVML index
        self._wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        self.indices: tuple[int, ...] = tuple(sorted(set(watched.values())))
        self.unwatched = unwatched
        self.failure: str | None = None

    def poll(self) -> list[XidEvent]:
        """The Xid events that arrived since the last poll (at most MAX_EVENTS_PER_POLL; the rest stay queued).

        A wait that fails (not a timeout) ends the poll and sets `failure` to NVML's error name."""
        events: list[XidEvent] = []
        if self._set is None:
            return events
        nv = self._nv
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                data = self._wait(self._set, 0)
            except nv.NVMLError as exc:
                code = error_code(exc)
                self.failure = None if code == NVML_ERROR_TIMEOUT else error_name(code)
                break
            self.failure = None
            index = self._watched.get(address_of(data.device) or -1)
            if index is not None and data.eventType & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                events.append(XidEvent(gpu_index=index, xid=int(data.eventData), timestamp=time.time()))
        return events

    def close(self) -> None:
        event_set, self._set = self._set, None
        if event_set is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlEventSetFree(event_set)


def open_xid_subscription(
    nv: ModuleType, handle_of: Callable[[int], Any], indices: Sequence[int]
) -> NvmlXidSubscription | None:
    """An event set registered for critical Xid events on `indices`, or None when NVML cannot create one or
    register any of the GPUs (no event API here: consumer boards, old drivers, some containers)."""
    try:
        event_set = nv.nvmlEventSetCreate()
    except nv.NVMLError as exc:
        debug("NVML events unavailable: %s", describe_error(exc))
        return None
    unwatched: dict[int, str] = {}
    watched = _register(nv, event_set, handle_of, indices, unwatched)
    if not watched:
        with contextlib.suppress(Exception):
            nv.nvmlEventSetFree(event_set)
        return None
    return NvmlXidSubscription(nv, event_set, watched, unwatched)
