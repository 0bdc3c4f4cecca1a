"""How the keeper recovers (a part of loop.py's Keeper): start an EXITED pod, or replace a pod (cluster) whole.

    keeper._recover(Decision(Act.REPLACE, "in ERROR"))

One recovery = one start or one replacement, counted when it is requested (a keeper killed between the count and
the request counts it anyway: at most one too many, never one too few). A replacement is recorded first (phase
`replacing`): a keeper killed mid-way finishes it when started again. Before any create the name is looked up:
a pod (cluster) of the name that exists is adopted, whoever made it (this keeper before it was killed, a second
keeper, the in-pod self-heal, `pod heal --replace`), never duplicated; right after a create, a twin made at the
same moment is settled (the oldest of the name stays: target.settle_twins). Events and `--notify` say which.
"""

from __future__ import annotations

import time

from podguard.durations import format_duration
from podguard.errors import UsageError
from podguard.outcome_lines import Checkpoint
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.decide import Act, Decision, Observed
from podguard.pods.keeper.ending import TRANSIENT, Ending, KeepResult
from podguard.pods.keeper.interrupt import held
from podguard.pods.model import PodStatus
from podguard.pods.spec import PodSpec

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

    spec: PodSpec
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
        back = comes_back_from(self.checkpoint)
        if decision.act is Act.START:
            self.store.save(self.state)
            self.events.say(
                "recovery",
                f"{self.target.describe()}: {decision.reason}: starting it ({number}){back}",
                notify=True,
                action="start",
                target=self.target.target_id,
            )
            try:
                self.target.start()
            except UsageError as exc:  # its status changed since the poll (a 409: now ERROR, say)
                return self._changed_under_us(exc.message)
            except ApiError as exc:
                if exc.kind in TRANSIENT:  # a 5xx, a dropped connection or a 429
                    self.state.recoveries -= 1  # maybe not started: the next poll decides again
                    # maybe started (the answer was lost): the boot clocks start now, so that a pod booting
                    # is not taken for a lost host (its last line is from before it stopped)
                    self.view.after_recovery(replaced=False)
                    self._after_recovery()
                    raise
                if exc.kind is ApiErrorKind.NOT_FOUND:  # gone since the poll: the next poll replaces it
                    return self._changed_under_us(exc.message)
                if exc.kind is not ApiErrorKind.NO_CAPACITY:
                    raise
                reason = f"its start was refused, the host has no free GPUs ({exc.detail or exc.message})"
                if not self._can_replace():
                    self.state.recoveries -= 1  # nothing was started or replaced
                    return self._refuse(reason)
                return self._replace(reason, number)
            self.view.after_recovery(replaced=False)
            self._after_recovery()
            return None
        return self._replace(decision.reason, number)

    def _changed_under_us(self, why: str) -> None:
        """The pod changed between the poll and the start (gone, or a status that cannot start): not a reason
        to end (a keeper that exited would leave what remains unwatched); the next poll decides again."""
        self.state.recoveries -= 1  # nothing was started
        self.store.save(self.state)
        self.events.note(f"{self.target.describe()} changed before its start ({why}); deciding again")

    def _can_replace(self) -> bool:
        """Only with a network volume: a replacement elsewhere would lose what is on the pod's own disk."""
        return self.spec.volume is not None and self.spec.volume.network

    def _replace(self, reason: str, number: str) -> KeepResult | None:
        self.state.phase = "replacing"
        self.store.save(self.state)  # recorded before it is requested: a keeper killed now finishes it
        volume = self.spec.volume.volume_id if self.spec.volume is not None else ""
        self.events.say(
            "recovery",
            f"{self.target.describe()}: {reason}: replacing it ({number}): a new {self.target.kind} of the same "
            f"name from the spec, with network volume {volume}{comes_back_from(self.checkpoint)}",
            notify=True,
            action="replace",
            target=self.target.target_id,
        )
        self._finish_replacement(resumed=False)
        return None

    def _finish_replacement(self, *, resumed: bool) -> None:
        """Remove the old pod (cluster) if it is still there, then adopt the one of the name or create it.

        A pod of the name other than the one being replaced is the replacement: this keeper's (made before it was
        killed) or another actor's. It is adopted and the old one removed; nothing is made twice."""
        old = self.state.target_id
        if old and self.target.adopt(exclude=old):
            self._say_adopted(resumed)
            self.target.discard(old)
            self._settle()  # several actors each made one (the oldest was adopted): never two of one name
        else:
            if old:
                if self.target.target_id == old:
                    self.target.remove()
                else:
                    self.target.discard(old)
                self.events.note(
                    f"{self.target.kind} {old} terminated" if self.target.kind == "pod" else f"cluster {old} deleted"
                )
            self.state.target_id = ""
            self.store.save(self.state)
            self._make(old, resumed=resumed)
        self.state.phase = "watching"
        self.state.nodes = {}
        self.state.target_id = self.target.target_id
        self.view.after_recovery(replaced=True)
        self.state.streaks = {}
        self._after_recovery()

    def _make(self, old: str, *, resumed: bool) -> None:
        """Look the name up (adopt what exists), else create from the spec, waiting for capacity; then settle a
        twin made at the same moment."""
        while True:
            if self.target.adopt():
                self._say_adopted(resumed)
                self._settle()
                return
            try:
                with held():  # a `pod down` meanwhile waits for the answer (a keeper started again adopts it)
                    self.target.create(self.events.note, self.state.data_center or None)
                break
            except ApiError as exc:
                if exc.kind is not ApiErrorKind.NO_CAPACITY:
                    raise
                self._wait_for_capacity(exc)
        self._capacity_tries = 0
        mine = self.target.settle_twins()
        if mine:
            self.events.say(
                "adopted",
                f"another {self.target.kind} of the name was made at the same moment: {self.target.describe()} (the "
                f"older) is kept and this keeper's {mine} terminated: never two of one name",
                notify=True,
                target=self.target.target_id,
            )
            return
        self.events.say(
            "replaced",
            f"created {self.target.describe()} in place of {old or 'the lost one'}",
            target=self.target.target_id,
        )

    def _settle(self) -> None:
        """After adopting a replacement someone else made: the newer ones of the name, made by other actors at
        the same time, are terminated (the oldest, adopted, stays: the rule settle_twins applies)."""
        extra = self.target.settle_twins()
        if extra:  # the adopted one was not the oldest after all (a listing in between): the oldest is kept now
            self.events.note(f"{self.target.describe()} is the oldest of the name: kept; {extra} terminated")

    def _say_adopted(self, resumed: bool) -> None:
        found = self.target.describe()
        if resumed:
            text = f"the replacement exists: {found} (made before this keeper was stopped, or by another actor)"
        else:
            text = (
                f"{found} exists already, made by someone else (a second keeper, the in-pod self-heal or `pod heal "
                "--replace`)"
            )
        self.events.say("adopted", f"{text}: adopted, not duplicated", notify=True, target=self.target.target_id)

    def _after_recovery(self) -> None:
        self.quiet_since = {}
        self.state.ran = {}  # a new start: not seen running its container yet
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
