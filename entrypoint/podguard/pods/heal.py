"""The escalation ladder for a sick pod: restart, then stop+start, then (opt-in) replace it elsewhere.

    result = heal(api, pod, replace=True, timeout_s=900, tuning=Tuning())   # each step a console line
    result.code    # 0 a step made the preflight pass; 76 the last step did not; 69 host full, no --replace

Each step runs only when the previous one did not make the preflight pass, is announced, and is recorded
(`result.steps`, written to the state dir by the CLI). "Not enough free GPUs on the host" on start is an
expected answer: the host of a stopped pod is full. The replacement copies image, args, env, GPU type and
count, ports and network volume and keeps the name; the sick pod is terminated once it passed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from podguard import console
from podguard.errors import ExitCode, PodguardError
from podguard.pods.actions import act_on
from podguard.pods.api import PodApi
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.mark import kept_or_marked, owned
from podguard.pods.placement import Created, create_first_fit
from podguard.pods.pod import Pod, PodAction, PodRequest, PodStatus, Volume
from podguard.pods.readiness import ReadyOutcome, wait_ready, wait_status
from podguard.pods.tuning import Tuning
from podguard.state import state_dir, subdir, write_private

__all__ = ["HealResult", "HealStep", "StepRecord", "Steps", "heal", "heal_record", "replacement_request"]


class HealStep(StrEnum):
    RESTART = "restart"
    STOP_START = "stop+start"
    REPLACE = "replace"


@dataclass
class StepRecord:
    step: HealStep
    result: str  # pass | fail | host-full | no-capacity | skipped | no-effect | timeout
    detail: str = ""
    pod_id: str = ""
    at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


@dataclass
class HealResult:
    code: int
    pod: Pod
    steps: list[StepRecord]
    message: str
    lines: list[str] = field(default_factory=list)


def replacement_request(pod: Pod, *, extra_env: Mapping[str, str] | None = None, made_by: str = "heal") -> PodRequest:
    """A create request for an identical pod: same image, args, env, GPU, ports, network volume and name.

    A network volume pins the data centre (volumes live in one); host-local storage cannot move, so the
    replacement gets an empty one of the same size. The replacement carries podguard's mark: the pod's own (a
    replacement is still the keep's pod), or a new one for its name (`made_by`) when the pod had none."""
    volume = pod.volume
    if volume is not None and not volume.network:
        volume = Volume(path=volume.path, size_gb=volume.size_gb)
    gpus = pod.gpu.count if pod.gpu else None
    env = kept_or_marked({**pod.env, **(extra_env or {})}, pod.name, gpus, made_by=made_by)
    return PodRequest(
        name=pod.name,
        image=pod.image,
        args=pod.args,
        env=env,
        ports=pod.port_specs,
        disk_gb=pod.disk_gb or 50,
        cloud=pod.cloud or "SECURE",
        data_center=pod.data_center if volume is not None and volume.network else None,
        gpu=pod.gpu,
        cpu=pod.cpu,
        volume=volume,
        ssh=True,
    )


class Steps:
    """The steps of one heal, a pod's or a cluster's (clusters/heal.py), in order: each said as it is recorded."""

    def __init__(self) -> None:
        self.started = time.monotonic()  # what the status lines count from
        self.steps: list[StepRecord] = []

    def record(self, step: HealStep, result: str, detail: str, target: Created) -> None:
        self.steps.append(StepRecord(step, result, detail, target.id))
        console.say(f"heal {step}: {result}" + (f" ({detail})" if detail else ""))

    def record_judged(self, step: HealStep, passed: bool, said: bool, detail: str, target: Created) -> None:
        """A step whose outcome was judged: pass, fail (a verdict said so), or timeout (none did)."""
        self.record(step, "pass" if passed else ("fail" if said else "timeout"), detail, target)


class _Ladder(Steps):
    def __init__(self, api: PodApi, timeout_s: float, tuning: Tuning) -> None:
        super().__init__()
        self.api, self.timeout_s, self.tuning = api, timeout_s, tuning

    def ready(self, pod: Pod, not_started_at: str | None) -> ReadyOutcome:
        return wait_ready(
            self.api,
            pod.id,
            timeout_s=self.timeout_s,
            tuning=self.tuning,
            started=self.started,
            not_started_at=not_started_at,
        )

    def judged(self, step: HealStep, outcome: ReadyOutcome) -> bool:
        word = outcome.verdict.word if outcome.verdict else ""
        passed = outcome.code == ExitCode.OK
        self.record_judged(step, passed, outcome.verdict is not None, word or outcome.message, outcome.pod)
        return passed

    def restart(self, pod: Pod) -> ReadyOutcome | None:
        console.say(f"heal step 1: restart pod {pod.name} ({pod.id})")
        if pod.status is not PodStatus.RUNNING:
            self.record(HealStep.RESTART, "skipped", f"pod is {pod.status}", pod)
            return None
        act_on(self.api, pod, PodAction.RESTART)
        # "restart returns 200 and does nothing" happens: look for a new start before waiting for a verdict
        confirm = time.monotonic() + min(self.timeout_s, self.tuning.restart_confirm_s)
        moved = wait_status(
            self.api,
            pod.id,
            lambda p: p.started_at != pod.started_at or p.status is not PodStatus.RUNNING,
            deadline=confirm,
            tuning=self.tuning,
            started=self.started,
        )
        if moved is None:
            self.record(HealStep.RESTART, "no-effect", "the restart was accepted but the pod did not restart", pod)
            return None
        outcome = self.ready(pod, pod.started_at)
        self.judged(HealStep.RESTART, outcome)
        return outcome

    def stop_start(self, pod: Pod) -> ReadyOutcome | ApiError | None:
        console.say(f"heal step 2: stop, then start pod {pod.name} ({pod.id}) for a fresh driver state")
        fresh = self.api.get_pod(pod.id)
        if fresh.status is not PodStatus.EXITED:
            act_on(self.api, fresh, PodAction.STOP)
            deadline = time.monotonic() + self.timeout_s
            stopped = wait_status(
                self.api,
                pod.id,
                lambda p: p.status is PodStatus.EXITED,
                deadline=deadline,
                tuning=self.tuning,
                started=self.started,
            )
            if stopped is None:
                self.record(HealStep.STOP_START, "timeout", f"not stopped within {self.timeout_s:g}s", fresh)
                return None
            fresh = stopped
        try:
            act_on(self.api, fresh, PodAction.START)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NO_CAPACITY:
                raise
            self.record(HealStep.STOP_START, "host-full", exc.detail or exc.message, fresh)
            return exc
        outcome = self.ready(fresh, fresh.started_at)
        self.judged(HealStep.STOP_START, outcome)
        return outcome

    def replace(self, sick: Pod) -> ReadyOutcome | ApiError:
        console.say(f"heal step 3: replace pod {sick.name} ({sick.id}) with an identical pod elsewhere")
        request = replacement_request(sick)
        try:
            new = create_first_fit(self.api, [request], exclude={sick.id}, mine=lambda p: owned(p, sick.name))
        except ApiError as exc:
            if exc.kind not in (ApiErrorKind.NO_CAPACITY, ApiErrorKind.REJECTED):
                raise
            self.record(HealStep.REPLACE, "no-capacity", exc.message, sick)
            return exc
        outcome = self.ready(new, None)
        if self.judged(HealStep.REPLACE, outcome):
            console.say(f"replacement {new.id} passed: terminating the sick pod {sick.id}")
            act_on(self.api, sick, PodAction.TERMINATE)
        else:
            console.say(f"replacement {new.id} did not pass: terminating it, keeping {sick.id} for inspection")
            act_on(self.api, outcome.pod, PodAction.TERMINATE)
        return outcome


def heal(api: PodApi, pod: Pod, *, replace: bool, timeout_s: float, tuning: Tuning) -> HealResult:
    """Run the ladder on `pod` until a step makes its preflight pass (see the module docstring)."""
    ladder = _Ladder(api, timeout_s, tuning)
    last: ReadyOutcome | None = ladder.restart(pod)
    if last is not None and last.code == ExitCode.OK:
        return _result(ladder, last, pod)
    step2 = ladder.stop_start(pod)
    if isinstance(step2, ReadyOutcome):
        if step2.code == ExitCode.OK:
            return _result(ladder, step2, pod)
        last = step2
    if not replace:
        if isinstance(step2, ApiError):
            msg = f"{step2.detail or step2.message}; rerun with --replace to move the pod to another machine"
            return HealResult(ExitCode.GPUS_MISSING, api.get_pod(pod.id), ladder.steps, msg)
        return _result(ladder, last, pod, hint="rerun with --replace to move the pod to another machine")
    step3 = ladder.replace(api.get_pod(pod.id))
    if isinstance(step3, ApiError):
        return HealResult(ExitCode.GPUS_MISSING, api.get_pod(pod.id), ladder.steps, step3.message)
    return _result(ladder, step3, pod)


def _result(ladder: _Ladder, outcome: ReadyOutcome | None, pod: Pod, hint: str = "") -> HealResult:
    if outcome is None:
        return HealResult(
            ExitCode.GPU_UNHEALTHY, pod, ladder.steps, "no step could be judged" + (f"; {hint}" if hint else "")
        )
    lines = outcome.verdict.lines if outcome.verdict else []
    code = ExitCode.OK if outcome.code == ExitCode.OK else ExitCode.GPU_UNHEALTHY
    message = outcome.message + (f"; {hint}" if hint and code != ExitCode.OK else "")
    return HealResult(code, outcome.pod, ladder.steps, message, lines)


def heal_record(pod: Pod, result: HealResult) -> dict[str, object]:
    """The JSON record of a heal run (steps in order)."""
    return {
        "pod": {"id": pod.id, "name": pod.name},
        "code": result.code,
        "message": result.message,
        "result_pod": result.pod.id,
        "steps": [asdict(s) for s in result.steps],
    }


def save_heal_record(target_id: str, record: Mapping[str, Any]) -> Path | None:
    """`<state dir>/heal/<time>-<id>.json` (owner-only); None when the state dir cannot take it (best effort)."""
    try:
        path = subdir(state_dir(), "heal") / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{target_id}.json"
        write_private(path, json.dumps(record, indent=2, default=str))
        return path
    except (OSError, PodguardError):
        return None
