"""Each poll's first step (a part of loop.py's Keeper): list the name, converge on exactly one, then judge it.

    observed = keeper._converge(silent)      # None: nothing to judge this poll (made the first one, or waiting)

One listing of the name per poll (target.scan). Strangers (pods of the name without podguard's mark) are named once
and never touched. The keeper's own beyond the one kept are terminated (a create that landed late, a twin), each
read back. The one kept may change (the one kept before is gone and another of its own runs: adopted, said). None of
its own: before the keep had made one, it is made now (`pod up`'s create, not a recovery); after, it is lost, and
decide() replaces it. A pod found stopped when the keep begins is started as `pod up` does (not a recovery). A spec
changed since the kept one was made is named once; it is applied at the next replacement.
"""

from __future__ import annotations

import time

from podguard import console
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.decide import Observed
from podguard.pods.keeper.ending import KeepResult
from podguard.pods.keeper.kept import Scan
from podguard.pods.keeper.recovery import Recovering
from podguard.pods.pod import PodStatus

__all__ = ["Reconciling"]


class Reconciling(Recovering):
    """The converge step of Keeper (loop.py)."""

    _told: set[str]  # strangers, unknown owners and spec changes already said (by id)
    _fresh: bool  # the keep began and has not judged a pod yet (a stopped one is started as `pod up` does)

    def _converge(self, silent: set[int]) -> Observed | KeepResult | None:
        """One listing: the plan carried out; the kept one's Observed, a result (the keep ended), or None."""
        scan = self.target.scan(self.adopted)
        plan = scan.plan
        for sid in plan.strangers:
            self._tell(
                sid,
                "stranger",
                f"{scan.line(sid)} is named {self.spec.name} but has no podguard mark: it is not the keeper's and is "
                f"never touched (`podguard pod keep --spec FILE --adopt {sid}` hands it over)",
            )
        for sid in plan.surplus:
            self._surplus(sid, scan)
        if plan.keep:
            was = self.target.target_id or self.state.target_id
            if self.target.adopt(plan.keep, scan) and was and was != plan.keep:
                self.events.say(
                    "adopted",
                    f"{self.target.describe()} is the one of the name that runs now (the keeper's own; {was} is "
                    "gone or in ERROR): kept",
                    notify=True,
                    target=plan.keep,
                )
                self.state.nodes, self.state.streaks = {}, {}
                self.view.after_recovery(replaced=True)  # another machine: what the old one's lines said is over
                self._after_recovery()
            self.state.target_id, self.state.made = plan.keep, True
            self._note_changes()
            return self._fresh_start(silent)
        self.target.forget()
        if plan.unknown:
            for sid in plan.unknown:
                self._tell(sid, "unknown", f"{scan.line(sid)} of the name: its owner is not known yet; waiting")
            return None
        if not self.state.made:
            return self._first_create()
        self._fresh = False
        return Observed(None, cluster=self.target.kind == "cluster")

    def _tell(self, key: str, kind: str, text: str) -> None:
        if key in self._told:
            return
        self._told.add(key)
        self.events.say(kind, text, notify=kind == "stranger", target=key)

    def _surplus(self, sid: str, scan: Scan) -> None:
        """One of the keeper's own beyond the one kept: terminated (read back), said."""
        if not self.target.remove(self.hands, sid):
            console.say(f"{scan.line(sid)}: its terminate is not confirmed yet; the next poll sees it again")
            return
        self.events.say(
            "surplus",
            f"{scan.line(sid)} is a second {self.target.kind} of the keeper's own for {self.spec.name} (a create that "
            f"landed late, or a twin): terminated, {self.target.kind} {scan.plan.keep} is kept",
            notify=True,
            target=sid,
        )

    def _note_changes(self) -> None:
        changes = self.target.changes()
        key = f"spec:{self.target.target_id}"
        if changes:
            self._tell(
                key,
                "spec",
                f"the spec changed since {self.target.describe()} was made: {'; '.join(changes)}; applied at the next "
                "replacement (a start keeps it as it is), never read as a fault of its host",
            )

    def _fresh_start(self, silent: set[int]) -> Observed | KeepResult | None:
        """The kept one as decide() sees it; when the keep has just begun and finds it stopped: started as `pod up`
        does (not a recovery)."""
        observed = self.target.observe(self.state, silent)
        if not self._fresh:
            return observed
        self._fresh = False
        stopped = observed.status in (PodStatus.EXITED, PodStatus.ERROR) and self.target.kind == "pod"
        if not stopped:
            self.events.say(
                "up",
                f"{self.target.describe()}: {observed.status}, reused (as `pod up` does)",
                target=self.target.target_id,
            )
            return observed
        result = self._start(f"it exists and is {observed.status}", "", counted=False)
        return result if result is not None else None

    def _first_create(self) -> KeepResult | None:
        """Nothing of the name was made before this keep: `pod up`'s create (waiting for capacity), not a recovery."""
        self._fresh = False
        while True:
            try:
                self.target.create(self.hands, None, self.adopted)
                break
            except ApiError as exc:
                if exc.kind is not ApiErrorKind.NO_CAPACITY:
                    raise
                self._wait_for_capacity(exc)
                if self.target.scan(self.adopted).plan.keep:  # one of its own appeared meanwhile: the next poll
                    return None
        self._capacity_tries = 0
        self.state.target_id, self.state.made = self.target.target_id, True
        self.store.save(self.state)
        self.events.say("up", f"{self.target.describe()}: created (as `pod up` does)", target=self.target.target_id)
        self._fast_until = self._booting_since = time.monotonic()
        self._fast_until += 1800.0
        return None
