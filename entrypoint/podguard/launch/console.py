"""podguard's terminal: the one place that writes to stdout (and, when stdout stalls, to stderr), with one rule:
the terminal never holds the watch back.

    console = Console(sys.stdout, background=True, on_drained=wake_loop)
    console.show([b"GPU0:step 1\\n"])                  # the workers' lines: dropped, counted while stdout stalls
    console.say(b"podguard: HUNG: ...\\n", loud=True)  # podguard's own; a loud one also to stderr if stdout stalls
    console.congested                                  # behind but moving (a slow terminal): stop reading the workers
    console.close(stall_s=1.0, cap_s=3.0)              # bounded; what stdout missed is said once

A terminal that is slow but moving holds the workers back as a terminal always does (back-pressure: `congested`).
One that takes nothing for `stall_s` (a log collector that stopped reading, a FIFO nobody reads, a terminal paused
with Ctrl-S) or went away (EPIPE) is **stalled**: from then on the workers' lines are not queued for it but
counted (their log files and the watch still get every line: the printer reads the workers on), podguard says so
once on stderr, and podguard's loud lines (HUNG, the hang summary, a GPU fault, the job's end and its summary) go to
stderr too, including the loud ones still waiting in stdout's queue. When stdout takes bytes again it gets the
workers' lines again. At the end, the count of the lines it missed is said once. docs/supervisor.md, "The
terminal".
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import BinaryIO, TextIO

from podguard.launch.sinks import HIGH_WATER, LOW_WATER, TerminalSink

__all__ = ["STALL_S", "Console"]

STALL_S = 3.0  # stdout that took no byte for this long while bytes waited for it is stalled


class Console:
    """See the module docstring. `err`: where loud lines go while stdout is stalled (default: sys.stderr)."""

    def __init__(
        self,
        terminal: BinaryIO | TextIO | int | None = None,
        *,
        err: BinaryIO | TextIO | int | None = None,
        background: bool = False,
        on_drained: Callable[[], None] | None = None,
        stall_s: float = STALL_S,
    ) -> None:
        self._out = TerminalSink(terminal, background=background, on_drained=on_drained)
        self._err_target = err
        self._err: TerminalSink | None = None  # opened at the first line for it
        self._background = background
        self.stall_s = stall_s
        self.stalled = False
        self.ever_stalled = False
        self.missed_lines = 0  # the workers' lines stdout did not get
        self.missed_bytes = 0
        self._submitted = 0  # bytes handed to stdout so far
        self._loud: deque[tuple[int, bytes]] = deque()  # loud lines handed to stdout and not written yet: (end, line)
        self._told = False  # the stall was said (once)

    def isatty(self) -> bool:
        return self._out.isatty()

    @property
    def congested(self) -> bool:
        """Behind but moving: the caller stops reading the workers until it drained. Never while stalled."""
        return self._out.congested and not self.stalled

    @property
    def backlog(self) -> int:
        return self._out.backlog

    def show(self, bufs: list[bytes]) -> None:
        """The workers' output (whole lines): for stdout, unless it is stalled (then counted, not kept)."""
        self.check()
        if self.stalled:
            self.missed_lines += sum(buf.count(b"\n") for buf in bufs)
            self.missed_bytes += sum(map(len, bufs))
            return
        self._put(bufs)

    def say(self, data: bytes, *, loud: bool = False) -> None:
        """podguard's own line(s). A loud one also goes to stderr when stdout is stalled (now or later, while it
        waits in stdout's queue)."""
        self.check()
        if self.stalled and not loud and self._out.backlog > HIGH_WATER:
            return  # (stdout's queue is bounded: a stalled one keeps only the loud lines beyond this)
        self._put([data])
        if loud:
            if self.stalled:
                self._to_err(data)
            elif self._background:
                self._loud.append((self._submitted, data))

    def check(self, now: float | None = None) -> None:
        """Notice a stall (or its end); called at each write and each turn of the supervisor's loop."""
        if not self._background:
            return
        now = time.monotonic() if now is None else now
        written = self._out.written
        while self._loud and self._loud[0][0] <= written:
            self._loud.popleft()
        stuck = self._out.broken or self._out.stuck_s(now) >= self.stall_s
        if stuck and not self.stalled:
            self.stalled = self.ever_stalled = True
            if not self._told:
                self._told = True
                idle = f"is not being read (nothing written for {self.stall_s:g} s)"
                why = "was closed" if self._out.broken else idle
                self._to_err(
                    f"podguard: warning: stdout {why}: the workers' lines go on to their log files and are counted "
                    "here; podguard's HUNG, summary and END lines also go to stderr\n".encode()
                )
            for _, line in self._loud:  # what is stuck in stdout's queue
                self._to_err(line)
            self._loud.clear()
        elif self.stalled and not self._out.broken and self._out.backlog <= LOW_WATER and not stuck:
            self.stalled = False  # it reads again: the workers' lines go to it again

    def close(self, *, stall_s: float = 1.0, cap_s: float = 3.0) -> bool:
        """Flush (bounded); loud lines stdout never took go to stderr; what it missed is said once. True when
        everything queued for stdout was written."""
        self.check()
        if self.missed_lines or self.missed_bytes:
            self.say(
                f"podguard: stdout missed {self.missed_lines} line(s) of the workers ({self.missed_bytes} bytes) "
                "while it was not being read; every line is in the log files\n".encode(),
                loud=True,
            )
        done = self._out.close(stall_s=stall_s, cap_s=cap_s)
        if not done or self._out.broken:
            written = self._out.written
            for end, line in self._loud:
                if end > written:
                    self._to_err(line)
        self._loud.clear()
        if self._err is not None:
            self._err.close(stall_s=stall_s, cap_s=cap_s)
        return done

    def _put(self, bufs: list[bytes]) -> None:
        self._submitted += sum(map(len, bufs))
        self._out.submit(bufs)

    def _to_err(self, data: bytes) -> None:
        if self._err is None:
            target = self._err_target if self._err_target is not None else sys.stderr
            self._err = TerminalSink(target, background=self._background)
        self._err.submit([data])
