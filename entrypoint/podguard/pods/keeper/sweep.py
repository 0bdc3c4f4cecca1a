"""`pod down NAME` and `pod stop NAME`: the user's word, written first, then nothing of the name left billing.

    done = end_name(api, "llm-train", Word.DOWN, tuning=Tuning.from_env())
    done.changed, done.left, done.waited_s

1. The word (`down`, `stopped`) goes into the keep's record (intent_store.py), when a keep ever claimed the name:
   every keeper of the name, here, on another machine or in a keeper pod, reads it before its next action and ends.
   (No record: no keeper can act on the name, and none is made: a plain `pod down` leaves no template behind.)
2. Every keeper of the name on this machine ends, whatever its HOME (registry.py: a pid is signalled only while it
   is proven to be one); each keeper pod of the name (podguard's mark) is terminated and read back gone.
3. A sweep: every pod and cluster of the name that is podguard's (its mark, or adopted) is terminated (`down`), or
   the pod stopped and any second one terminated (`stop`), each read back; and the sweep goes on past the last moment
   a create (start) that a keeper sent could land: the leases in the registry (for a keeper pod, whose leases are
   not readable from here, the whole bound: its request timeout plus PODGUARD_KEEP_LAND_S, once it is gone). It says
   so while it waits. Pods of the name without podguard's mark are the user's and are never swept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from podguard import console
from podguard.pods.api import PodApi
from podguard.pods.clusters.rest import cluster_api
from podguard.pods.clusters.target import ClusterTarget
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.claim import speaker, terminate_and_confirm
from podguard.pods.keeper.converge import Seen, pick
from podguard.pods.keeper.deploy import describe_stranger, keeper_pods
from podguard.pods.keeper.fence import LAND_S
from podguard.pods.keeper.intent import Intent, Word, spoken
from podguard.pods.keeper.intent_store import IntentStore
from podguard.pods.keeper.record import iso_now
from podguard.pods.keeper.registry import end_local_keepers
from podguard.pods.mark import owned
from podguard.pods.pod import Pod, PodAction, PodStatus
from podguard.pods.target import deleted
from podguard.pods.tuning import Tuning

__all__ = ["Ended", "end_name", "land_s"]

ENV_LAND_S = "PODGUARD_KEEP_LAND_S"


def land_s(env: dict[str, str]) -> float:
    """How long after its answer's deadline a create may still land (PODGUARD_KEEP_LAND_S, default 60 s)."""
    raw = env.get(ENV_LAND_S, "").strip()
    try:
        value = float(raw) if raw else LAND_S
    except ValueError:
        value = LAND_S
    return value if value >= 0 else LAND_S


@dataclass
class Ended:
    intent: Intent | None = None  # the word written (None: no keep of the name ever wrote one, or it failed)
    kept_before: bool = False  # a record of the name existed: the name is podguard's (a keep ever claimed it)
    keepers: list[str] = field(default_factory=list)  # the keepers ended, in words
    terminated: list[str] = field(default_factory=list)  # pod and cluster ids terminated (deleted)
    stopped: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)  # stopped before the command (`pod stop` of an EXITED pod)
    left: list[str] = field(default_factory=list)  # the keeper's own still billing at the end (not confirmed)
    owned_seen: bool = False  # a pod (cluster) of the name that is podguard's was there
    waited_s: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.keepers or self.terminated or self.stopped)

    @property
    def touched(self) -> bool:
        """A pod or cluster of the name was there (stopped, taken down, or found stopped already)."""
        return bool(self.terminated or self.stopped or self.already or self.owned_seen)


