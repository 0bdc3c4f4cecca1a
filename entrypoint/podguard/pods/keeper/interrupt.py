"""The keeper's signals: SIGTERM and SIGHUP end it like Ctrl-C (the pod is left as it is, the state resumable).

with signals_raise():
    ...                      # Interrupted(signum) is raised in the main thread
    with held():
        target.create(...)   # a SIGTERM now waits for the create's answer, then is raised at the block's end

A create cut by a signal may still be made by RunPod after the keeper is gone: `pod down` ending the keeper would
then look the name up too early and leave the new pod billing. Held, the create's answer arrives first (the keeper
remembers the pod, or a keeper started again adopts it by name) and `pod down`, which waits for the keeper to end,
finds it.

Once the keeper is ending (the first signal was raised, or it read the user's new word: `ending()`), a signal is
let go, never raised: `pod down` writes its word and then signals the keeper, and a keeper that read the word first
was killed by that SIGTERM half-way through writing its last state (the handler was gone, or raised again).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Interrupted", "ending", "held", "signals_raise"]

_held: list[int] | None = None  # inside held(): the signals that came meanwhile
_ending = False  # the keeper is ending: a signal now is let go (never raised)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP end the keeper like Ctrl-C: the pod is left as it is, the state stays resumable."""

    global _ending

    def handler(signum: int, _frame: object) -> None:
        if _held is not None:
            _held.append(signum)
            return
        if _ending:
            return
        ending()
        raise Interrupted(signum)

    _ending = False
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _ending = False


def ending() -> None:
    """The keeper is ending (a signal, or the user's new word read from the record): a signal from now on is let
    go, not raised, so its last state write and its end message are never cut in two."""
    global _ending
    _ending = True


@contextmanager
def held() -> Iterator[None]:
    """SIGTERM/SIGHUP that come inside the block are raised (as Interrupted) once it ends, not in its middle."""
    global _held
    if _held is not None:  # nested: the outer block raises
        yield
        return
    _held = []
    try:
        yield
    finally:
        pending, _held = _held, None
        if pending:
            raise Interrupted(pending[0])
