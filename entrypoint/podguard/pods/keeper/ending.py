"""How a keep ends (the keeper's last step, a part of loop.py's Keeper): stop what is kept, then say so.

    result = keeper._finish(Outcome.SUCCESS)     # None while the stop has not gone through: tried again next poll

The decision is recorded first (phase `ending`, with the outcome, the exit code and why), and `done` only once the
stop (a cluster: its delete) is confirmed. A stop that fails for a moment (a 502, an outage longer than
`--retry-for`) is an outage like any other: the keeper says so once and tries again at the next poll; a keeper
that dies meanwhile and is started again resumes the `ending` phase and makes the stop (RunPod restarts a
deployed keeper's container: it must not read "done" and leave the kept pod billing). The end (or give-up,
refusal) message goes out once, after the stop, and names what was stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

from podguard.errors import ExitCode
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.decide import JobView, Outcome
from podguard.pods.keeper.events import Events
from podguard.pods.keeper.options import KeepOptions
from podguard.pods.keeper.record import KeepState, KeepStore
from podguard.pods.keeper.target import Target

__all__ = ["TRANSIENT", "Ending", "KeepResult"]

TRANSIENT = (ApiErrorKind.TRANSIENT, ApiErrorKind.RATE_LIMITED)
_WHY = {
    Outcome.SUCCESS: "the job succeeded",
    Outcome.GUARD: "a billing guard ended the job",
}


@dataclass(frozen=True)
class KeepResult:
    code: int
    outcome: str  # success | guard | failed | gave-up | refused | interrupted
    message: str
    state: KeepState


class Ending:
    """The endings of Keeper (loop.py): success, guard, the job's failure, a give-up, a refusal."""

    target: Target
    store: KeepStore
    options: KeepOptions
    events: Events
    view: JobView
    state: KeepState

    def _api_outage(self, exc: ApiError) -> None:  # pragma: no cover - Keeper's
        raise NotImplementedError

    def _api_back(self) -> None:  # pragma: no cover - Keeper's
        raise NotImplementedError

    def _finish(self, outcome: Outcome) -> KeepResult | None:
        code = self.view.code
        why = _WHY.get(outcome, f"the job failed with exit {code}")
        if outcome is Outcome.GUARD:
            code = ExitCode.BILLING_GUARD
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
            '[network_volume] id = "..." path = "/workspace"); not replacing'
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
            if self.state.target_id and self.target.target_id != self.state.target_id:
                self.target.adopt(only=self.state.target_id)  # a keeper started again: the one it kept, nothing else
            left = self._stop(outcome)
        except ApiError as exc:
            if exc.kind not in TRANSIENT:
                raise
            self._api_outage(exc)
            return None
        self._api_back()
        self.state.phase = "done"
        self.store.save(self.state)
        code = int(self.state.code or 0)
        if outcome in ("gave-up", "refused"):
            text = f"{self.state.why}; {left}"
            self.events.say(outcome, text, notify=True, code=code)
        else:
            after = f" (after {self.state.recoveries} recovery(ies))" if self.state.recoveries else ""
            text = f"{self.state.why}: {left}{after}"
            self.events.say("end", text, notify=True, outcome=outcome, code=code, line=self.view.detail or None)
        return KeepResult(code, outcome, text, self.state)

    def _stop(self, outcome: str) -> str:
        if outcome == "refused":
            if self.target.kind == "pod" and self.target.target_id:
                return self.target.stop(why="it cannot be replaced without losing its data")
            return "it is left as it is (deleting it would lose its data)"
        why = "the keeper gave up" if outcome == "gave-up" else self.state.why
        return self.target.stop(why=why)