def end_name(api: PodApi, name: str, word: Word, *, tuning: Tuning) -> Ended:
    """Write `word` (down | stopped), end every keeper of `name`, then sweep until nothing of the name can bill."""
    ended = Ended()
    store = IntentStore(api, name)
    command = "pod down" if word is Word.DOWN else "pod stop"
    adopted: tuple[str, ...] = ()
    try:
        current = store.read()
        if current is not None:  # no record: no keep ever claimed the name, and none can act on it (nothing to tell)
            ended.kept_before = True
            ended.intent = spoken(current, word, by=speaker(command), at=iso_now())
            adopted = ended.intent.adopted
            store.write(ended.intent)
    except ApiError as exc:
        if exc.kind not in (ApiErrorKind.TRANSIENT, ApiErrorKind.RATE_LIMITED, ApiErrorKind.FORBIDDEN):
            raise
        ended.intent, ended.kept_before = None, True
        console.warn(f"the keep's record could not be written ({exc.message}); keepers on this machine are ended here")
    local = end_local_keepers(name, wait_s=tuning.request_timeout_s + 5.0)
    ended.keepers += [f"pid {e.pid}" for e in local.ended]
    until = local.lease_until
    mine, strangers = keeper_pods(api, name)
    for pod in strangers:
        console.say(describe_stranger(pod, name))
    for pod in mine:
        console.say(f"ending the keeper pod {pod.name} ({pod.id}) first")
        running = pod.status in (PodStatus.RUNNING, PodStatus.STARTING, PodStatus.PROVISIONING, PodStatus.UNKNOWN)
        if not terminate_and_confirm(api, pod, poll_s=tuning.poll_s):
            ended.left.append(pod.id)
        ended.keepers.append(pod.name)
        if running:  # it may have sent a create just before it went: its leases are not readable from here
            timeout = _float(pod.env.get("PODGUARD_API_TIMEOUT_S"), Tuning.request_timeout_s)  # as the pod keeps time
            until = max(until, time.time() + timeout + land_s(pod.env))
    started = time.monotonic()
    told = False
    while True:
        _sweep(api, name, word, adopted, ended, tuning)
        left = until - time.time()
        if left <= 0:
            break
        if not told:
            told = True
            console.say(
                f"waiting up to {left:.0f} s: a create (or start) a keeper sent may still land; sweeping {name} every "
                f"{max(tuning.poll_s, 0.05):g} s until then"
            )
        time.sleep(max(0.05, min(tuning.poll_s, left)))
    ended.waited_s = time.monotonic() - started
    return ended


def _float(raw: str | None, default: float) -> float:
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


def _sweep(api: PodApi, name: str, word: Word, adopted: tuple[str, ...], ended: Ended, tuning: Tuning) -> None:
    """One pass: the keeper's own pods and clusters of the name taken down (or the pod stopped)."""
    pods = [p for p in api.list_pods() if p.name == name and p.status is not PodStatus.TERMINATED]
    mine = [p for p in pods if owned(p, name, adopted)]
    if mine:
        ended.owned_seen = True
    keep: Pod | None = None
    if word is Word.STOPPED and mine:
        seen = [Seen(p.id, p.status, True, p.created_at, runs=p.status is PodStatus.RUNNING) for p in mine]
        chosen = pick(seen, "").id
        keep = next(p for p in mine if p.id == chosen)
    for pod in mine:
        if pod is keep:
            if pod.status is PodStatus.EXITED:
                if pod.id not in ended.stopped + ended.already:
                    ended.already.append(pod.id)
                    console.say(f"pod {name} ({pod.id}) is already EXITED")
            elif _stop(api, pod, tuning):
                if pod.id not in ended.stopped:
                    ended.stopped.append(pod.id)
                    console.say(f"pod {name} ({pod.id}) stopped; its disk and volume stay")
            else:
                ended.left.append(pod.id)
            continue
        if terminate_and_confirm(api, pod, poll_s=tuning.poll_s):
            ended.terminated.append(pod.id)
            console.say(f"pod {name} ({pod.id}) terminated")
        else:
            ended.left.append(pod.id)
    clusters = ClusterTarget(cluster_api(api))
    for cluster in clusters.named(name):
        if not clusters.owner(cluster, name) and cluster.id not in adopted:
            continue
        ended.owned_seen = True
        if deleted(clusters, cluster.id, within_s=60.0, poll_s=tuning.poll_s, min_sleep_s=0.05):
            ended.terminated.append(cluster.id)
            console.say(f"cluster {name} ({cluster.id}) deleted: all {cluster.nodes} nodes")
        else:
            ended.left.append(cluster.id)


def _stop(api: PodApi, pod: Pod, tuning: Tuning) -> bool:
    """Stop `pod` and read it back EXITED (within a minute; sent again once)."""
    deadline = time.monotonic() + 60.0
    sent = 0
    while time.monotonic() < deadline:
        try:
            now = api.get_pod(pod.id)
        except ApiError as exc:
            if exc.kind is ApiErrorKind.NOT_FOUND:
                return True
            raise
        if now.status is PodStatus.EXITED:
            return True
        if sent < 2 and (sent == 0 or time.monotonic() > deadline - 30.0):
            sent += 1
            try:
                api.act(pod.id, PodAction.STOP)
            except ApiError as exc:
                if exc.kind not in (ApiErrorKind.CONFLICT, ApiErrorKind.NOT_FOUND):
                    raise
        time.sleep(max(0.05, tuning.poll_s))
    return False
