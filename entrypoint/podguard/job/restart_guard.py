"""The restart guard of a restarted container, and waiting for signals (`--on-exit idle`).

    key = job_key(["python", "train.py"], "per-gpu", extra=[gpu_list])  # includes this pod's identity
    decision = plan_launch(key, rerun=False, state=base)                # RUN, SKIP, or BACKOFF (wait, then run)
    record_run(key=key, argv=argv, mode="per-gpu", exit_code=0, started_at=t0, state=base)  # best-effort

The records themselves: `job/outcomes.py` (re-exported here). When and why a start is skipped or
delayed: docs/lifecycle.md.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from podguard import console
from podguard.errors import ExitCode
from podguard.job.outcomes import (
    QUICK_CRASH_S,
    RunKind,
    RunRecord,
    container_identity,
    is_entry_process,
    job_key,
    load_history,
    pod_identity,
    record_outcome,
    record_path,
    record_run,
)
from podguard.pause import next_signal, signals_held, wait_for_signal

__all__ = [
    "LaunchAction",
    "LaunchDecision",
    "RunKind",
    "RunRecord",
    "backoff_delay",
    "backoff_wait",
    "container_identity",
    "idle",
    "is_entry_process",
    "job_key",
    "load_history",
    "plan_launch",
    "pod_identity",
    "record_outcome",
    "record_path",
    "record_run",
    "wait_for_signal",
]

LOOP_WINDOW_S = 30 * 60.0
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 300.0
COUNTDOWN_STEP_S = 10.0


class LaunchAction(StrEnum):
    RUN = "run"
    SKIP = "skip"  # finished before (after `delay_s` when the skips themselves loop)
    BACKOFF = "backoff"  # a crash loop: wait `delay_s`, then run


@dataclass(frozen=True)
class LaunchDecision:
    action: LaunchAction
    reason: str = ""
    delay_s: float = 0.0
    record: Path | None = None


# --------------------------------------------------------------------------------------------------
# The restart policy (rationale: docs/lifecycle.md)


def backoff_delay(consecutive_quick_exits: int) -> float:
    """0 for the first one, then 10, 20, 40, … capped at 300 s."""
    if consecutive_quick_exits < 2:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (consecutive_quick_exits - 2))


def _crash_streak(history: list[RunRecord]) -> int:
    streak = 0
    for run in reversed(history):
        if not run.quick_crash:
            break
        streak += 1
    return streak


def _finished(history: list[RunRecord]) -> RunRecord | None:
    """The job's latest real run when it succeeded (skips after it do not change that)."""
    runs = [run for run in history if run.kind is not RunKind.SKIP]
    last = runs[-1] if runs else None
    return last if last is not None and last.kind is RunKind.JOB and last.exit_code == ExitCode.OK else None


def _skip_decision(history: list[RunRecord], finished: RunRecord, recent: bool, path: Path) -> LaunchDecision:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(finished.ended_at))
    reason = f"this job already finished successfully at {when} on this pod; pass --rerun to run it again"
    skips = history[-1].count if history[-1].kind is RunKind.SKIP else 0
    delay = backoff_delay(skips) if recent else 0.0
    if delay > 0:
        reason += (
            f" (or --on-exit idle to keep the container up). The container was restarted {skips} times since "
            f"without running it; waiting {delay:g} s to slow the restart loop"
        )
    return LaunchDecision(LaunchAction.SKIP, reason, delay_s=delay, record=path)


def plan_launch(
    key: str,
    *,
    rerun: bool = False,
    entry: bool | None = None,
    state: Path | None = None,
    now: float | None = None,
    container: str | None = None,
    pod: str | None = None,
) -> LaunchDecision:
    """What to do before launching: RUN, SKIP (finished before), or BACKOFF (crash loop: wait first).

    Only the container's entry process after a restart of this container on this pod is ever skipped or
    delayed; anything else (a person re-running it, a new pod on the same volume) runs at once."""
    path = record_path(key, state)
    history = load_history(key, state)
    entry = is_entry_process() if entry is None else entry
    if not history or not entry:
        return LaunchDecision(LaunchAction.RUN, record=path)
    last = history[-1]
    if last.container == (container_identity() if container is None else container):
        return LaunchDecision(LaunchAction.RUN, "same container instance: a deliberate re-run", record=path)
    here = pod_identity() if pod is None else pod
    if last.pod and last.pod != here:
        return LaunchDecision(LaunchAction.RUN, f"recorded on another pod ({last.pod}), not {here}", record=path)
    recent = (time.time() if now is None else now) - last.ended_at < LOOP_WINDOW_S
    finished = _finished(history)
    if finished is not None and not rerun:
        return _skip_decision(history, finished, recent, path)
    streak = _crash_streak(history)
    delay = backoff_delay(streak) if recent else 0.0
    if delay > 0:
        return LaunchDecision(
            LaunchAction.BACKOFF,
            f"the job crashed within {QUICK_CRASH_S:g} s of starting {streak} times in a row "
            f"(last: exit {last.exit_code}); waiting {delay:g} s before launching again",
            delay_s=delay,
            record=path,
        )
    return LaunchDecision(LaunchAction.RUN, record=path)


# --------------------------------------------------------------------------------------------------
# Waiting for signals (the backoff countdown, --on-exit idle)


def backoff_wait(decision: LaunchDecision, *, step_s: float = COUNTDOWN_STEP_S) -> int | None:
    """The announced restart-loop pause: countdown lines, interruptible. Returns the signal, or None."""
    then = "launching again" if decision.action is LaunchAction.BACKOFF else "going on"
    with signals_held() as watched:
        console.say(f"{decision.reason} (SIGTERM or Ctrl-C to stop; outcome history: {decision.record})")
        left = decision.delay_s
        while left > 0:
            got = next_signal(watched, min(step_s, left))
            if got is not None:
                console.say(f"received {signal.Signals(got).name} during the restart-loop pause; not launching")
                return got
            left -= min(step_s, left)
            if left > 0:
                console.say(f"{then} in {left:.0f} s")
    return None


def idle(exit_code: int, record: Path | None) -> int:
    """`--on-exit idle`: keep the container alive until a signal; returns the job's exit code."""
    where = f"; outcome recorded in {record}" if record is not None else ""
    with signals_held() as watched:
        console.say(
            f"job ended with exit code {exit_code}{where}. Idling to keep the container up (--on-exit idle); "
            "stop the pod or send SIGTERM to end",
        )
        got = next_signal(watched, None)
    if got is not None:
        console.say(f"received {signal.Signals(got).name}; leaving (job exit code {exit_code})")
    return exit_code
