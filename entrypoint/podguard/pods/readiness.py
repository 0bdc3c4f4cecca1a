"""Is the pod ready? RUNNING, and its preflight summary line since its latest start says PASS.

    outcome = wait_ready(api, pod.id, timeout_s=1800, tuning=Tuning())   # status lines through the console
    outcome.code   # 0 PASS; 76 BUSY/UNHEALTHY/FAIL (outcome.lines are the pod's own); 75 timed out

The verdict comes from following the pod's log stream (SSE), not from polling: the PASS line reaches
`pod up` within the settle window. The newest verdict counts: after one arrives, a newer one within
`settle_s` (the same backfill burst) replaces it. Status is checked every `poll_s` beside the stream, so
a pod that stops or restarts while we wait is noticed. See docs/pods.md.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from podguard import console
from podguard.errors import ExitCode
from podguard.pods.api import PodApi
from podguard.pods.errors import ApiError
from podguard.pods.follow import LogFollower
from podguard.pods.pod import LogEvent, Pod, PodStatus
from podguard.pods.tuning import Tuning

__all__ = [
    "VERDICT_LINE",
    "ReadyOutcome",
    "Verdict",
    "backfill",
    "parse_verdict",
    "show_status",
    "wait_ready",
    "wait_status",
]

# The first line of every preflight summary (report.format_summary): `podguard <command>: <VERDICT> ...`.
VERDICT_LINE = re.compile(r"\bpodguard ([a-z][a-z0-9-]*): (PASS|BUSY|UNHEALTHY|FAIL|MISSING|BAD-INPUT)\b")
_STOPPED = (PodStatus.EXITED, PodStatus.ERROR, PodStatus.TERMINATED)
BACKFILL_WITHOUT_START = 500  # lines to read back when the API does not say when the pod started


def backfill(since: str | None) -> int | None:
    """How many lines a log stream reads back: none when it can start at the pod's start (`since`), else the last
    BACKFILL_WITHOUT_START (the API did not say when the pod started)."""
    return None if since else BACKFILL_WITHOUT_START


@dataclass
class Verdict:
    word: str
    command: str
    lines: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.word == "PASS"


@dataclass(frozen=True)
class ReadyOutcome:
    code: int
    pod: Pod
    verdict: Verdict | None
    message: str


def parse_verdict(line: str) -> Verdict | None:
    m = VERDICT_LINE.search(line)
    return Verdict(m.group(2), m.group(1), [line.strip()]) if m else None


def wait_status(
    api: PodApi,
    pod_id: str,
    ok: Callable[[Pod], bool],
    *,
    deadline: float,
    tuning: Tuning,
    started: float | None = None,
    fail: Callable[[Pod], bool] = lambda p: False,
) -> Pod | None:
    """Poll until `ok(pod)`; the pod when it is, None at the deadline or when `fail(pod)`. Each status is a console
    status line (with the seconds since `started`, a monotonic time; default now) until the status changes."""
    since = time.monotonic() if started is None else started
    while True:
        pod = api.get_pod(pod_id)
        show_status(pod, since)
        if ok(pod):
            return pod
        if fail(pod) or time.monotonic() >= deadline:
            console.settle()
            return None
        time.sleep(max(min(tuning.poll_s, deadline - time.monotonic()), 0.0))


def show_status(pod: Pod, started: float) -> None:
    """`pod NAME (ID): STATUS, 12s` as a status line: once per status in a log, rewritten in place on a terminal."""
    text = f"pod {pod.name} ({pod.id}): {pod.status}, {time.monotonic() - started:.0f}s"
    console.status((pod.id, str(pod.status)), text, live=text)


def wait_ready(
    api: PodApi,
    pod_id: str,
    *,
    timeout_s: float,
    tuning: Tuning,
    started: float | None = None,
    not_started_at: str | None = None,
) -> ReadyOutcome:
    """Wait for RUNNING (with a start newer than `not_started_at` when given), then for the verdict line. `started`:
    the monotonic time the status lines count from (the command's start; default now)."""
    deadline = time.monotonic() + timeout_s

    def running(p: Pod) -> bool:
        return p.status is PodStatus.RUNNING and (not_started_at is None or p.started_at != not_started_at)

    pod = wait_status(
        api, pod_id, running, deadline=deadline, tuning=tuning, started=started, fail=lambda p: p.status in _STOPPED
    )
    if pod is None:
        last = api.get_pod(pod_id)
        if last.status in _STOPPED:
            return ReadyOutcome(ExitCode.GPUS_BUSY, last, None, f"pod {last.name} is {last.status}; it did not start")
        return ReadyOutcome(
            ExitCode.GPUS_BUSY, last, None, f"pod {last.name} did not start within {timeout_s:g}s ({last.status})"
        )
    console.say(f"pod {pod.name} ({pod.id}) is RUNNING; following its log for the preflight verdict")
    return _follow_verdict(api, pod, deadline=deadline, timeout_s=timeout_s, tuning=tuning)


def _follow_verdict(api: PodApi, pod: Pod, *, deadline: float, timeout_s: float, tuning: Tuning) -> ReadyOutcome:
    follower = _follower(api, pod, tuning)
    verdict: Verdict | None = None
    settle_at: float | None = None
    next_poll = time.monotonic() + tuning.poll_s
    try:
        while True:
            now = time.monotonic()
            if settle_at is not None and now >= settle_at:
                assert verdict is not None
                return _decided(api, pod, verdict)
            if now >= deadline:
                return ReadyOutcome(
                    ExitCode.GPUS_BUSY,
                    pod,
                    None,
                    f"no preflight verdict from pod {pod.name} within {timeout_s:g}s; it is still {pod.status} "
                    f"(see `podguard pod logs {pod.id}`)",
                )
            item = follower.get(min(t for t in (settle_at, next_poll, deadline) if t is not None) - now)
            if isinstance(item, ApiError):
                raise item
            if isinstance(item, LogEvent):
                found = parse_verdict(item.line)
                if found is not None:
                    verdict, settle_at = found, time.monotonic() + tuning.settle_s
                elif verdict is not None and settle_at is not None and item.line.startswith("  "):
                    verdict.lines.append(item.line.rstrip())
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + tuning.poll_s
                fresh = api.get_pod(pod.id)
                if fresh.status in _STOPPED:
                    return ReadyOutcome(
                        ExitCode.GPUS_BUSY, fresh, None, f"pod {fresh.name} is {fresh.status} before its preflight said"
                    )
                if fresh.started_at != pod.started_at and fresh.started_at:  # restarted under us: start over
                    follower.stop()
                    pod, verdict, settle_at = fresh, None, None
                    follower = _follower(api, pod, tuning)
    finally:
        follower.stop()


def _follower(api: PodApi, pod: Pod, tuning: Tuning) -> LogFollower:
    follower = LogFollower(
        api,
        pod.id,
        since=pod.started_at,
        tail=backfill(pod.started_at),
        source="container",
        backoff_s=tuning.backoff_s,
        backoff_cap_s=tuning.backoff_cap_s,
    )
    follower.start()
    return follower


def _decided(api: PodApi, pod: Pod, verdict: Verdict) -> ReadyOutcome:
    fresh = api.get_pod(pod.id)
    if verdict.passed:
        return ReadyOutcome(ExitCode.OK, fresh, verdict, f"pod {fresh.name}: preflight PASS")
    return ReadyOutcome(
        ExitCode.GPU_UNHEALTHY,
        fresh,
        verdict,
        f"pod {fresh.name} ({fresh.id}): preflight {verdict.word}",
    )
