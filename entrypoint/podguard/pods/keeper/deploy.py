"""`pod keep --deploy`: the keeper itself as a small CPU pod on RunPod, so it outlives a laptop.

    keeper = keeper_spec(spec, spec_text, key_secret="runpod_api_key", poll=30, max_recoveries=5, notify=None,
                         gen=7, keep_id="k7-3fa9c2")
    pod, action = deploy_keeper(api, spec, keeper_for=lambda gen, kid: keeper)
    found = keeper_pods(api, "llm-train")        # the keeper pods of the name: podguard's (marked), and strangers
    who = kept_by(api, "llm-train")              # Kept: the keeper pod (alive or lost) and the keepers on this machine

The keeper pod is `<name>-keeper`: the spec's image, a CPU pod, args `pod keep`, made with podguard's mark for its
own name and `PODGUARD_KEEPER_OF=<name>` (a `<name>-keeper` without both is the user's: never touched). What it
needs travels in its environment: the API key only as a RunPod secret reference (`{{ RUNPOD_SECRET_<--key-secret>
}}`: the key itself is never in a request); the spec unchanged, base64 in PODGUARD_KEEP_SPEC_B64 (its own secret
references stay references); the options as their PODGUARD_* variables; and the keep it acts for
(PODGUARD_KEEP_GEN, PODGUARD_KEEP_ID: the generation and identity of the `kept` word `--deploy` wrote in the keep's
record). A keeper pod acts only while the record says that very word: when the keep is over (its own `done`, or the
user's `pod down`/`pod stop`, or a laptop keep that took over), a container RunPod starts again terminates its pod.
"""

from __future__ import annotations

import base64
import binascii
import os
import tomllib
from dataclasses import dataclass, field

from podguard import console
from podguard.errors import UsageError
from podguard.pods import thispod
from podguard.pods.api import PodApi
from podguard.pods.auth import ENV_BASE_URL
from podguard.pods.errors import ApiError
from podguard.pods.keeper.intent import Word
from podguard.pods.keeper.intent_store import IntentStore
from podguard.pods.keeper.options import KNOBS
from podguard.pods.keeper.registry import Entry, entries
from podguard.pods.mark import owned, stranger_line
from podguard.pods.pod import CpuInfo, Pod, PodAction, PodStatus
from podguard.pods.spec import PodSpec, parse_spec
from podguard.pods.tuning import TUNING_ENV

__all__ = [
    "ENV_KEEPER_OF",
    "ENV_KEEP_GEN",
    "ENV_KEEP_ID",
    "ENV_SPEC_B64",
    "KEEPER_CPU",
    "Kept",
    "alive",
    "end_own_pod",
    "keeper_name",
    "keeper_pods",
    "keeper_spec",
    "kept_by",
    "say_unkept",
    "spec_from_env",
]

ENV_SPEC_B64 = "PODGUARD_KEEP_SPEC_B64"
ENV_KEEPER_OF = "PODGUARD_KEEPER_OF"
ENV_KEEP_GEN = "PODGUARD_KEEP_GEN"
ENV_KEEP_ID = "PODGUARD_KEEP_ID"
KEEPER_SUFFIX = "-keeper"
CARRIED = (*KNOBS.values(), *TUNING_ENV.values())  # knobs a keeper pod takes over from the laptop that deploys it
KEEPER_CPU = CpuInfo("cpu3c", 2)  # the smallest general-purpose CPU pod: the keeper sleeps on a socket
KEEPER_DISK_GB = 10
MAX_NAME = 191
_ALIVE = (PodStatus.PROVISIONING, PodStatus.STARTING, PodStatus.RUNNING, PodStatus.UNKNOWN)


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
    gen: int = 0,
    keep_id: str = "",
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
    if gen:
        env[ENV_KEEP_GEN], env[ENV_KEEP_ID] = str(gen), keep_id
    for knob in CARRIED:  # the laptop's tuning, so that the keeper pod keeps time as `pod down` expects it to
        if os.environ.get(knob, "").strip():
            env[knob] = os.environ[knob].strip()
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


def is_keeper_of(pod: Pod, name: str) -> bool:
    """A keeper pod of `name`: podguard's mark for `<name>-keeper`, and PODGUARD_KEEPER_OF naming `name`."""
    return owned(pod, keeper_name(name)) and pod.env.get(ENV_KEEPER_OF) == name


