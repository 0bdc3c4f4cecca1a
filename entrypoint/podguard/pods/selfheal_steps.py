"""The three things self-heal can do for its own pod: restart it, replace it, or park.

    code = restart_pod(healer, 76)

Each step is recorded in the self-heal state before the API is asked (a restart ends this container
mid-call, and the next container must know the step was taken). Any API failure parks: never a loop.
Called only from selfheal.after_preflight.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from podguard.errors import PodguardError, signal_exit_code

if TYPE_CHECKING:
    from podguard.pods.api import PodApi
    from podguard.pods.selfheal import Healer

__all__ = ["park", "replace_pod", "restart_pod"]

REPLACE_TIMEOUT_S = 1800.0  # how long the replacement may take to reach RUNNING


def _api() -> PodApi:
    from podguard.pods.api import open_api

    return open_api("rest")


def _ended(healer: Healer, code: int, waited: str) -> int:
    """Wait for the API's action to end this container; the code to exit with if it does not."""
    from podguard.pods.tuning import Tuning

    got = healer.wait_signal(Tuning.from_env().restart_wait_s)
    if got is not None:
        return signal_exit_code(got)
    healer.say(f"{waited}, but this container is still running; exiting {code}")
    return code


def restart_pod(healer: Healer, code: int) -> int:
    cfg, state = healer.cfg, healer.state
    healer.say(
        f"{state.failures} consecutive preflight failures (last exit {code}): asking RunPod to restart "
        f"pod {cfg.pod_id} (PODGUARD_SELF_HEAL={cfg.mode})"
    )
    state.steps.append("restart")
    state.failures = 0
    healer.note("restart", "requested")
    from podguard.pods.model import PodAction

    try:
        _api().act(cfg.pod_id, PodAction.RESTART)
    except PodguardError as exc:
        healer.say(f"restart failed: {exc.message}")
        healer.note("restart-failed", exc.message)
        return park(healer, code, None)
    return _ended(healer, code, "restart requested")


def replace_pod(healer: Healer, code: int) -> int:
    """Create an identical pod, wait until it is RUNNING, then terminate this one."""
    from podguard.pods.heal import replacement_request
    from podguard.pods.model import PodAction, PodStatus
    from podguard.pods.placement import create_first_fit
    from podguard.pods.progress import Progress
    from podguard.pods.readiness import wait_status
    from podguard.pods.selfheal import ENV_REPLACED_FROM
    from podguard.pods.tuning import Tuning

    cfg, state = healer.cfg, healer.state
    healer.say(f"{state.failures} consecutive preflight failures after a restart: replacing pod {cfg.pod_id}")
    state.steps.append("replace")
    state.failures = 0
    healer.note("replace", "requested")
    progress = Progress(healer.out)
    new = None
    try:
        api = _api()
        me = api.get_pod(cfg.pod_id)
        request = replacement_request(me, extra_env={ENV_REPLACED_FROM: cfg.pod_id})
        new = create_first_fit(api, [request], say=progress.say, exclude={cfg.pod_id})
        healer.note("replacement-created", new.id)
        tuning = Tuning.from_env()
        running = wait_status(
            api,
            new.id,
            lambda p: p.status is PodStatus.RUNNING,
            deadline=time.monotonic() + REPLACE_TIMEOUT_S,
            tuning=tuning,
            progress=progress,
            fail=lambda p: p.status in (PodStatus.EXITED, PodStatus.ERROR),
        )
        if running is None:
            healer.say(f"replacement {new.id} did not reach RUNNING: terminating it")
            api.act(new.id, PodAction.TERMINATE)
            healer.note("replacement-failed", new.id)
            return park(healer, code, None)
        healer.say(f"replacement {new.id} is RUNNING: terminating this pod {cfg.pod_id}")
        healer.note("terminate-self", new.id)
        api.act(cfg.pod_id, PodAction.TERMINATE)
    except PodguardError as exc:
        healer.say(f"replace failed: {exc.message}")
        healer.note("replace-failed", exc.message)
        return park(healer, code, None)
    return _ended(healer, code, "termination requested")


def park(healer: Healer, code: int, report: Path | None) -> int:
    """Stay up and idle (no restart loop) with one clear line; PODGUARD_PARK=stop stops the pod first."""
    from podguard.pods.selfheal import ParkMode

    cfg, state = healer.cfg, healer.state
    state.parked = True
    healer.note("park", str(cfg.park))
    tried = ", ".join(state.steps) or "nothing"
    where = f"; report: {report}" if report else ""
    healer.say(
        f"PARKED: the preflight keeps failing (last exit {code}; tried: {tried}). The container stays up and idle "
        f"instead of restarting{where}. From a laptop: `podguard pod heal {cfg.pod_id} --replace`"
    )
    if cfg.park is ParkMode.STOP:
        from podguard.pods.actions import act_on
        from podguard.pods.model import PodAction

        try:
            api = _api()
            act_on(api, api.get_pod(cfg.pod_id), PodAction.STOP)
            healer.say(f"stopping pod {cfg.pod_id} so it stops billing (PODGUARD_PARK=stop)")
        except PodguardError as exc:
            healer.say(f"could not stop pod {cfg.pod_id}: {exc.message}; idling instead")
    got = healer.wait_signal(None)
    return signal_exit_code(got) if got is not None else code
