"""podguard's lines while a supervisor runs: its terminal takes them, in order with the workers' lines.

    route = TerminalRoute(printer, loop)   # made in the loop's thread
    with console.routed(route):            # every console.say/warn/line of the run comes here, from any thread
        ...                                # the loop runs
        route.close()                      # before the printer finishes; a line said after it goes to stderr

A line said in the loop's thread is written at once (`Printer.message`: it ends a worker's half line first, and a
loud one also reaches stderr while stdout is stalled: console.py). A line said in another thread (the checkpoint
mirror, the metrics file writer, the price poller, a share of the nodes' progress) is queued and handed to the loop
(`call_from_thread`): the printer is the loop's alone. Once the route is closed (the loop is ending), a line goes
straight to stderr: none is lost. The caller holds the console's lock while it calls the route; the route never
waits on another thread (a queue and a non-blocking wake-up), so no thread can deadlock on it.
docs/supervisor.md, "The terminal".
"""

from __future__ import annotations

import sys
import threading

from podguard import console
from podguard.launch.loop import EventLoop
from podguard.launch.printer import Printer

__all__ = ["TerminalRoute"]


class TerminalRoute:
    """See the module docstring. Call it as `route(line_with_newline, loud)` (console.routed's `to`)."""

    def __init__(self, printer: Printer, loop: EventLoop) -> None:
        self._printer = printer
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._lock = threading.Lock()  # the queue and `_open`; taken after the console's lock, never before
        self._pending: list[tuple[str, bool]] = []
        self._open = True

    def __call__(self, data: str, loud: bool) -> None:
        if threading.get_ident() == self._loop_thread:
            if self._open:
                self._write_pending()  # (what another thread said first comes first)
                self._printer.message(data, loud=loud)
                return
        else:
            with self._lock:
                if self._open:
                    self._pending.append((data, loud))
                    if len(self._pending) == 1:
                        self._loop.call_from_thread(self._write_pending)
                    return
        console.line(data, loud=loud, stream=sys.stderr)

    def close(self) -> None:
        """In the loop's thread, before the printer finishes: what the threads said is written; from now on a line
        goes to stderr."""
        with self._lock:
            self._open = False
            lines, self._pending = self._pending, []
        for data, loud in lines:
            self._printer.message(data, loud=loud)

    def _write_pending(self) -> None:
        """In the loop's thread: the lines the other threads said, in their order."""
        with self._lock:
            if not self._open:
                return
            lines, self._pending = self._pending, []
        for data, loud in lines:
            self._printer.message(data, loud=loud)
