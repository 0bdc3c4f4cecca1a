"""How a keep ends (the keeper's last step, a part of loop.py's Keeper): stop what is kept, then say so.

    result = keeper._finish(Outcome.SUCCESS)     # None while the stop is not confirmed: tried again next poll

The decision is recorded first (phase `ending`, with the outcome, the exit code and why), and `done` only once the
stop (a cluster: its delete) reads back (actuate.py). A stop that fails for a moment (a 502, an outage longer than
`--retry-for`, a stop answered but not carried out yet) is tried again at the next poll; a keeper that dies
meanwhile and is started again resumes the `ending` phase. At the end nothing of the name that is the keeper's is
left billing: a pod of its own that landed late is terminated too, and a pod in ERROR that still bills (RunPod
cannot stop one) is terminated on a give-up or a refusal. Then `done` is written over the keep's own `kept` in the
record (so a keeper pod whose container disk was reset still knows), and the end message goes out once. A newer
word of the user (`pod down`, `pod stop`, a newer keep) ends the keeper at once, without another action.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from podguard import console
from podguard.errors import ExitCode
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.actuate import BOOTING, Actuator
from podguard.pods.keeper.decide import JobView, Outcome
from podguard.pods.keeper.events import Events
from podguard.pods.keeper.fence import Fence, Superseded
from podguard.pods.keeper.intent import Word
from podguard.pods.keeper.kept import Kept, Scan, not_confirmed
from podguard.pods.keeper.options import KeepOptions
from podguard.pods.keeper.record import KeepState, KeepStore
from podguard.pods.spec import PodSpec

__all__ = ["TRANSIENT", "Ending", "KeepResult"]

TRANSIENT = (ApiErrorKind.TRANSIENT, ApiErrorKind.RATE_LIMITED)
_WHY = {
    Outcome.SUCCESS: "the job succeeded",
    Outcome.GUARD: "a billing guard ended the job",
}


@dataclass(frozen=True)
class KeepResult:
    code: int
    outcome: str  # success | guard | failed | crash-loop | gave-up | refused | interrupted | down | stopped | ...
    message: str
    state: KeepState


class Ending:
    """The endings of Keeper (loop.py): success, guard, the job's failure, a crash loop, a give-up, a refusal."""

    target: Kept
    store: KeepStore
    options: KeepOptions
    events: Events
    view: JobView
    state: KeepState
    spec: PodSpec
    hands: Actuator
    fence: Fence
    adopted: tuple[str, ...]

    def _api_outage(self, exc: ApiError) -> None:  # pragma: no cover - Keeper's
        raise NotImplementedError

    def _api_back(self) -> None:  # pragma: no cover - Keeper's
        raise NotImplementedError

    def _finish(self, outcome: Outcome, detail: str = "") -> KeepResult | None:
        code = self.view.code
        why = _WHY.get(outcome, f"the job failed with exit {code}")
        if outcome is Outcome.GUARD:
            code = ExitCode.BILLING_GUARD
        if outcome is Outcome.CRASH_LOOP:
            code, why = ExitCode.FAILURE, detail or "the container crash-loops"
        return self._end(outcome.value, code, why)

    def _give_up(self, reason: str) -> KeepResult | None:
        why = (
            f"{reason}, but {self.state.recoveries} recovery(ies) were made already (--max-recoveries "
            f"{self.options.max_recoveries}): giving up"
        )
        return self._end("gave-up", ExitCode.GPUS_BUSY, why)

    def _refuse(self, reason: str) -> KeepResult | None:
        why = (
            f"{self.target.describe()}: {reason}: it needs a replacement, but a replacement would lose the pod's data: "
            "the spec has no [network_volume] (a network volume keeps /workspace across machines; add one, e.g. "
            '[network_volume] id = "..." path = "/workspace") and no [checkpoints] store (a store brings the job\'s '
            'checkpoints to a new pod in any data centre, e.g. [checkpoints] dir = "/workspace/ckpt" store = '
            '"s3://bucket/run"); not replacing'
        )
        return self._end("refused", ExitCode.GPUS_MISSING, why)

    def _end(self, outcome: str, code: int, why: str) -> KeepResult | None:
        """Record the decision (phase `ending`), then stop; `done` only once the stop is confirmed."""
        self.state.phase, self.state.outcome, self.state.code, self.state.why = "ending", outcome, int(code), why
        self.store.save(self.state)
        return self._complete_ending()

    def _complete_ending(self) -> KeepResult | None:
        """Make the recorded ending's stop; None when the API failed for a moment (the next poll tries again)."""
        outcome = self.state.outcome
        try:
            scan = self.target.scan(self.adopted)
            if self.state.target_id and self.state.target_id in scan.items:
                self.target.adopt(self.state.target_id, scan)  # the one it kept, nothing else
            else:
                self.target.forget()
            left = self._stop(outcome)
            left += self._sweep_own(scan)
        except ApiError as exc:
            if exc.kind not in TRANSIENT:
                raise
            self._api_outage(exc)
            return None
        self._api_back()
        self.state.phase = "done"
        self.store.save(self.state)
        code = int(self.state.code or 0)
        try:
            self.fence.finish(outcome, code)  # `done` over its own `kept`: a keeper started again knows
        except ApiError as exc:
            console.warn(f"the keep's record could not say done ({exc.message})")
        if outcome in ("gave-up", "refused"):
            text = f"{self.state.why}; {left}"
            self.events.say(outcome, text, notify=True, code=code)
        else:
            after = f" (after {self.state.recoveries} recovery(ies))" if self.state.recoveries else ""
            text = f"{self.state.why}: {left}{after}"
            self.events.say("end", text, notify=True, outcome=outcome, code=code, line=self.view.detail or None)
        return KeepResult(code, outcome, text, self.state)

    def _sweep_own(self, scan: Scan) -> str:
        """Its own pods of the name other than the one kept (a create that landed late, a twin) are terminated; and
        while a create (start) it sent may still land (its lease), it keeps looking: nothing of the keeper's bills
        once it ends. What was done, in words ("" when nothing)."""
        said = ""
        until = self.fence.pending()
        if until:
            console.say(f"waiting up to {until - time.time():.0f} s: a create this keeper sent may still land")
        while True:
            for other in [s.id for s in scan.mine if s.id != self.state.target_id]:
                if not self.target.remove(self.hands, other):
                    raise not_confirmed(f"terminate {other}")
                said += f"; {self.target.kind} {other} of the name (the keeper's own, made late) terminated"
            if time.time() >= until:
                return said
            time.sleep(max(0.05, min(self.hands.tuning.poll_s, until - time.time())))
            scan = self.target.scan(self.adopted)
            if self.state.target_id in scan.items and self.target.kind == "pod":
                kept = scan.items[self.state.target_id]
                if getattr(kept, "status", None) in BOOTING:  # a start that landed late: stopped again
                    self.target.adopt(self.state.target_id, scan)
                    self.target.stop(self.hands, why="a start that landed late")

    def _stop(self, outcome: str) -> str:
        if outcome == "refused":
            if self.target.kind == "pod" and self.target.target_id:
                why = "it cannot be replaced without losing its data"
                return self.target.stop(self.hands, why=why, terminate_error=True)
            if self.target.target_id:
                return (
                    f"{self.target.describe()} is left as it is (deleting it would lose its data) and still bills: "
                    f"`podguard pod down {self.spec.name}` ends it"
                )
            return "nothing is left"
        why = "the keeper gave up" if outcome == "gave-up" else self.state.why
        return self.target.stop(self.hands, why=why, terminate_error=outcome == "gave-up")

    def _superseded(self, exc: Superseded) -> KeepResult:
        """The user's word changed (`pod down`, `pod stop`, a newer keep): end without another action."""
        word = exc.current.word
        outcome = {Word.DOWN: "down", Word.STOPPED: "stopped", Word.DONE: "done"}.get(word, "taken-over")
        self.state.phase, self.state.outcome, self.state.code = "done", outcome, ExitCode.OK
        self.store.save(self.state)
        text = f"{exc.message}: this keeper ends, {self.target.describe()} is left to that word"
        self.events.say(outcome, text, notify=word is not Word.DONE)
        return KeepResult(ExitCode.OK, outcome, text, self.state)
