"""What a waiting pod command shows on stderr: one line per step and per status change.

    progress = Progress()
    progress.say("creating llm-train: 8x NVIDIA H100 80GB HBM3 in EU-RO-1")
    progress.status(pod)          # "pod llm-train (abc123): PROVISIONING, 12s" when it changed

On a terminal the status line is rewritten in place with the elapsed time; in a log it appears once per
change. stdout stays free for the result (`--json`).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from podguard.pods.pod import Pod
from podguard.redact import redact_text

__all__ = ["Progress"]


class Progress:
    def __init__(self, out: TextIO | None = None, *, quiet: bool = False) -> None:
        self._out = out if out is not None else sys.stderr
        self._quiet = quiet
        self._tty = bool(getattr(self._out, "isatty", lambda: False)())
        self._started = time.monotonic()
        self._last: object = None
        self._open_line = False

    def say(self, text: str) -> None:
        """A step or a finding, always on its own line."""
        if self._quiet:
            return
        self._end_line()
        print(f"podguard: {redact_text(text)}", file=self._out, flush=True)

    def status(self, pod: Pod) -> None:
        """The pod's status: printed when it changes (rewritten in place on a terminal)."""
        if self._quiet:
            return
        elapsed = time.monotonic() - self._started
        self.live((pod.id, str(pod.status)), f"podguard: pod {pod.name} ({pod.id}): {pod.status}, {elapsed:.0f}s")

    def live(self, key: object, line: str, *, on_terminal: str | None = None) -> None:
        """A line that stands for "still waiting": rewritten in place on a terminal (as `on_terminal` where
        given, e.g. with a clock), printed in a log only when `key` changes."""
        if self._tty:
            print(f"\r\x1b[K{on_terminal or line}", end="", file=self._out, flush=True)
            self._open_line = True
        elif key != self._last:
            print(line, file=self._out, flush=True)
        self._last = key

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def _end_line(self) -> None:
        if self._open_line:
            print(file=self._out, flush=True)
            self._open_line = False

    def close(self) -> None:
        self._end_line()
