"""Hold back SIGTERM / SIGINT / SIGHUP while processes are frozen (SIGSTOP) by the cleanup, then act on them.

    with deferred_signals():
        freeze(); terminate(); thaw()
    # a signal that arrived meanwhile is delivered here, to whatever handler was installed before

Without this, a `docker stop` arriving between SIGSTOP and SIGCONT/SIGKILL would end podguard with the
holders still stopped (state T, GPU memory held). Outside the main thread it does nothing (Python only
lets the main thread install handlers, and signals are only delivered there).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["DEFERRED", "deferred_signals"]

DEFERRED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def deferred_signals(signals: tuple[signal.Signals, ...] = DEFERRED) -> Iterator[list[int]]:
    """Record the listed signals instead of acting on them; on exit restore the handlers and re-raise each
    recorded signal once, in arrival order. Yields the list of signals received so far."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if signum not in pending:
            pending.append(signum)

    previous: dict[int, object] = {}
    try:
        for sig in signals:
            before = signal.getsignal(sig)
            signal.signal(sig, hold)
            previous[sig] = signal.SIG_DFL if before is None else before  # None: installed outside Python
        yield pending
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        for signum in pending:
            signal.raise_signal(signum)
