"""Self-heal from inside a pod, and `--on-exit stop-pod`: the entrypoint side of the pod commands.

    heal_cfg = SelfHealConfig.from_env()                      # UsageError (64) on a bad value, before preflight
    code = after_preflight(pre.exit_code, heal_cfg, state=base, report=pre.report_path)
    code = stop_own_pod(code)                                 # --on-exit stop-pod, after a successful job

Consecutive preflight failures (75/76) are counted in the state dir per pod (by its id), across container
restarts. After PODGUARD_SELF_HEAL_AFTER of them the next step of the ladder runs through the REST API for
this pod: `restart`, then (PODGUARD_SELF_HEAL=replace) an identical pod is created, awaited until RUNNING,
and this one terminated. It never loops: each step runs once per pod (a replacement does not replace
again); after the last one the container parks (stays up, idle, one status line) and with
PODGUARD_PARK=stop stops its pod so billing stops. A step is recorded before it is requested.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from podguard import console
from podguard.errors import ExitCode, PodguardError, UsageError, signal_exit_code
from podguard.pause import wait_for_signal
from podguard.pods import thispod
from podguard.pods.api import open_api
from podguard.pods.heal import replacement_request
from podguard.pods.mark import owned
from podguard.pods.placement import create_first_fit
from podguard.pods.pod import PodAction, PodStatus
from podguard.pods.readiness import wait_status
from podguard.pods.thispod.billing import end_billing, request_end
from podguard.pods.thispod.key import require_pod_and_key
from podguard.pods.tuning import Tuning
from podguard.state import subdir, write_private

if TYPE_CHECKING:
    from podguard.pods.api import PodApi

__all__ = [
    "ParkMode",
    "SelfHealConfig",
    "SelfHealMode",
    "after_preflight",
    "check_stop_pod",
    "stop_own_pod",
]

ENV_MODE = "PODGUARD_SELF_HEAL"
ENV_AFTER = "PODGUARD_SELF_HEAL_AFTER"
ENV_PARK = "PODGUARD_PARK"
ENV_REPLACED_FROM = "PODGUARD_HEAL_REPLACED_FROM"  # set on a replacement: it never replaces again
COUNTED = (ExitCode.GPUS_BUSY, ExitCode.GPU_UNHEALTHY)


class SelfHealMode(StrEnum):
    OFF = "off"
    RESTART = "restart"
    REPLACE = "replace"


class ParkMode(StrEnum):
    IDLE = "idle"
    STOP = "stop"


def _choice(env: Mapping[str, str], name: str, enum: type[StrEnum], default: StrEnum) -> StrEnum:
    raw = env.get(name, "").strip().lower()
    try:
        return enum(raw) if raw else default
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not valid; expected one of {', '.join(e.value for e in enum)}") from None


@dataclass(frozen=True)
class SelfHealConfig:
    mode: SelfHealMode = SelfHealMode.OFF
    after: int = 3
    park: ParkMode = ParkMode.IDLE
    pod_id: str = ""
    replaced_from: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SelfHealConfig:
        env = os.environ if env is None else env
        mode = SelfHealMode(_choice(env, ENV_MODE, SelfHealMode, SelfHealMode.OFF))
        park = ParkMode(_choice(env, ENV_PARK, ParkMode, ParkMode.IDLE))
        raw = env.get(ENV_AFTER, "").strip() or "3"
        if not raw.isdigit() or int(raw) < 1:
            raise UsageError(f"{ENV_AFTER}={raw!r} is not valid; expected a whole number >= 1")
        return cls(mode, int(raw), park, thispod.pod_id(env), env.get(ENV_REPLACED_FROM, "").strip())

    @property
    def ladder(self) -> tuple[str, ...]:
        if self.mode is SelfHealMode.OFF:
            return ()
        if self.mode is SelfHealMode.REPLACE and not self.replaced_from:
            return ("restart", "replace")
        return ("restart",)


@dataclass
class _State:
    failures: int = 0
    steps: list[str] = field(default_factory=list)
    parked: bool = False
    history: list[dict[str, object]] = field(default_factory=list)


class Healer:
    def __init__(self, cfg: SelfHealConfig, path: Path, wait_signal: Callable[[float | None], int | None]) -> None:
        self.cfg, self.path, self.wait_signal = cfg, path, wait_signal
        self.state = self._load()

    def _load(self) -> _State:
        try:
            data = json.loads(self.path.read_text())
            return _State(int(data["failures"]), list(data["steps"]), bool(data["parked"]), list(data["history"]))
        except (OSError, ValueError, KeyError, TypeError):
            return _State()

    def save(self) -> None:
        try:
            write_private(self.path, json.dumps(asdict(self.state), indent=2))
        except OSError as exc:
            console.warn(f"self-heal: cannot record the self-heal state in {self.path}: {exc.strerror}")

    def note(self, event: str, detail: str = "") -> None:
        self.state.history.append(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event, "detail": detail}
        )
        self.state.history = self.state.history[-50:]
        self.save()

    def say(self, text: str, *, loud: bool = False) -> None:
        console.say(f"self-heal: {text}", loud=loud)


def after_preflight(
    code: int,
    cfg: SelfHealConfig,
    *,
    state: Path,
    report: Path | None = None,
    wait_signal: Callable[[float | None], int | None] | None = None,
) -> int:
    """Count the preflight's result and act on it; returns the code the entry process should exit with.

    0 resets the count. 75/76 count; at the threshold the next step runs (it may block: a restart waits
    for this container to be ended, parking waits for a signal). Other codes are configuration problems
    that a restart cannot fix: they are neither counted nor acted on."""
    if cfg.mode is SelfHealMode.OFF or (code != ExitCode.OK and code not in COUNTED):
        return code
    if not cfg.pod_id:
        console.say(f"self-heal: {ENV_MODE}={cfg.mode} needs {thispod.ENV_POD_ID} (set inside a RunPod pod); off")
        return code
    healer = Healer(cfg, subdir(state, "selfheal") / f"{_safe(cfg.pod_id)}.json", wait_signal or _wait_signal)
    if code == ExitCode.OK:
        if healer.state.failures or healer.state.parked:
            healer.state.failures, healer.state.parked = 0, False
            healer.note("pass", "preflight passed: failure count reset")
        return code
    healer.state.failures += 1
    healer.note("failure", f"exit {code}")
    if healer.state.failures < cfg.after:
        healer.say(f"preflight failure {healer.state.failures} of {cfg.after} before `{_next(cfg, healer.state)}`")
        return code
    step = _next(cfg, healer.state)
    if step == "restart":
        return restart_pod(healer, code)
    if step == "replace":
        return replace_pod(healer, code)
    return park(healer, code, report)


def _next(cfg: SelfHealConfig, state: _State) -> str:
    return next((s for s in cfg.ladder if s not in state.steps), "park")


def _safe(pod_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in pod_id)[:100] or "pod"


def _wait_signal(timeout: float | None) -> int | None:
    return wait_for_signal(timeout)


def check_stop_pod(env: Mapping[str, str] | None = None) -> None:
    """`--on-exit stop-pod` is checked before the job runs: inside a pod, with an API key. UsageError if not."""
    require_pod_and_key("--on-exit=stop-pod", hint="; use exit or idle", env=env)


def stop_own_pod(code: int) -> int:
    """After the job: when it succeeded, end this pod's billing through the API (a pod stops; on a cluster, node 0
    deletes the cluster, the other nodes wait for it) and wait for RunPod to end this container; returns `code`.

    A failed request is one warning (the job's exit code wins); the container's restart then finds the job
    finished and tries again."""
    if code != ExitCode.OK:
        console.say(f"job exited {code}: not stopping the pod (--on-exit stop-pod stops after success)")
        return code
    # RunPod's answer ends us; on a cluster, node 0 deletes the cluster once its own job ended (the others wait)
    end_billing(thispod.pod_id(), "job succeeded", by="--on-exit stop-pod", node_zero_only=True)
    return code


# --------------------------------------------------------------------------------------------------
# The three things self-heal can do for its own pod. Each step is recorded in the self-heal state before the
# API is asked (a restart ends this container mid-call, and the next container must know the step was
# taken). Any API failure parks: never a loop.

REPLACE_TIMEOUT_S = 1800.0  # how long the replacement may take to reach RUNNING


def _api() -> PodApi:
    return open_api("rest")


def _ended(healer: Healer, code: int, waited: str) -> int:
    """Wait for the API's action to end this container; the code to exit with if it does not."""
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
    try:
        _api().act(cfg.pod_id, PodAction.RESTART)
    except PodguardError as exc:
        healer.say(f"restart failed: {exc.message}")
        healer.note("restart-failed", exc.message)
        return park(healer, code, None)
    return _ended(healer, code, "restart requested")


def replace_pod(healer: Healer, code: int) -> int:
    """Create an identical pod, wait until it is RUNNING, then terminate this one."""
    cfg, state = healer.cfg, healer.state
    healer.say(f"{state.failures} consecutive preflight failures after a restart: replacing pod {cfg.pod_id}")
    state.steps.append("replace")
    state.failures = 0
    healer.note("replace", "requested")
    started = time.monotonic()  # what the replacement's status lines count from
    new = None
    try:
        api = _api()
        me = api.get_pod(cfg.pod_id)
        request = replacement_request(me, extra_env={ENV_REPLACED_FROM: cfg.pod_id}, made_by="self-heal")
        new = create_first_fit(api, [request], exclude={cfg.pod_id}, mine=lambda p: owned(p, me.name))
        healer.note("replacement-created", new.id)
        tuning = Tuning.from_env()
        running = wait_status(
            api,
            new.id,
            lambda p: p.status is PodStatus.RUNNING,
            deadline=time.monotonic() + REPLACE_TIMEOUT_S,
            tuning=tuning,
            started=started,
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

    cfg, state = healer.cfg, healer.state
    state.parked = True
    healer.note("park", str(cfg.park))
    tried = ", ".join(state.steps) or "nothing"
    where = f"; report: {report}" if report else ""
    healer.say(
        f"PARKED: the preflight keeps failing (last exit {code}; tried: {tried}). The container stays up and idle "
        f"instead of restarting{where}. From a laptop: `podguard pod heal {cfg.pod_id} --replace`",
        loud=True,
    )
    # as a guard ends it: a pod stops, a cluster node deletes its cluster (a failure is one warning, then the idle)
    stop = cfg.park is ParkMode.STOP
    if stop and request_end(cfg.pod_id, "self-heal", by="PODGUARD_PARK=stop").asked is None:
        healer.say("idling instead")
    got = healer.wait_signal(None)
    return signal_exit_code(got) if got is not None else code
