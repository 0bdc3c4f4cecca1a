"""`pod keep --deploy`: the keeper itself as a small CPU pod on RunPod, so it outlives a laptop.

    pod, action = deploy_keeper(api, spec, spec_text, key_secret="runpod_api_key", poll=30, ...)
    kept_by(api, "llm-train")           # "llm-train-keeper" (a keeper pod), "pid 4242 on this machine", or None
    end_keepers(api, "llm-train", say)  # `pod down`/`pod stop` end the keepers first (also with no pod of the name)
    say_unkept(api, "llm-train", say)   # `pod start` of a pod whose keeper `pod stop` ended: how to keep it again

The keeper pod is `<name>-keeper`: the spec's image, a CPU pod, args `pod keep`, idempotent by its name (it is
made with `pod up`'s own code). What it needs travels in its environment:
- the API key only as a RunPod secret reference, `{{ RUNPOD_SECRET_<--key-secret> }}` (RunPod fills it in inside
  the pod; the key itself is never in a request);
- the spec file unchanged, base64 in PODGUARD_KEEP_SPEC_B64 (its own `{{ RUNPOD_SECRET_... }}` references stay
  references: RunPod does not look inside base64);
- PODGUARD_KEEPER_OF (the kept name), and the options as their PODGUARD_* variables.
A deployed keeper terminates its own pod when the job is over (success, failure, guard, give-up), so RunPod's
restart of its container does not start keeping again.
"""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Callable

from podguard.errors import PodguardError, UsageError
from podguard.pods.actions import act_on
from podguard.pods.api import PodApi
from podguard.pods.auth import ENV_BASE_URL
from podguard.pods.keeper.record import KeepState, KeepStore, live_keepers
from podguard.pods.model import CpuInfo, Pod, PodAction
from podguard.pods.placement import pods_named
from podguard.pods.spec import PodSpec

__all__ = [
    "ENV_KEEPER_OF",
    "ENV_SPEC_B64",
    "KEEPER_CPU",
    "deploy_keeper",
    "end_keepers",
    "end_own_pod",
    "keeper_name",
    "keeper_spec",
    "kept_by",
    "say_unkept",
    "spec_from_env",
]

ENV_SPEC_B64 = "PODGUARD_KEEP_SPEC_B64"
ENV_KEEPER_OF = "PODGUARD_KEEPER_OF"
KEEPER_SUFFIX = "-keeper"
KEEPER_CPU = CpuInfo("cpu3c", 2)  # the smallest general-purpose CPU pod: the keeper sleeps on a socket
KEEPER_DISK_GB = 10
MAX_NAME = 191


def keeper_name(name: str) -> str:
    return f"{name}{KEEPER_SUFFIX}"


def keeper_spec(
    spec: PodSpec,
    spec_text: bytes,
    *,
    key_secret: str,
    poll: float,
    max_recoveries: int,
    notify: str | None,
) -> PodSpec:
    """The keeper pod's spec: same image, a small CPU pod, `pod keep` with the spec and options in its env."""
    name = keeper_name(spec.name)
    if len(name) > MAX_NAME:
        raise UsageError(f"name {spec.name!r} is too long for a keeper pod ({name!r} is over {MAX_NAME} characters)")
    env = {
        "RUNPOD_API_KEY": f"{{{{ RUNPOD_SECRET_{key_secret} }}}}",
        ENV_SPEC_B64: base64.b64encode(spec_text).decode("ascii"),
        ENV_KEEPER_OF: spec.name,
        "PODGUARD_POLL": f"{poll:g}",
        "PODGUARD_MAX_RECOVERIES": str(max_recoveries),
    }
    if notify:
        env["PODGUARD_NOTIFY"] = notify
    base = os.environ.get(ENV_BASE_URL, "").strip()
    if base:
        env[ENV_BASE_URL] = base  # the API the laptop talks to (never credentials: auth.py refuses them in it)
    return PodSpec(
        name=name,
        image=spec.image,
        args="pod keep",
        cloud="SECURE",
        disk_gb=KEEPER_DISK_GB,
        ports=(),
        ssh=False,
        cpu=KEEPER_CPU,
        env=env,
    )


