"""What podguard itself says: one place for its lines, whichever room says them.

    from podguard import console
    console.say("preflight PASS: 2 GPU(s)")        # 'podguard: preflight PASS: 2 GPU(s)' on stderr, one write
    console.warn("the metrics file cannot be written")   # 'podguard: warning: the metrics file ...'
    console.say("HUNG: ...", loud=True)            # a line that must be seen (HUNG, a GPU fault, END)
    console.line("END kind=success exit=0")        # a line as it is (already prefixed or a record for programs)
    with console.routed(term_say):                 # while the supervisor runs: its terminal takes the lines
        ...                                        # (launch/console.py: the stalled-terminal rule)
    with console.captured() as lines:              # tests: what was said, as text lines
        ...

Every line is written whole in one write and flushed, under one lock: podguard's threads (the checkpoint mirror,
the metrics file, the price poller) say things while the workers' output flows, and a line must never be cut by
another. podguard's own lines go to stderr (stdout is the job's); `PODGUARD_QUIET=1` keeps the ordinary ones back
and lets warnings and loud lines through. docs/architecture.md, "One console".
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["PREFIX", "captured", "line", "quiet", "routed", "say", "warn"]

PREFIX = "podguard: "

_lock = threading.RLock()
# where lines go while a supervisor's terminal takes them: (text line with "\n", loud) -> None
_route: Callable[[str, bool], None] | None = None
_capture: list[str] | None = None


def quiet() -> bool:
    """PODGUARD_QUIET set to 1/true/yes: only warnings and loud lines are said."""
    return os.environ.get("PODGUARD_QUIET", "").strip().lower() in ("1", "true", "yes", "on")


def say(text: str, *, loud: bool = False, stream: TextIO | None = None) -> None:
    """`podguard: <text>` (each line of a multi-line text prefixed). `stream` overrides stderr (a command's
    output, a test's buffer)."""
    if not loud and quiet() and stream is None:
        return
    line(_prefixed(text), loud=loud, stream=stream)


def warn(text: str, *, stream: TextIO | None = None) -> None:
    """`podguard: warning: <text>`; never kept back by quiet."""
    line(_prefixed(f"warning: {text}"), loud=True, stream=stream)


def line(text: str, *, loud: bool = False, stream: TextIO | None = None) -> None:
    """A line as it is, in one write. Never raises: a closed or broken stderr loses the line, not the run."""
    data = text if text.endswith("\n") else text + "\n"
    with _lock:
        if _capture is not None:
            _capture.extend(data.rstrip("\n").split("\n"))
            return
        if stream is None and _route is not None:
            _route(data, loud)
            return
        target = stream if stream is not None else sys.stderr
        try:
            target.write(data)
            target.flush()
        except (OSError, ValueError):
            pass


@contextmanager
def routed(to: Callable[[str, bool], None]) -> Iterator[None]:
    """podguard's lines go to `to(line, loud)` inside the block (the supervisor's terminal), then back."""
    global _route
    with _lock:
        before, _route = _route, to
    try:
        yield
    finally:
        with _lock:
            _route = before


@contextmanager
def captured() -> Iterator[list[str]]:
    """The lines said inside the block, without the newline (for tests and for commands that print them later)."""
    global _capture
    lines: list[str] = []
    with _lock:
        before, _capture = _capture, lines
    try:
        yield lines
    finally:
        with _lock:
            _capture = before


def _prefixed(text: str) -> str:
    return "\n".join(part if part.startswith(PREFIX) else PREFIX + part for part in text.split("\n"))
