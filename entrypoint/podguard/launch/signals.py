"""Route signals into the supervisor's event loop through a wakeup fd, and put everything back after.

    router = SignalRouter()                  # main thread only
    selector.register(router.rfd, EVENT_READ)
    for signum in router.read(): ...         # in the loop, never inside a handler
    router.restore()

The C-level handler writes each signal number to the wakeup pipe; the Python handlers are no-ops. The
wakeup fd is set *before* the handlers are installed: a signal that arrives in between then still
reaches the loop (handlers first would swallow it in a no-op with nothing written). On restore the
handlers go first, then the wakeup fd.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["HANDLED", "PASSED_THROUGH", "TERMINATING", "SignalRouter", "signal_name"]

TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PASSED_THROUGH = (signal.SIGUSR1, signal.SIGUSR2)
HANDLED = (*TERMINATING, *PASSED_THROUGH, signal.SIGCHLD)


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _noop(signum: int, frame: object) -> None:
    """The real work happens in the loop, which the wakeup fd woke up."""


class SignalRouter:
    """Signals -> bytes on `rfd`. Construct in the main thread; `restore()` undoes everything."""

    def __init__(self, handled: tuple[int, ...] = HANDLED) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("podguard's supervisor must run in the main thread (it handles signals)")
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        self._handled = handled
        self._old_handlers = {sig: signal.getsignal(sig) for sig in handled}
        self._old_wakeup = signal.set_wakeup_fd(self.wfd, warn_on_full_buffer=False)  # first: see the docstring
        for sig in handled:
            signal.signal(sig, _noop)

    def read(self) -> list[int]:
        """The signal numbers received since the last call, in order."""
        got: list[int] = []
        while True:
            try:
                data = os.read(self.rfd, 4096)
            except BlockingIOError:
                return got
            if not data:
                return got
            got.extend(data)

    def restore(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._old_wakeup)
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
