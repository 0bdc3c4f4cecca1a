"""The keeper's signals: SIGTERM and SIGHUP end it like Ctrl-C (the pod is left as it is, the state resumable).

with signals_raise():
    ...                      # Interrupted(signum) is raised in the main thread
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Interrupted", "signals_raise"]


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP end the keeper like Ctrl-C: the pod is left as it is, the state stays resumable."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
