"""What podguard itself says: one place for its lines, whichever room says them.

    from podguard import console
    console.say("preflight PASS: 2 GPU(s)")        # 'podguard: preflight PASS: 2 GPU(s)' on stderr, one write
    console.warn("the metrics file cannot be written")   # 'podguard: warning: the metrics file ...'
    console.error("--gpus 9: this pod has GPUs 0-3")      # 'podguard: error: --gpus 9: ...' (a refusal)
    console.say("HUNG: ...", loud=True)            # a line that must be seen (HUNG, a GPU fault, END)
    console.line("END kind=success exit=0")        # a line as it is (already prefixed or a record for programs)
    console.status(key, "pod a (x1): STARTING, 12s")  # "still waiting": rewritten in place on a terminal,
                                                   # printed once per change of `key` in a log
    with console.tagged("keep llm-train"):         # 'podguard: keep llm-train: ...' for every line inside
        ...
    console.mask(api_key)                          # never shown again, in any line
    with console.routed(to):                       # while a supervisor runs, its terminal takes the lines
        ...                                        # (launch/console.py: the stalled-terminal rule)
    with console.captured() as lines:              # tests: what was said, as text lines
        ...

Every line is written whole in one write and flushed, under one lock: podguard's threads (the checkpoint mirror,
the metrics file, the price poller) say things while the workers' output flows, and a line must never be cut by
another. podguard's own lines go to stderr (stdout is the job's, or a command's result); `PODGUARD_QUIET=1` keeps
the ordinary ones back and lets warnings and loud lines through; every said line has its token-shaped
secrets masked (redact.py `redact_tokens`: hf_…, sk-…, rpa_…, Bearer …) and each value given to `mask`; text from
outside (a command line, a server's answer) is the caller's to redact in full (`redact_text`).
`PODGUARD_DEBUG=1` shows podguard's debug logging as `podguard: debug: ...` lines
(`debug_logging`). docs/architecture.md, "One console".
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from podguard.redact import MASK, redact_tokens

__all__ = [
    "PREFIX",
    "captured",
    "debug_logging",
    "error",
    "line",
    "mask",
    "quiet",
    "routed",
    "say",
    "settle",
    "status",
    "tagged",
    "warn",
]

PREFIX = "podguard: "

_lock = threading.RLock()
# where lines go while a supervisor's terminal takes them: (text line with "\n", loud) -> None. It is called from
# the thread that says the line; a route that owns a loop hands other threads' lines to it.
_route: Callable[[str, bool], None] | None = None
_capture: list[str] | None = None
_tags: list[str] = []
_masked: set[str] = set()
_open = False  # a status line is on the terminal without its newline
_last_status: object = object()


def quiet() -> bool:
    """PODGUARD_QUIET set to 1/true/yes: only warnings and loud lines are said."""
    return _flag("PODGUARD_QUIET")


def say(text: str, *, loud: bool = False, stream: TextIO | None = None) -> None:
    """`podguard: <text>` (each line of a multi-line text prefixed). `stream` overrides stderr (a command's
    output, a test's buffer)."""
    if not loud and quiet() and stream is None:
        return
    line(_prefixed(_scrubbed(text)), loud=loud, stream=stream)


def warn(text: str, *, stream: TextIO | None = None) -> None:
    """`podguard: warning: <text>`; never kept back by quiet."""
    line(_prefixed(f"warning: {_scrubbed(text)}"), loud=True, stream=stream)


def error(text: str, *, stream: TextIO | None = None) -> None:
    """`podguard: error: <text>`: why a command refused or failed (one line naming the bad value); never kept
    back by quiet."""
    line(_prefixed(f"error: {_scrubbed(text)}"), loud=True, stream=stream)


def line(text: str, *, loud: bool = False, stream: TextIO | None = None) -> None:
    """A line as it is, in one write. Never raises: a closed or broken stderr loses the line, not the run."""
    data = text if text.endswith("\n") else text + "\n"
    with _lock:
        data = _unmasked(data)
        if _capture is not None:
            _capture.extend(data.rstrip("\n").split("\n"))
            return
        if stream is None and _route is not None:
            _route(data, loud)
            return
        target = stream if stream is not None else sys.stderr
        if target is sys.stderr:
            _close_status()
        _write(target, data)


def status(key: object, text: str, *, live: str | None = None) -> None:
    """A line that stands for "still waiting" (a pod's status, a keeper's watch): on a terminal it is rewritten in
    place (as `live` where given, e.g. with a clock); elsewhere it is printed only when `key` changes. Any other
    line ends it first, so a status never runs into a later line."""
    global _open, _last_status
    if quiet():
        return
    shown = _prefixed(_scrubbed(text))
    with _lock:
        changed = key != _last_status
        _last_status = key
        if _capture is not None or _route is not None or not _isatty(sys.stderr):
            if changed:
                line(shown)
            return
        on_terminal = _prefixed(_scrubbed(live)) if live else shown
        _open = _write(sys.stderr, "\r\x1b[K" + _unmasked(on_terminal))


def settle() -> None:
    """End a status line left open on the terminal (before a command prints its result, and at exit)."""
    with _lock:
        _close_status()


@contextmanager
def tagged(tag: str) -> Iterator[None]:
    """Every line said inside the block reads `podguard: <tag>: <text>` (a keeper's lines: "keep llm-train")."""
    with _lock:
        _tags.append(tag)
    try:
        yield
    finally:
        with _lock:
            _tags.remove(tag)


def mask(secret: str) -> None:
    """Never show `secret` (an API key read from the environment) in any line from now on; short values (under 8
    characters) are not masked: they would mask ordinary words."""
    if len(secret) >= 8:
        with _lock:
            _masked.add(secret)


@contextmanager
def routed(to: Callable[[str, bool], None]) -> Iterator[None]:
    """podguard's lines go to `to(line, loud)` inside the block (the supervisor's terminal), then back."""
    global _route
    with _lock:
        _close_status()
        before, _route = _route, to
    try:
        yield
    finally:
        with _lock:
            _route = before


@contextmanager
def captured() -> Iterator[list[str]]:
    """The lines said inside the block, without the newline (for tests and for commands that print them later)."""
    global _capture, _last_status
    lines: list[str] = []
    with _lock:
        before, _capture = _capture, lines
        _last_status = object()
    try:
        yield lines
    finally:
        with _lock:
            _capture = before


def debug_logging() -> None:
    """With PODGUARD_DEBUG=1, podguard's loggers (`podguard.*`, debug level: why the GPU watch is off, a poll that
    failed) speak through the console as `podguard: debug: <logger>: <message>`; otherwise they stay silent."""
    root = logging.getLogger("podguard")
    if not _flag("PODGUARD_DEBUG") or any(isinstance(h, _DebugLines) for h in root.handlers):
        return
    root.addHandler(_DebugLines())
    root.setLevel(logging.DEBUG)


class _DebugLines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            say(f"debug: {record.name.removeprefix('podguard.')}: {record.getMessage()}", loud=True)
        except Exception:  # a bad format string in a debug call must not stop the run
            self.handleError(record)


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _scrubbed(text: str) -> str:
    with _lock:
        tags = list(_tags)
    if tags:
        text = "\n".join(f"{': '.join(tags)}: {part}" for part in text.split("\n"))
    return redact_tokens(text)


def _unmasked(text: str) -> str:
    for secret in _masked:
        text = text.replace(secret, MASK)
    return text


def _prefixed(text: str) -> str:
    return "\n".join(part if part.startswith(PREFIX) else PREFIX + part for part in text.split("\n"))


def _close_status() -> None:
    global _open
    if _open:
        _open = False
        _write(sys.stderr, "\n")


def _write(target: TextIO, data: str) -> bool:
    try:
        target.write(data)
        target.flush()
        return True
    except (OSError, ValueError):
        return False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False


atexit.register(settle)
