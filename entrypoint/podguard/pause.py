"""Waiting for SIGTERM/SIGINT/SIGHUP without losing one: the restart-loop pause, `--on-exit idle`, parking.

    with signals_held() as watched:      # a signal that arrives while printing stays pending
        print("pausing 10 s")
        got = next_signal(watched, 10.0)  # the signal number, or None after 10 s

As PID 1 the pause also reaps orphans (SIGCHLD), and a handler is installed so that PID 1 does not have the
signals discarded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

__all__ = ["WAKE_SIGNALS", "next_signal", "signals_held", "wait_for_signal"]

WAKE_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _noop(signum: int, frame: object) -> None:
    """A handler, so that PID 1 does not have these signals discarded."""


def _reap_all() -> None:
    """As PID 1, every orphan in the container is ours to reap."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@contextlib.contextmanager
def signals_held() -> Iterator[set[signal.Signals]]:
    """Block SIGTERM/SIGINT/SIGHUP (and SIGCHLD as PID 1) with handlers installed, for as long as a pause
    lasts: one that arrives while podguard is printing stays pending instead of being lost (PID 1 would
    otherwise discard it) or killing podguard mid-line."""
    watched = set(WAKE_SIGNALS)
    if os.getpid() == 1:
        watched.add(signal.SIGCHLD)
    old = {sig: signal.getsignal(sig) for sig in watched}
    for sig in watched:
        signal.signal(sig, _noop)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        yield watched
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def next_signal(watched: set[signal.Signals], timeout: float | None) -> int | None:
    """The next held signal within `timeout` s (None = forever), reaping orphans as PID 1; or None."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if deadline is None:
            info = signal.sigwaitinfo(watched)
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            info = signal.sigtimedwait(watched, left)
            if info is None:
                return None
        if info.si_signo == signal.SIGCHLD:
            _reap_all()
            continue
        return info.si_signo


def wait_for_signal(timeout: float | None) -> int | None:
    """Wait up to `timeout` s (None = forever) for SIGTERM/SIGINT/SIGHUP; the signal, or None."""
    with signals_held() as watched:
        return next_signal(watched, timeout)
