"""The supervisor's event loop: one `selectors` wait over pipes, timers and calls from helper threads.

    loop = EventLoop()
    loop.add_reader(fd, data)                   # select() hands `data` back when fd is readable
    timer = loop.call_later(5.0, on_timeout)    # timer.cancel()
    loop.call_from_thread(fn)                   # any thread: fn runs in the loop's thread soon
    for data in loop.wait(timeout): ...          # one turn: runs due timers and calls, returns ready readers

Readers can be paused as a group (back-pressure from slow output sinks) without forgetting them.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import queue
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["EventLoop", "Timer"]

_CALLS = object()  # the selector data of the calls pipe


@dataclass
class Timer:
    when: float
    fn: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class EventLoop:
    """See the module docstring. Not thread-safe except `call_from_thread` and `wake`."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._call_r, self._call_w = os.pipe()
        os.set_blocking(self._call_r, False)
        os.set_blocking(self._call_w, False)
        self._sel.register(self._call_r, selectors.EVENT_READ, _CALLS)
        self._readers: dict[int, Any] = {}  # fd -> data, registered or not (paused)
        self.paused = False

    # -- readers ----------------------------------------------------------------------------------
    def add_reader(self, fd: int, data: Any, *, pausable: bool = True) -> None:
        if pausable:
            self._readers[fd] = data
            if self.paused:
                return
        self._sel.register(fd, selectors.EVENT_READ, data)

    def remove_reader(self, fd: int) -> None:
        """Forget `fd` (before it is closed: its number may be reused at once)."""
        self._readers.pop(fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(fd)

    def set_paused(self, paused: bool) -> None:
        """Stop (or resume) watching the pausable readers; signals, calls and timers go on."""
        if paused == self.paused:
            return
        self.paused = paused
        for fd, data in self._readers.items():
            if paused:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(fd)
            else:
                self._sel.register(fd, selectors.EVENT_READ, data)

    # -- timers and calls -------------------------------------------------------------------------
    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + max(0.0, delay), fn)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    def call_from_thread(self, fn: Callable[[], None]) -> None:
        """Run `fn` in the loop's thread soon; safe to call from any thread."""
        self._calls.put(fn)
        self.wake()

    def wake(self) -> None:
        """End the current wait early; safe to call from any thread (a no-op once closed)."""
        fd = self._call_w
        if fd >= 0:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(fd, b"\0")

    def next_timer(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.fn()

    def _run_calls(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._call_r, 4096):
                pass
        while True:
            try:
                fn = self._calls.get_nowait()
            except queue.Empty:
                return
            fn()

    # -- one turn ---------------------------------------------------------------------------------
    def wait(self, timeout: float | None) -> list[Any]:
        """Wait up to `timeout` (None: until something happens); returns the data of the ready readers.
        Calls from threads run first, due timers after the readers (call `run_due()` then)."""
        ready = []
        for key, _ in self._sel.select(timeout):
            if key.data is _CALLS:
                self._run_calls()
            else:
                ready.append(key.data)
        return ready

    def run_due(self) -> None:
        self._run_timers()

    def close(self) -> None:
        self._sel.close()
        fds, self._call_r, self._call_w = (self._call_r, self._call_w), -1, -1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
