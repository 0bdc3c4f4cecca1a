"""`pod up`: make the spec's pod exist and run, idempotently by name, then wait until its preflight passed.

    result = pod_up(api, spec, timeout_s=1800, wait=True, tuning=Tuning())   # its lines: the console

An existing pod of that name is reused when it runs and started when it is stopped; otherwise the
candidates are created in order (placement.py), carrying podguard's mark (mark.py). A pod of the name without the
mark is the user's: refused (64, naming it), unless handed over with `adopt` (`--adopt POD_ID`). Waiting is
readiness.py's job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from podguard import console
from podguard.errors import UsageError
from podguard.pods.actions import act_on
from podguard.pods.api import PodApi
from podguard.pods.kinds import refuse_other_kind
from podguard.pods.mark import stranger_line
from podguard.pods.pod import Pod, PodAction, PodStatus
from podguard.pods.readiness import ReadyOutcome, wait_ready
from podguard.pods.retry import with_retry
from podguard.pods.spec import PodSpec
from podguard.pods.target import PodTarget, check_adopted, one_of_name
from podguard.pods.tuning import Tuning

__all__ = ["UpResult", "pod_up"]


@dataclass(frozen=True)
class UpResult:
    pod: Pod
    action: str  # created | reused | started
    outcome: ReadyOutcome | None  # None with --no-wait


def pod_up(
    api: PodApi,
    spec: PodSpec,
    *,
    timeout_s: float,
    wait: bool,
    tuning: Tuning,
    adopt: tuple[str, ...] = (),
) -> UpResult:
    started = time.monotonic()
    refuse_other_kind(api, spec)
    target = PodTarget(api)
    named = with_retry(lambda: target.named(spec.name), api.policy, what=f"look up pod {spec.name}")
    check_adopted(target.kind, {p.id for p in named}, adopt, spec.name)
    theirs = [p for p in named if not target.owner(p, spec.name, adopt)]
    if theirs:
        raise UsageError(
            f"{stranger_line(theirs[0])} is named {spec.name!r} but was not made by podguard (it has no podguard "
            f"mark): `pod up` will not touch it. Give the spec another name, remove it (`podguard pod down "
            f"{theirs[0].id}`), or hand it over: `podguard pod up --spec FILE --adopt {theirs[0].id}` (also the way "
            "in for a pod an earlier podguard made)"
        )
    one_of_name(target.kind, [p.id for p in named], spec.name)
    not_started_at: str | None = None
    if named:
        pod = named[0]
        if pod.image != spec.image and pod.image:
            console.say(f"note: pod {pod.name} runs {pod.image}, the spec says {spec.image}; `pod down` it to recreate")
        if pod.status in (PodStatus.EXITED, PodStatus.ERROR):
            console.say(f"pod {pod.name} ({pod.id}) exists and is {pod.status}: starting it")
            not_started_at = pod.started_at
            pod = act_on(api, pod, PodAction.START).pod or pod  # 69 with a hint when its host is full
            action = "started"
        else:
            console.say(f"pod {pod.name} ({pod.id}) exists and is {pod.status}: reusing it")
            action = "reused"
    else:
        candidates = target.candidates(spec, keep="up")
        pod = target.first_fit(candidates, mine=lambda p: target.owner(p, spec.name))
        console.say(f"created pod {pod.name} ({pod.id})")
        action = "created"
    if not wait:
        return UpResult(pod, action, None)
    outcome = wait_ready(
        api, pod.id, timeout_s=timeout_s, tuning=tuning, started=started, not_started_at=not_started_at
    )
    return UpResult(outcome.pod, action, outcome)
