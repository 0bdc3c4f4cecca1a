"""How the keeper recovers (a part of loop.py's Keeper): start an EXITED pod, or replace a pod (cluster) whole.

    keeper._recover(Decision(Act.REPLACE, "in ERROR"))

One recovery = one start or one replacement, counted when it is requested (a keeper killed between the count and
the request counts it anyway: at most one too many, never one too few). A start counts once the pod reads back
booting. A replacement is recorded first (phase `replacing`), then the old one is terminated (read back gone) and a
new one made from the spec (fenced, leased: actuate.py); a keeper killed mid-way finishes it when started again, and
one of its own made meanwhile (before the kill, or a create that landed late, or by another actor) is adopted, not
duplicated. A replacement needs a network volume (in its data centre) or a checkpoint store (`[checkpoints] store`:
any data centre the spec allows); without either it would lose the pod's data, and keep refuses (69).
"""

from __future__ import annotations

import time

from podguard import console
from podguard.durations import format_duration
from podguard.outcome_lines import Checkpoint
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.converge import pick
from podguard.pods.keeper.decide import Act, Decision, Observed
from podguard.pods.keeper.ending import TRANSIENT, Ending, KeepResult
from podguard.pods.keeper.kept import not_confirmed
from podguard.pods.pod import PodStatus

__all__ = ["FAST_WINDOW_S", "Recovering", "comes_back_from"]

FAST_WINDOW_S = 1800.0  # after `pod up` or a recovery: the faster polls last until it runs, at most this long


def comes_back_from(checkpoint: Checkpoint | None, now: float | None = None) -> str:
    """`; the job comes back from checkpoint-1200 (step 1200), work since 14m ago is redone`, or "" unknown."""
    if checkpoint is None:
        return ""
    step = f" (step {checkpoint.step})" if checkpoint.step is not None else ""
    age = format_duration(max(0.0, (time.time() if now is None else now) - checkpoint.written))
    return f"; the job comes back from {checkpoint.name}{step}, work since {age} ago is redone"