def keeper_pods(api: PodApi, name: str, pods: list[Pod] | None = None) -> tuple[list[Pod], list[Pod]]:
    """The pods named `<name>-keeper`: (podguard's keeper pods of `name`, the others: the user's, never touched)."""
    listed = pods if pods is not None else api.list_pods()
    named = [p for p in listed if p.name == keeper_name(name) and p.status is not PodStatus.TERMINATED]
    return [p for p in named if is_keeper_of(p, name)], [p for p in named if not is_keeper_of(p, name)]


def alive(pod: Pod) -> bool:
    """A keeper pod that is (or may be) running its keeper; EXITED or ERROR: lost."""
    return pod.status in _ALIVE


@dataclass(frozen=True)
class Kept:
    """Who keeps a name: its keeper pods (alive or lost) and the keepers on this machine."""

    pods: list[Pod] = field(default_factory=list)
    local: list[Entry] = field(default_factory=list)
    strangers: list[Pod] = field(default_factory=list)

    def by(self) -> str | None:
        """`<name>-keeper` while a keeper pod is alive, else `pid N on this machine`, else None."""
        live = [p for p in self.pods if alive(p)]
        if live:
            return live[0].name
        pids = sorted(e.pid for e in self.local if e.alive)
        return ", ".join(f"pid {pid}" for pid in pids) + " on this machine" if pids else None

    def view(self) -> dict[str, object] | None:
        """The keeper pod for `--json`: id, status, alive (None without one)."""
        if not self.pods:
            return None
        pod = self.pods[0]
        return {"name": pod.name, "id": pod.id, "status": str(pod.status), "alive": alive(pod)}

    def line(self) -> str | None:
        """`kept by:` in words: the keeper pod and whether it is alive, the keepers here."""
        parts = []
        for pod in self.pods:
            state = "alive" if alive(pod) else "LOST: nothing keeps the pod; `podguard pod keep --spec FILE` takes over"
            parts.append(f"{pod.name} ({pod.id}, {pod.status}: {state})")
        parts += [f"{e.where()} on this machine" for e in self.local if e.alive]
        return "; ".join(parts) or None


def kept_by(api: PodApi, name: str, pods: list[Pod] | None = None) -> Kept:
    """Who keeps `name` (for `pod status`): its keeper pods and the live keepers on this machine."""
    mine, strangers = keeper_pods(api, name, pods)
    return Kept(mine, [e for e in entries(name) if e.alive], strangers)


def describe_stranger(pod: Pod, name: str) -> str:
    return (
        f"{stranger_line(pod)} is named {keeper_name(name)} but is not podguard's keeper of {name} (no podguard mark): "
        "it is never touched"
    )


def say_unkept(api: PodApi, name: str) -> None:
    """`pod start NAME` of a pod whose keep `pod stop` ended: say that nothing keeps it now, and how to."""
    try:
        current = IntentStore(api, name).read()
    except (ApiError, UsageError):
        return
    if current is None or current.word is not Word.STOPPED or kept_by(api, name).by():
        return
    console.say(
        f"note: {name} was kept until `pod stop` ended its keep; nothing keeps it now (a stop, ERROR or a lost host "
        f"is not recovered): `podguard pod keep --spec FILE` (or `--deploy`) keeps it again"
    )


def end_own_pod(api: PodApi, *, failed: str | None = None) -> bool:
    """Inside a keeper pod: terminate this pod (the keep is over; a restarted container must not keep again).
    `failed`: the keeper hit an error no retry fixes (a refused key, a bad spec): stop the pod instead, so that
    RunPod does not restart it into the same error all night and its logs still say why."""
    pod_id = thispod.pod_id()
    if not pod_id:
        return False
    action = PodAction.STOP if failed else PodAction.TERMINATE
    if failed:
        console.say(
            f"the keeper cannot go on ({failed}): stopping its own pod {pod_id} (`podguard pod down` removes it)"
        )
    else:
        console.say(f"the keeper's work is done: terminating its own pod {pod_id}")
    try:
        api.act(pod_id, action)
    except ApiError as exc:
        console.warn(f"could not {action.value} the keeper pod {pod_id} ({exc.message}); `podguard pod down {pod_id}`")
        return False
    return True
