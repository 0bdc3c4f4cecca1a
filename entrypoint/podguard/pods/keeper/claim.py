"""Before a keep begins: may it, and for which word? The checks and the claim of `pod keep` (and `--deploy`).

    refuse_strangers(api, spec, adopt=())          # 64 naming a pod (cluster) of the name without podguard's mark
    mine = claim_here(api, spec, adopt=(), poll_s=1.0)   # a laptop keep: a new `kept` word in the record
    mine = claim_inside(api, spec, env)            # a keeper pod: the word it was deployed for, or KeepOver
    pod, action = deploy(api, spec, make_keeper, adopt=(), poll_s=1.0)   # its lines: the console

A laptop keep refuses a keeper pod that is alive, and takes over from one that is lost (EXITED, ERROR): it is
terminated first (read back), so that it cannot act again. Its word is a new generation: every other keeper of the
name (on this machine or another, or a keeper pod) reads it before its next action and ends. A keeper pod does not
speak for the user: it acts only for the word `--deploy` wrote (PODGUARD_KEEP_GEN/ID in its env), and a newer word
means its keep is over. `--adopt POD_ID` hands a pod (cluster) of the name without the mark over to the keep (the
way in for pods made by hand or by a podguard from before the mark): the adoption is written in the record.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Callable, Collection, Mapping

from podguard import console
from podguard.errors import UsageError
from podguard.pods.api import PodApi
from podguard.pods.clusters.placement import clusters_named
from podguard.pods.clusters.rest import ClusterApi, cluster_api
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.deploy import (
    ENV_KEEP_GEN,
    ENV_KEEP_ID,
    alive,
    describe_stranger,
    keeper_name,
    keeper_pods,
)
from podguard.pods.keeper.intent import Intent, Word, new_keep_id, spoken, why_not
from podguard.pods.keeper.intent_store import IntentStore
from podguard.pods.keeper.record import iso_now
from podguard.pods.mark import marked_spec, owned, stranger_line
from podguard.pods.placement import create_first_fit
from podguard.pods.pod import Pod, PodAction, PodStatus
from podguard.pods.retry import with_retry
from podguard.pods.spec import PodSpec

__all__ = [
    "KeepOver",
    "claim_here",
    "claim_inside",
    "deploy",
    "refuse_strangers",
    "speaker",
    "terminate_and_confirm",
]


class KeepOver(Exception):
    """Inside a keeper pod: the word it was deployed for is over (done, down, stopped, taken over)."""

    def __init__(self, current: Intent | None, why: str) -> None:
        super().__init__(why)
        self.current, self.why = current, why


def speaker(command: str) -> str:
    """Who says a word: `pod down on HOST (USER)`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{command} on {socket.gethostname()} ({user})"


def refuse_strangers(api: PodApi, spec: PodSpec, *, adopt: Collection[str] = (), command: str = "pod keep") -> None:
    """64 when a pod (cluster) of the name exists without podguard's mark and was not handed over with --adopt;
    64 when --adopt names an id that is not a pod (cluster) of the name."""
    found: list[tuple[str, str]]  # (id, how a refusal names it)
    if spec.cluster is not None:
        clusters = cluster_api(api)
        named = clusters_named(clusters, spec.name)
        found = [(c.id, f"cluster {c.id} ({c.summary()})") for c in named]
        theirs = [
            (c.id, f"cluster {c.id} ({c.summary()})") for c in named if not _cluster_owned(clusters, c.id, spec.name)
        ]
    else:
        pods = [p for p in api.list_pods() if p.name == spec.name and p.status is not PodStatus.TERMINATED]
        found = [(p.id, stranger_line(p)) for p in pods]
        theirs = [(p.id, stranger_line(p)) for p in pods if not owned(p, spec.name)]
    ids = {i for i, _ in found}
    for wanted in adopt:
        if wanted not in ids:
            raise UsageError(f"--adopt {wanted}: no pod or cluster named {spec.name!r} has that id (see `pod list`)")
    theirs = [(i, line) for i, line in theirs if i not in adopt]
    if theirs:
        first, line = theirs[0]
        raise UsageError(
            f"{line} is named {spec.name!r} but was not made by podguard (it has no podguard mark): `{command}` will "
            f"not touch it. Give the spec another name, remove it (`podguard pod down {first}`), or hand it over: "
            f"`podguard {command} --spec FILE --adopt {first}` (also the way in for a pod an earlier podguard made)"
        )


def _cluster_owned(clusters: ClusterApi, cluster_id: str, name: str) -> bool:
    members = clusters.members(cluster_id)
    return bool(members) and all(owned(m.pod, name) for m in members)