def spec_from_env(env: dict[str, str] | None = None) -> tuple[PodSpec, bytes] | None:
    """Inside a keeper pod: the spec from PODGUARD_KEEP_SPEC_B64 (64 when it does not decode); None if unset."""
    import binascii
    import tomllib

    from podguard.pods.spec import parse_spec

    env = dict(os.environ) if env is None else env
    raw = env.get(ENV_SPEC_B64, "").strip()
    if not raw:
        return None
    try:
        text = base64.b64decode(raw, validate=True)
        data = tomllib.loads(text.decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{ENV_SPEC_B64} is not a base64-encoded TOML spec ({type(exc).__name__})") from None
    return parse_spec(data, where=ENV_SPEC_B64), text


def deploy_keeper(api: PodApi, keeper: PodSpec, *, say: Callable[[str], None]) -> tuple[Pod, str]:
    """Create the keeper pod, or reuse / start the one of that name (`pod up`'s idempotency, no wait)."""
    from podguard.pods.progress import Progress
    from podguard.pods.tuning import Tuning
    from podguard.pods.up import pod_up

    result = pod_up(api, keeper, timeout_s=0, wait=False, tuning=Tuning.from_env(), progress=Progress(quiet=True))
    pod = result.pod
    if result.action != "created":
        running = pod.env.get(ENV_SPEC_B64)
        if running is not None and running != keeper.env[ENV_SPEC_B64]:
            say(
                f"note: keeper pod {pod.name} keeps an older version of the spec; `podguard pod down {pod.name}` "
                "and deploy again to change it"
            )
    return pod, result.action


def kept_by(api: PodApi, name: str, pods: list[Pod] | None = None) -> str | None:
    """Who keeps `name`: its keeper pod's name, a live keeper on this machine, or None."""
    listed = pods if pods is not None else api.list_pods()
    keeper = keeper_name(name)
    if any(p.name == keeper and str(p.status) not in ("TERMINATED", "EXITED") for p in listed):
        return keeper  # (a stopped keeper pod keeps nothing)
    pids = _local_keepers(name)
    return ", ".join(f"pid {pid}" for pid in sorted(pids)) + " on this machine" if pids else None


def _local_keeper(name: str) -> int | None:
    try:
        return KeepStore.open(name).holder()
    except (PodguardError, OSError):
        return None


def _local_keepers(name: str) -> set[int]:
    """Every live keeper of `name` on this machine: this state dir's, and those of any other (record.py)."""
    pid = _local_keeper(name)
    return live_keepers(name) | ({pid} if pid else set())


def end_keepers(
    api: PodApi, name: str, say: Callable[[str], None], *, outcome: str = "down", wait_s: float = 30.0
) -> bool:
    """`pod down NAME` / `pod stop NAME`: end a keeper on this machine (SIGTERM, through its lock) and terminate
    keeper pods, before NAME is touched, also when no pod of the name exists (a keeper waiting for capacity
    would make it later). The local state is marked done (`outcome`), so that nothing brings NAME back. True when
    a keeper was ended."""
    ended = False
    for pid in sorted(_local_keepers(name)):  # this state dir's, and those started with another one
        try:
            os.kill(pid, signal.SIGTERM)
            say(f"ending the keeper of {name} on this machine (pid {pid}) first")
            ended = True
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + wait_s
    while ended and _local_keepers(name) and time.monotonic() < deadline:  # a create in flight: its answer first
        time.sleep(0.05)
    keeper_pods = pods_named(api, keeper_name(name))
    for pod in keeper_pods:
        say(f"ending the keeper pod {pod.name} ({pod.id}) first")
        act_on(api, pod, PodAction.TERMINATE)
        ended = True
    _mark_done(name, outcome, keeper_pods[0].name if keeper_pods else "")
    if ended and outcome == "stopped":
        say(
            f"{name} is no longer kept: nothing starts it again; `podguard pod keep --spec FILE` (or `--deploy`) "
            "keeps it again"
        )
    return ended


def _mark_done(name: str, outcome: str, keeper_pod: str) -> None:
    """A keep started again later must not bring back what `pod down`/`pod stop` ended; `pod start` reads it."""
    try:
        store = KeepStore.open(name)
        state = store.load()
        if state is None and keeper_pod:  # kept from a keeper pod: its state was there, remember the stop here
            state = KeepState(name=name, kind="pod", keeper_pod=keeper_pod)
        if state is None or state.done:
            return
        state.phase, state.outcome = "done", outcome
        store.save(state)
    except (PodguardError, OSError):
        return
    verb = "took it down" if outcome == "down" else "stopped it"
    store.event(outcome, f"`podguard pod {'down' if outcome == 'down' else 'stop'} {name}` {verb}: the keeper ended")


def say_unkept(api: PodApi, name: str, say: Callable[[str], None]) -> None:
    """`pod start NAME` of a pod whose keeper `pod stop` ended: say that nothing keeps it now, and how to."""
    try:
        state = KeepStore.open(name).load()
    except (PodguardError, OSError):
        return
    if state is None or state.outcome != "stopped" or kept_by(api, name):
        return
    say(
        f"note: {name} was kept until `pod stop` ended its keeper; nothing keeps it now (a stop, ERROR or a lost host "
        f"is not recovered): `podguard pod keep --spec FILE` (or `--deploy`) keeps it again"
    )


def end_own_pod(api: PodApi, say: Callable[[str], None], *, failed: str | None = None) -> bool:
    """Inside a keeper pod: terminate this pod (the job is over; a restarted container must not keep again).
    `failed`: the keeper hit an error no retry fixes (a refused key, a bad spec): stop the pod instead, so that
    RunPod does not restart it into the same error all night and its logs still say why."""
    pod_id = os.environ.get("RUNPOD_POD_ID", "").strip()
    if not pod_id:
        return False
    from podguard.pods.errors import ApiError

    action = PodAction.STOP if failed else PodAction.TERMINATE
    if failed:
        say(f"the keeper cannot go on ({failed}): stopping its own pod {pod_id} (`podguard pod down` removes it)")
    else:
        say(f"the keeper's work is done: terminating its own pod {pod_id}")
    try:
        api.act(pod_id, action)
    except ApiError as exc:
        say(f"warning: could not {action.value} the keeper pod {pod_id} ({exc.message}); `podguard pod down {pod_id}`")
        return False
    return True
