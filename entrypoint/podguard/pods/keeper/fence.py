"""The fence: before every create, start, stop and terminate, a keeper reads the user's word again.

    fence = Fence(store, mine, on_lease=registration.lease, on_release=registration.release)
    fence.check()                  # Superseded when the word changed (a newer keep, `pod down`, `pod stop`, done)
    token = fence.lease(request_s) # before a create or start: by when it has landed, for `pod down` to wait on
    fence.release(token)           # its answer came: nothing of it lands later
    fence.finish("success", 0)     # `done` over the keep's own `kept` (never over a newer word)

One request per action (the record's id is known), none while nothing happens. A record that cannot be read (an
API outage) is not a permission: the action waits for the next poll (an ApiError the loop already treats as an
outage). A record that is gone (someone deleted the template) is written again with the keep's own word.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from podguard.errors import ExitCode, PodguardError
from podguard.pods.keeper.intent import Intent, Word, finished, may_act, why_not
from podguard.pods.keeper.intent_store import IntentStore
from podguard.pods.keeper.interrupt import ending
from podguard.pods.keeper.record import iso_now

__all__ = ["LAND_S", "Fence", "Superseded"]

LAND_S = 30.0  # after its answer's deadline, how long a create (start) RunPod took in may still land


class Superseded(PodguardError):
    """The user's word changed while this keeper kept the name: it ends without another action."""

    def __init__(self, current: Intent, reason: str) -> None:
        super().__init__(reason, ExitCode.OK)
        self.current = current


class Fence:
    def __init__(
        self,
        store: IntentStore,
        mine: Intent,
        *,
        on_lease: Callable[[float], int] = lambda until: 0,
        on_release: Callable[[int], None] = lambda token: None,
        pending: Callable[[], float] = lambda: 0.0,
        land_s: float = LAND_S,
    ) -> None:
        self.store, self.mine, self.land_s = store, mine, land_s
        self._on_lease, self._on_release = on_lease, on_release
        self.pending = pending  # until when a create (start) this keeper sent may still land (0: none)
        self.last: Intent | None = mine

    def check(self) -> None:
        """Raise Superseded unless the record is still this keep's own `kept` (ApiError: it cannot be read now)."""
        current = self.store.read()
        if current is None:  # the record was removed (by hand): this keep's word stands, written again
            self.store.write(self.mine)
            current = self.mine
        self.last = current
        if may_act(current, self.mine):
            return
        ending()  # (`pod down` signals the keeper right after writing its word: that SIGTERM must not cut the end)
        raise Superseded(current, why_not(current, self.mine))

    def lease(self, request_s: float) -> int:
        """A create or start is about to be sent: it may land until now + its request's deadline + LAND_S. A token
        for `release`, once its answer came."""
        return self._on_lease(time.time() + request_s + self.land_s)

    def release(self, token: int) -> None:
        self._on_release(token)

    def finish(self, outcome: str, code: int) -> bool:
        """Write `done` over the keep's own `kept`; False when the record holds a newer word (left as it is)."""
        current = self.store.read()
        done = finished(current, self.mine, outcome, code, at=iso_now())
        if done is None:
            return False
        self.store.write(done)
        self.last = done
        return True

    @property
    def word(self) -> Word:
        return self.last.word if self.last is not None else Word.KEPT
