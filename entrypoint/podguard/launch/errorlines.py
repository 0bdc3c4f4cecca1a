"""Tracebacks in a worker's output: the first one (the root cause), and torch elastic's SignalException condensed.

    first = FirstError()
    first.feed(b"Traceback (most recent call last):\\n  File \\"x.py\\", line 1\\nValueError: boom\\n")
    first.lines    # ('Traceback (most recent call last):', '  File "x.py", line 1', 'ValueError: boom')
    first.went_on(time.monotonic())   # output after it: a traceback the job outlived a minute is forgotten
    SignalTraceback().feed(lines)   # the terminal's lines, with torchrun's ~25-line SignalException as one line

Where a framework starts the ranks itself (single mode), every rank writes into the one pipe: when one rank
raises, the others fail a moment later (`Connection closed by peer`), and their lines are the last ones. The
root cause is the first error by time, which is the first traceback in the stream. A traceback's lines are
told apart from interleaved lines of other ranks by the prefix its first line had (`rank1: `), if any. A
traceback the job outlived is no root cause (`logging.exception` in a retry loop, a hub download retried): once
output went on arriving in more than SURVIVED_SPANS distinct SPAN_S-second spans after it (a minute of a job that
kept working; ranks failing one after the other all print within seconds, and ranks left stuck in a collective
print nothing until their timeout), it is forgotten and the next traceback is the candidate.

When the job is stopped (podguard's SIGTERM after a hang verdict, a `docker stop`), torchrun's agent prints the
traceback of the SignalException it raises to unwind: ~25 lines after podguard's own verdict that say nothing
but "got signal 15". On the terminal they become one line; the log file keeps them.
"""

from __future__ import annotations

import re

__all__ = ["FirstError", "SignalTraceback"]

HEADER = b"Traceback (most recent call last):"
_PREFIX = re.compile(r"(?:\[?[\w.-]+\]?:\s?)?$")  # a rank's line prefix (`[rank1]: `, `rank1:`) ending the text
_SIGNAL_END = re.compile(rb"^\S*SignalException: Process \d+ got signal: (\d+)")
MAX_HELD = 400  # lines a held traceback may have before it is shown as is
MAX_LINES = 200  # a traceback that never ends (or is huge) is given up after this many lines
KEEP_FRAMES = 8  # frame lines kept before the exception line (the innermost ones)
SPAN_S = 10.0  # output after the first traceback is counted in spans of this many seconds
SURVIVED_SPANS = 6  # output in more spans than this after it: the job outlived that traceback


class FirstError:
    """Watches complete lines until the first traceback has ended; then `lines` holds it (shortened)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.lines: tuple[str, ...] = ()
        self.done = False
        self._prefix: str | None = None  # set while inside the first traceback
        self._body: list[str] = []
        self._seen = 0
        self._span = -1  # the last span in which output came after the traceback ended
        self._spans = 0  # how many distinct spans had output after it

    def went_on(self, now: float) -> None:
        """Output arrived at `now` (monotonic seconds) after the first traceback: forget a traceback the job
        outlived (module docstring)."""
        span = int(now // SPAN_S)
        if span != self._span:
            self._span = span
            self._spans += 1
            if self._spans > SURVIVED_SPANS:
                self._reset()

    @property
    def inside(self) -> bool:
        """Inside the first traceback: every further line matters, whether it holds HEADER or not."""
        return self._prefix is not None and not self.done

    def feed(self, data: bytes) -> None:
        """`data`: complete lines, each ending in a newline."""
        if self.done:
            return
        if self._prefix is None:
            at = data.find(HEADER)
            if at < 0:
                return
            start = data.rfind(b"\n", 0, at) + 1
            data = data[start:]
        for raw in data[:-1].split(b"\n"):
            line = raw.decode("utf-8", "replace")
            if self._prefix is None:
                if HEADER.decode() in line:
                    before = line[: line.index(HEADER.decode())]
                    match = _PREFIX.search(before)
                    self._prefix = match[0] if match else ""
                    self._body = [self._prefix + HEADER.decode()]  # (not a bar line it was written after)
                continue
            if not line.startswith(self._prefix):
                continue  # another process's line, between this traceback's lines
            rest = line[len(self._prefix) :]
            self._seen += 1
            if rest and not rest[0].isspace() and not rest.startswith(HEADER.decode()):
                self._finish(line)
                return
            self._body.append(line)
            if self._seen >= MAX_LINES:
                self.done = True
                return

    def _finish(self, last: str) -> None:
        header, frames = self._body[0], self._body[1:]
        if len(frames) > KEEP_FRAMES:
            frames = [f"{self._prefix}  ...", *frames[-KEEP_FRAMES:]]
        self.lines = (header, *frames, last)
        self.done = True


class SignalTraceback:
    """A terminal filter: a traceback (unprefixed, at a line start) that ends in torch elastic's SignalException
    becomes one line. Other tracebacks pass unchanged, held only until their last line."""

    def __init__(self) -> None:
        self.held: list[bytes] | None = None

    def feed(self, lines: bytes) -> bytes:
        """`lines`: complete lines, each ending in a newline; returns the lines to show."""
        if self.held is None and HEADER not in lines:
            return lines
        out: list[bytes] = []
        for line in lines[:-1].split(b"\n"):
            if self.held is None:
                if line == HEADER:
                    self.held = [line]
                else:
                    out.append(line)
                continue
            if line.startswith((b" ", b"\t")) and len(self.held) < MAX_HELD:
                self.held.append(line)
                continue
            if m := _SIGNAL_END.match(line):
                out.append(
                    b"torch elastic stopped by signal %s (its SignalException traceback: in the log file)" % m[1]
                )
            else:
                out.extend([*self.held, line])
            self.held = None
        return b"\n".join(out) + b"\n" if out else b""

    def flush(self) -> bytes:
        """The lines still held (the stream ended inside a traceback)."""
        held, self.held = self.held, None
        return b"\n".join(held) + b"\n" if held else b""
