"""`--restarts N`: whether a failed attempt is relaunched, after how long, and when a crash loop stops it.

    policy = RestartPolicy(restarts=3)
    decision = policy.after(Failure(code=1, kind=FailureKind.CRASH, what="exit 1", progressed=False))
    decision.restart, decision.delay_s, decision.reason

Rules (docs/watch.md, "Restarts"): up to N relaunches; a crash loop — 3 consecutive attempts that failed the same
way (the same exit code, or the same hang or fault) before any progress — stops the restarts (the caller exits
with that failure's code). An attempt made progress when a `--progress` line matched, a heartbeat came, or (with
`--checkpoints`) a new whole checkpoint appeared; where the job uses none of these, when it ran for at least a
minute. The wait before a relaunch doubles with each
failure in a row that made no progress (1, 2, 4, ... s, at most 60 s), and starts again at 1 s after progress.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from podguard.outcome_lines import EndKind

__all__ = [
    "CRASH_LOOP",
    "FIRST_MINUTE_S",
    "MAX_DELAY_S",
    "Decision",
    "Failure",
    "FailureKind",
    "RestartPolicy",
    "made_progress",
]

CRASH_LOOP = 3
FIRST_MINUTE_S = 60.0
MAX_DELAY_S = 60.0


class FailureKind(StrEnum):
    """How an attempt failed, in the words of the crash-loop rule; `end_kind` is the END line's word for it."""

    CRASH = "crash"  # a worker exited non-zero
    HANG = "hang"  # no progress for --hang-timeout (79)
    GPU_FAULT = "gpu_fault"  # a fatal GPU fault (76)

    @property
    def end_kind(self) -> EndKind:
        return _END_KINDS[self]

    @property
    def words(self) -> str:
        """As the RESTART line says it: "gpu fault"."""
        return self.value.replace("_", " ")


_END_KINDS = {
    FailureKind.CRASH: EndKind.FAILED,
    FailureKind.HANG: EndKind.HUNG,
    FailureKind.GPU_FAULT: EndKind.GPU_FAULT,
}


@dataclass(frozen=True)
class Failure:
    """How one attempt failed (`kind`); `what` tells this failure from others of the same kind (the exit code,
    the Xid and GPU, the hung ranks)."""

    code: int
    kind: FailureKind
    what: str
    progressed: bool

    @property
    def signature(self) -> tuple[int, str, str]:
        return (self.code, self.kind, self.what)

    @property
    def text(self) -> str:
        kind = FailureKind(self.kind).words
        return f"{kind} ({self.what})" if self.what else kind


def made_progress(*, matched: bool, beating: bool, watched: bool, duration_s: float, saved: bool = False) -> bool:
    """An attempt's progress: a --progress match, a heartbeat or a new whole checkpoint (`saved`); with neither
    a pattern nor heartbeats in use (`watched` False), having run for FIRST_MINUTE_S."""
    if matched or beating or saved:
        return True
    return not watched and duration_s >= FIRST_MINUTE_S


@dataclass(frozen=True)
class Decision:
    restart: bool
    delay_s: float
    reason: str  # why not, or "restart 2 of 3"


@dataclass
class RestartPolicy:
    restarts: int
    history: list[Failure] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return len(self.history) + 1

    def after(self, failure: Failure) -> Decision:
        """Record `failure` (the attempt that just ended) and decide about the next one."""
        self.history.append(failure)
        streak = self._same_without_progress()
        if streak >= CRASH_LOOP:
            return Decision(
                False,
                0.0,
                f"crash loop: {streak} attempts in a row failed the same way ({failure.text}) before any progress",
            )
        used = len(self.history)
        if used > self.restarts:
            left = "no restarts" if self.restarts == 0 else f"all {self.restarts} restart(s) used"
            return Decision(False, 0.0, f"{left} (--restarts {self.restarts})")
        return Decision(True, self._delay(), f"restart {used} of {self.restarts}")

    def _same_without_progress(self) -> int:
        last = self.history[-1]
        streak = 0
        for failure in reversed(self.history):
            if failure.progressed or failure.signature != last.signature:
                break
            streak += 1
        return streak

    def _delay(self) -> float:
        quiet = 0
        for failure in reversed(self.history):
            if failure.progressed:
                break
            quiet += 1
        return min(MAX_DELAY_S, 2.0 ** max(0, quiet - 1))