def terminate_and_confirm(api: PodApi, pod: Pod, *, confirm_s: float = 60.0, poll_s: float = 1.0) -> bool:
    """Terminate `pod` and read it back gone (True), within `confirm_s`."""
    try:
        with_retry(lambda: api.act(pod.id, PodAction.TERMINATE), api.policy, what=f"terminate pod {pod.id}")
    except ApiError as exc:
        if exc.kind not in (ApiErrorKind.NOT_FOUND, ApiErrorKind.CONFLICT):
            raise
    deadline = time.monotonic() + confirm_s
    while time.monotonic() < deadline:
        try:
            if api.get_pod(pod.id).status is PodStatus.TERMINATED:
                return True
        except ApiError as exc:
            if exc.kind is ApiErrorKind.NOT_FOUND:
                return True
            if not exc.retryable:
                raise
        time.sleep(poll_s)
    console.warn(f"pod {pod.id} does not read back terminated yet")
    return False


def claim_here(
    api: PodApi,
    spec: PodSpec,
    *,
    adopt: Collection[str],
    poll_s: float,
    by: str = "pod keep",
    claiming: Callable[[str], None] = lambda keep_id: None,
) -> tuple[Intent, Intent | None]:
    """A laptop keep: refuse a live keeper pod, take over from a lost one, then write a new `kept` word; (that word,
    the record before it). `claiming` is told the new keep's identity before the word is written (the keeper
    notes it in its state first: killed in between, it still knows the word is its own)."""
    mine, strangers = keeper_pods(api, spec.name)
    for pod in strangers:
        console.say(describe_stranger(pod, spec.name))
    for pod in mine:
        if alive(pod):
            raise UsageError(
                f"pod {spec.name} is kept by the keeper pod {pod.name} ({pod.id}, {pod.status}); `podguard pod down "
                f"{pod.name}` first to keep it from here"
            )
    for pod in mine:
        console.say(
            f"the keeper pod {pod.name} ({pod.id}) is {pod.status}: lost; taking over from it (terminating it first)"
        )
        if not terminate_and_confirm(api, pod, poll_s=poll_s):
            raise ApiError(ApiErrorKind.TRANSIENT, f"the lost keeper pod {pod.id} does not read back terminated yet")
    store = IntentStore(api, spec.name)
    current = store.read()
    gen = (current.gen if current is not None else 0) + 1
    word = spoken(current, Word.KEPT, by=speaker(by), at=iso_now(), keep=new_keep_id(gen), adopt=tuple(adopt))
    claiming(word.keep)
    store.write(word)
    return word, current


def claim_inside(api: PodApi, spec: PodSpec, env: Mapping[str, str]) -> Intent:
    """A keeper pod: the `kept` word it was deployed for, as the record still has it; KeepOver when it is over."""
    raw_gen, keep = env.get(ENV_KEEP_GEN, "").strip(), env.get(ENV_KEEP_ID, "").strip()
    if not raw_gen.isdigit() or not keep:
        raise UsageError(
            f"{ENV_KEEP_GEN}/{ENV_KEEP_ID} are not set: this keeper pod was not made by `pod keep --deploy`"
        )
    mine = Intent(Word.KEPT, int(raw_gen), keep)
    current = IntentStore(api, spec.name).read()
    if current is not None and current.word is Word.KEPT and current.gen == mine.gen and current.keep == keep:
        return current
    raise KeepOver(current, why_not(current, mine) or "the keep's record does not name this keeper pod")


def deploy(
    api: PodApi,
    spec: PodSpec,
    make_keeper: Callable[[int, str], PodSpec],
    *,
    adopt: Collection[str],
    poll_s: float,
) -> tuple[Pod, str]:
    """Reuse the keeper pod that is alive, or take over from a lost one and make a new one for a new `kept` word."""
    mine, strangers = keeper_pods(api, spec.name)
    for pod in strangers:
        if pod.id not in adopt:
            raise UsageError(
                f"{describe_stranger(pod, spec.name)}; remove it (`podguard pod down {pod.id}`) or hand it over to be "
                f"replaced: `podguard pod keep --deploy --spec FILE --adopt {pod.id}`"
            )
        console.say(f"{stranger_line(pod)}: handed over with --adopt: replaced by a keeper pod of podguard's own")
        terminate_and_confirm(api, pod, poll_s=poll_s)
    live = [p for p in mine if alive(p)]
    if live:
        return live[0], "reused"
    for pod in mine:
        console.say(f"the keeper pod {pod.name} ({pod.id}) is {pod.status}: lost; replacing it (terminating it first)")
        if not terminate_and_confirm(api, pod, poll_s=poll_s):
            raise ApiError(ApiErrorKind.TRANSIENT, f"the lost keeper pod {pod.id} does not read back terminated yet")
    store = IntentStore(api, spec.name)
    current = store.read()
    gen = (current.gen if current is not None else 0) + 1
    keep = new_keep_id(gen)
    pod_adopt = tuple(a for a in adopt if a not in {p.id for p in strangers})
    store.write(spoken(current, Word.KEPT, by=speaker("pod keep --deploy"), at=iso_now(), keep=keep, adopt=pod_adopt))
    keeper = marked_spec(make_keeper(gen, keep), keep=keep)

    pod = create_first_fit(api, keeper.candidates(), mine=lambda p: owned(p, keeper_name(spec.name)))
    return pod, "created"
