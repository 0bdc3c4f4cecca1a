"""A pod or an Instant Cluster behind one small interface: what `pod up`, `pod heal` and the keeper need of either.

    target = PodTarget(api)                          # or ClusterTarget(cluster_api(api)): pods/clusters/target.py
    listed = target.listed("llm-train")              # ONE listing of the name, as the API shows it
    named = target.named("llm-train")                # of those, what still exists (a pod: TERMINATED left out)
    target.owner(named[0], "llm-train", adopted)     # podguard's mark (a cluster's: its members'; None: not known)
    candidates = target.candidates(spec, keep="up", dc=None)   # marked; a network volume pins its data centre
    made = target.create(candidates[0])              # ONE create attempt (placement.first_fit walks them)
    target.read(made.id); target.terminate(made.id); target.describe(made)
    deleted(target, made.id, within_s=60, poll_s=1)  # terminated, then read back until 404 (sent again half-way)

What is shared is the shape of "a thing of a name that podguard made"; what differs by RunPod's API stays with
each side (docs/pods.md, "One target, a pod or a cluster"): a pod has start/stop/restart, a cluster has none and
is deleted whole; a pod's mark is in its own `env`, a cluster's in its member pods' (`GET /v2/clusters/{id}/pods`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from podguard.errors import UsageError
from podguard.pods.api import PodApi
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.mark import marked_spec, owned, stranger_line
from podguard.pods.placement import create_first_fit, pods_named
from podguard.pods.pod import Pod, PodAction, PodRequest
from podguard.pods.retry import RetryPolicy
from podguard.pods.spec import PodSpec

__all__ = ["PodTarget", "Target", "check_adopted", "deleted", "one_of_name", "pinned"]

T = TypeVar("T")  # what the API shows: a Pod, a Cluster
R = TypeVar("R")  # one create attempt: a PodRequest, a ClusterRequest
Q = TypeVar("Q", bound="Pinnable")


class Pinnable(Protocol):
    """A create request that a data centre can pin (PodRequest, ClusterRequest)."""

    @property
    def data_center(self) -> str | None: ...


class Target(Protocol[T, R]):
    """A pod or a cluster of RunPod's API, as the pod commands and the keeper use it."""

    kind: str  # "pod" | "cluster": how lines name it
    none_fits: str  # how "no capacity" names the candidates (placement.first_fit)

    @property
    def policy(self) -> RetryPolicy: ...

    def listed(self, name: str) -> list[T]: ...

    def named(self, name: str, *, exclude: Collection[str] = ()) -> list[T]: ...

    def read(self, item_id: str) -> T: ...

    def owner(self, item: T, name: str, adopted: Collection[str] = ()) -> bool | None: ...

    def candidates(self, spec: PodSpec, *, keep: str, dc: str | None = None) -> list[R]: ...

    def create(self, request: R) -> T: ...

    def terminate(self, item_id: str) -> None: ...

    def describe(self, item: T) -> str: ...


def pinned(dc: str | None, candidates: Sequence[Q], key: Callable[[Q], object]) -> list[Q]:
    """Candidates in the network volume's data centre (a volume lives in one), one per `key` (the GPU type), in
    order; all of them as they are when no data centre is known."""
    if not dc:
        return list(candidates)
    seen: set[object] = set()
    out: list[Q] = []
    for c in candidates:
        if key(c) not in seen:
            seen.add(key(c))
            out.append(replace(c, data_center=dc))
    return out


def deleted(
    target: Target[T, R],
    item_id: str,
    *,
    within_s: float,
    poll_s: float,
    before_send: Callable[[], None] = lambda: None,
    min_sleep_s: float = 0.0,
) -> bool:
    """Terminate (a cluster: delete) `item_id` and read it back until the API answers 404 (True), sent once more
    half-way; False when it still reads back after `within_s`. `before_send` runs before each send (the keeper's
    fence: the user's word read again)."""
    deadline = time.monotonic() + within_s
    before_send()
    target.terminate(item_id)
    resent = False
    while True:
        try:
            target.read(item_id)
        except ApiError as exc:
            if exc.kind is ApiErrorKind.NOT_FOUND:
                return True
            raise
        if time.monotonic() >= deadline:
            return False
        if not resent and time.monotonic() >= deadline - within_s / 2:
            resent = True
            before_send()
            target.terminate(item_id)
        time.sleep(max(min_sleep_s, min(poll_s, deadline - time.monotonic())))


def check_adopted(kind: str, ids: Collection[str], adopt: Collection[str], name: str) -> None:
    """64 for an `--adopt ID` that no pod (cluster) of the name has."""
    for wanted in adopt:
        if wanted not in ids:
            raise UsageError(f"--adopt {wanted}: no {kind} named {name!r} has that id (see `podguard pod list`)")


def one_of_name(kind: str, ids: Sequence[str], name: str) -> None:
    """64 when more than one pod (cluster) has the name: `pod up` is idempotent by name."""
    if len(ids) > 1:
        raise UsageError(f"{len(ids)} {kind}s are named {name!r} ({', '.join(ids)}); take the extra ones down first")


class PodTarget:
    """A pod: its mark in its own env, candidates one per GPU type and data centre, terminated with an action."""

    kind = "pod"
    none_fits = "any candidate in the spec"

    def __init__(self, api: PodApi) -> None:
        self.api = api

    @property
    def policy(self) -> RetryPolicy:
        return self.api.policy

    def listed(self, name: str) -> list[Pod]:
        return [p for p in self.api.list_pods() if p.name == name]

    def named(self, name: str, *, exclude: Collection[str] = ()) -> list[Pod]:
        return pods_named(self.api, name, exclude=exclude)

    def read(self, item_id: str) -> Pod:
        return self.api.get_pod(item_id)

    def owner(self, item: Pod, name: str, adopted: Collection[str] = ()) -> bool:
        return owned(item, name, adopted)

    def candidates(self, spec: PodSpec, *, keep: str, dc: str | None = None) -> list[PodRequest]:
        made = marked_spec(spec, keep=keep).candidates()
        if spec.volume is not None and spec.volume.network:  # a network volume pins the data centre; a store does not
            return pinned(dc, made, key=lambda c: (c.gpu, c.cpu))
        return made

    def create(self, request: PodRequest) -> Pod:
        return self.api.create_pod(request)

    def first_fit(
        self,
        candidates: Sequence[PodRequest],
        *,
        exclude: Collection[str] = (),
        mine: Callable[[Pod], bool] = lambda pod: True,
    ) -> Pod:
        return create_first_fit(self.api, candidates, exclude=exclude, mine=mine)

    def terminate(self, item_id: str) -> None:
        try:
            self.api.act(item_id, PodAction.TERMINATE)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise

    def describe(self, item: Pod) -> str:
        return stranger_line(item)