class Recovering(Ending):
    """The recoveries of Keeper (loop.py)."""

    observed: Observed
    quiet_since: dict[int, float]
    checkpoint: Checkpoint | None
    _incident: float | None
    _capacity_tries: int
    _fast_until: float
    _booting_since: float

    def _recover(self, decision: Decision) -> KeepResult | None:
        if decision.act is Act.REPLACE and not self._can_replace():
            return self._refuse(decision.reason)
        if self.state.recoveries >= self.options.max_recoveries:
            return self._give_up(decision.reason)
        self.state.recoveries += 1
        self._incident = time.time()
        number = f"recovery {self.state.recoveries} of {self.options.max_recoveries}"
        if decision.act is Act.START:
            return self._start(decision.reason, number)
        return self._replace(decision.reason, number)

    def _start(self, reason: str, number: str, *, counted: bool = True) -> KeepResult | None:
        back = comes_back_from(self.checkpoint) if counted else ""
        self.store.save(self.state)
        self.events.say(
            "recovery" if counted else "up",
            f"{self.target.describe()}: {reason}: starting it" + (f" ({number}){back}" if counted else ""),
            notify=counted,
            action="start",
            target=self.target.target_id,
        )
        try:
            self.target.start(self.hands)
        except ApiError as exc:
            if exc.kind in TRANSIENT:  # a 5xx, a dropped connection, a 429, or not read back yet
                if counted:
                    self.state.recoveries -= 1  # maybe not started: the next poll decides again
                # maybe started (the answer was lost): the boot clocks start now, so that a pod booting is not taken
                # for a lost host (its last line is from before it stopped)
                self.view.after_recovery(replaced=False)
                self._after_recovery()
                raise
            if exc.kind is ApiErrorKind.NOT_FOUND:  # gone since the poll: the next poll replaces it
                return self._changed_under_us(exc.message, counted=counted)
            if exc.kind is not ApiErrorKind.NO_CAPACITY:
                raise
            why = f"its start was refused, the host has no free GPUs ({exc.detail or exc.message})"
            if not self._can_replace():
                if counted:
                    self.state.recoveries -= 1  # nothing was started or replaced
                return self._refuse(why)
            if not counted:
                if self.state.recoveries >= self.options.max_recoveries:
                    return self._give_up(why)
                self.state.recoveries += 1
                number = f"recovery {self.state.recoveries} of {self.options.max_recoveries}"
            return self._replace(why, number)
        self.view.after_recovery(replaced=False)
        self._after_recovery()
        return None

    def _changed_under_us(self, why: str, *, counted: bool = True) -> None:
        """The pod changed between the poll and the start (gone, or a status that cannot start): not a reason
        to end (a keeper that exited would leave what remains unwatched); the next poll decides again."""
        if counted:
            self.state.recoveries -= 1  # nothing was started
        self.store.save(self.state)
        console.say(f"{self.target.describe()} changed before its start ({why}); deciding again")

    def _can_replace(self) -> bool:
        """A network volume (in its data centre) or a checkpoint store (any data centre): the work comes along."""
        return (self.spec.volume is not None and self.spec.volume.network) or bool(self.spec.store)

    def _what_comes_along(self) -> str:
        if self.spec.volume is not None and self.spec.volume.network:
            return f"with network volume {self.spec.volume.volume_id}"
        return f"in any data centre the spec allows; the work comes from the checkpoint store {self.spec.store}"

    def _replace(self, reason: str, number: str) -> KeepResult | None:
        self.state.phase = "replacing"
        self.store.save(self.state)  # recorded before it is requested: a keeper killed now finishes it
        self.events.say(
            "recovery",
            f"{self.target.describe()}: {reason}: replacing it ({number}): a new {self.target.kind} of the same "
            f"name from the spec, {self._what_comes_along()}{comes_back_from(self.checkpoint)}",
            notify=True,
            action="replace",
            target=self.target.target_id,
        )
        self._finish_replacement(resumed=False)
        return None

    def _finish_replacement(self, *, resumed: bool) -> None:
        """Remove the old pod (cluster) if it is still there, then adopt one of the keeper's own of the name or
        make it. One of its own other than the one being replaced is the replacement (this keeper's, made before it
        was killed; a create that landed late; another actor's): adopted, and the old one removed."""
        old = self.state.target_id
        scan = self.target.scan(self.adopted)
        mine = {s.id for s in scan.mine}
        others = [s for s in scan.mine if s.id != old]
        if others:
            chosen = pick(others, "").id
            self.target.adopt(chosen, scan)
            self._say_adopted(resumed)
            if old in mine and not self.target.remove(self.hands, old):
                raise not_confirmed(f"terminate {old}")
        else:
            if old in mine:
                if old in scan.items:
                    self.target.adopt(old, scan)
                if not self.target.remove(self.hands, old):
                    raise not_confirmed(f"terminate {old}")
                console.say(
                    f"{self.target.kind} {old} terminated" if self.target.kind == "pod" else f"cluster {old} deleted"
                )
            self.target.forget()
            self.state.target_id = ""
            self.store.save(self.state)
            self._make(old, resumed=resumed)
        self.state.phase = "watching"
        self.state.nodes = {}
        self.state.target_id = self.target.target_id
        self.state.made = True
        self.view.after_recovery(replaced=True)
        self.state.streaks = {}
        self._after_recovery()

    def _make(self, old: str, *, resumed: bool) -> None:
        """Make one from the spec, waiting for capacity; before each try, one of the keeper's own of the name that
        exists meanwhile is adopted instead."""
        dc = self.state.data_center or None
        while True:
            scan = self.target.scan(self.adopted)
            if scan.plan.keep:
                self.target.adopt(scan.plan.keep, scan)
                self._say_adopted(resumed)
                return
            try:
                self.target.create(self.hands, dc, self.adopted)
                break
            except ApiError as exc:
                if exc.kind is not ApiErrorKind.NO_CAPACITY:
                    raise
                self._wait_for_capacity(exc)
        self._capacity_tries = 0
        self.events.say(
            "replaced",
            f"created {self.target.describe()} in place of {old or 'the lost one'}",
            target=self.target.target_id,
        )

    def _say_adopted(self, resumed: bool) -> None:
        found = self.target.describe()
        if resumed:
            text = f"the replacement exists: {found} (made before this keeper was stopped, or by another actor)"
        else:
            text = (
                f"{found} exists already, made by someone else (a second keeper, the in-pod self-heal or `pod heal "
                "--replace`, or a create that landed late)"
            )
        self.events.say("adopted", f"{text}: adopted, not duplicated", notify=True, target=self.target.target_id)

    def _after_recovery(self) -> None:
        self.quiet_since = {}
        self.state.ran = {}  # a new start: not seen running its container yet
        self.state.preflight = {}
        self.observed = Observed(PodStatus.PROVISIONING, cluster=self.target.kind == "cluster")
        self._fast_until = self._booting_since = time.monotonic()
        self._fast_until += FAST_WINDOW_S
        self.store.save(self.state)

    def _wait_for_capacity(self, exc: ApiError) -> None:
        """No capacity anywhere the spec allows: wait (announced), doubling the wait up to its cap."""
        self._capacity_tries += 1
        tries = self._capacity_tries
        wait = min(self.options.capacity_wait_s * 2 ** (tries - 1), self.options.capacity_wait_cap_s)
        self.events.say(
            "capacity",
            f"no capacity for {self.spec.name} ({exc.message}); trying again in {wait:g} s (try {tries})",
            notify=tries == 1,
            wait_s=wait,
        )
        time.sleep(wait)
