"""Critical XID events from NVML's event API, for the gate's observation window.

events = watch_xid(pynvml, handle_of, [0, 1], timeout_s=5.0, stop=threading.Event())
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
    wait_until,
)

if TYPE_CHECKING:
    import threading

__all__ = ["watch_xid"]


def _register(
    nv: ModuleType, event_set: Any, handle_of: Callable[[int], Any], indices: Sequence[int]
) -> dict[int, int]:
    """Register each GPU for XID events; handle address -> NVML index of those that could be."""
    watched: dict[int, int] = {}
    for index in indices:
        h = handle_of(index)
        if h is None:
            continue
        try:
            nv.nvmlDeviceRegisterEvents(h, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
        except nv.NVMLError as exc:
            debug("GPU %s: XID events unavailable: %s", index, describe_error(exc))
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
