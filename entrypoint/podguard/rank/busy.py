"""Announce a long save or evaluation to podguard's hang watch: not a hang, up to a bound.

    from podguard.rank import busy
    with busy("saving", max_s=1800):       # this rank saves for up to 30 min: no heartbeat needed meanwhile
        trainer.save_checkpoint(path)

    work = busy("evaluating")             # across callbacks: start() here, end() there
    work.start(); ...; work.end()

While a rank is busy (and for at most `max_s`, default 1 h), podguard counts it as making progress: its own
heartbeats may stop, and the job is not hung for its silence. Past `max_s` the announcement no longer holds the
hang clock (a save that never ends is still found). Nested announcements keep the outermost one. The cost is two
memory stores into the heartbeat board (no system call); outside podguard it does nothing. Standard library only.
docs/rank.md, "busy".
"""

from __future__ import annotations

import math
import struct
import time
from types import TracebackType

from podguard.rank.progress import BUSY, mapped_slot

__all__ = ["DEFAULT_MAX_S", "busy"]

DEFAULT_MAX_S = 3600.0
_depth = 0  # announcements open in this process (the outermost one is on the board)


class busy:  # (lower case: used like a function, `with busy("saving"):`)
    """See the module docstring. `max_s` must be a positive number of seconds (ValueError otherwise)."""

    def __init__(self, what: str = "busy", max_s: float = DEFAULT_MAX_S) -> None:
        if not isinstance(max_s, int | float) or not math.isfinite(max_s) or max_s <= 0:
            raise ValueError(f"busy(max_s={max_s!r}): expected a positive number of seconds (the bound of the wait)")
        self.what = str(what)
        self.max_s = float(max_s)
        self._open = False

    def start(self) -> busy:
        """Begin (idempotent: a second start() of the same announcement does nothing)."""
        global _depth
        if self._open:
            return self
        self._open = True
        _depth += 1
        if _depth == 1:
            self._write(time.monotonic(), 0.0)
        return self

    def end(self) -> None:
        """End (idempotent); the rank's progress resumes from now."""
        global _depth
        if not self._open:
            return
        self._open = False
        _depth -= 1
        if _depth == 0:
            self._write(None, time.monotonic())

    def __enter__(self) -> busy:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.end()

    def _write(self, since: float | None, ended: float) -> None:
        mapped = mapped_slot()
        if mapped is None or mapped[2] < 0:
            return
        mm, _, offset = mapped
        try:
            if since is None:  # the end: only `ended` changes (the reader keeps since, bound and what)
                struct.pack_into("<d", mm, offset + 8, ended)
            else:
                BUSY.pack_into(mm, offset, since, 0.0, self.max_s, self.what.encode("utf-8", "replace")[:12])
        except (ValueError, struct.error):  # the board was closed under us (interpreter shutdown): never raise
            pass
