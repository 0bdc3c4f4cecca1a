"""Finding pods by name or id, and creating one without ever creating it twice.

    pod = find_pod(api, "llm-train")                       # by id, else by name; exit 66 when none
    pod = create_first_fit(api, spec.candidates())     # each step a console line

Creation walks the candidates in the spec's order (GPU types within each data centre): "no capacity",
a rule violation (400) or no access to that pool (403) moves to the next one; 402/422/auth stop at once.
A create whose answer was lost (5xx, dropped connection, timeout) is looked up by name before it is sent
again, so a create that happened but did not answer is adopted rather than duplicated.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar

from podguard import console
from podguard.errors import UsageError
from podguard.pods.api import PodApi
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.pod import Pod, PodRequest, PodStatus
from podguard.pods.retry import RetryPolicy, with_retry

__all__ = ["create_first_fit", "find_pod", "first_fit", "pods_named"]

T = TypeVar("T", bound="Created")
R = TypeVar("R", bound="Candidate")

_NEXT_CANDIDATE = (ApiErrorKind.NO_CAPACITY, ApiErrorKind.REJECTED, ApiErrorKind.FORBIDDEN)


def pods_named(api: PodApi, name: str, *, exclude: Collection[str] = ()) -> list[Pod]:
    return [
        p for p in api.list_pods() if p.name == name and p.status is not PodStatus.TERMINATED and p.id not in exclude
    ]


def find_pod(api: PodApi, ref: str, *, missing_ok: bool = False) -> Pod | None:
    """The pod whose id is `ref`, else the one named `ref`. ApiError(NOT_FOUND) -> exit 66 unless missing_ok."""
    pods = api.list_pods()
    for pod in pods:
        if pod.id == ref:
            return pod
    named = [p for p in pods if p.name == ref and p.status is not PodStatus.TERMINATED]
    if len(named) > 1:
        ids = ", ".join(p.id for p in named)
        raise UsageError(f"{len(named)} pods are named {ref!r} ({ids}); name one by its id")
    if named:
        return named[0]
    if missing_ok:
        return None
    raise ApiError(ApiErrorKind.NOT_FOUND, f"no pod named {ref!r} or with that id (see `podguard pod list`)")


def create_first_fit(
    api: PodApi,
    candidates: Sequence[PodRequest],
    *,
    exclude: Collection[str] = (),
    mine: Callable[[Pod], bool] = lambda pod: True,
) -> Pod:
    """Create the first candidate that has capacity. ApiError NO_CAPACITY (69) lists what was tried. A lost answer
    is looked up among the pods of the name that `mine` accepts (podguard's own: never a stranger of the name)."""
    return first_fit(
        candidates,
        api.create_pod,
        lambda name: [p for p in pods_named(api, name, exclude=exclude) if mine(p)],
        api.policy,
        kind="pod",
        none_fits="any candidate in the spec",
    )


class Created(Protocol):
    """What a create returns: a Pod, a Cluster."""

    @property
    def id(self) -> str: ...


class Candidate(Protocol):
    """A create request: pods' PodRequest, clusters' ClusterRequest."""

    @property
    def name(self) -> str: ...

    def describe(self) -> str: ...


def first_fit(
    candidates: Sequence[R],
    create: Callable[[R], T],
    named: Callable[[str], list[T]],
    policy: RetryPolicy,
    *,
    kind: str,
    none_fits: str,
) -> T:
    """The candidate walk shared by pods and clusters: the first one created wins; "no capacity", 400 and 403
    move on; anything else stops. `named(name)` finds what a lost create answer may have made."""
    tried: list[str] = []
    kinds: set[ApiErrorKind] = set()
    for request in candidates:
        console.say(f"creating {kind} {request.name}: {request.describe()}")
        try:
            return _create_once(request, create, named, policy, kind=kind)
        except ApiError as exc:
            if exc.kind not in _NEXT_CANDIDATE:
                raise
            kinds.add(exc.kind)
            tried.append(f"{request.describe()} ({exc.detail or exc.message})")
            console.say(f"  not placed: {exc.detail or exc.message}")
    listing = "; ".join(tried)
    if kinds == {ApiErrorKind.FORBIDDEN}:
        raise ApiError(ApiErrorKind.FORBIDDEN, f"the API key may not create any candidate in the spec: {listing}")
    raise ApiError(ApiErrorKind.NO_CAPACITY, f"no capacity for {none_fits}; tried: {listing}")


def _create_once(
    request: R,
    create: Callable[[R], T],
    named: Callable[[str], list[T]],
    policy: RetryPolicy,
    *,
    kind: str,
) -> T:
    """One candidate, transient failures retried; a possibly-lost create is looked up by name first."""

    def lookup(error: ApiError) -> T | None:
        if error.kind is ApiErrorKind.RATE_LIMITED:
            return None  # a 429 was refused before anything happened
        found = with_retry(lambda: named(request.name), policy, what=f"look up {kind} {request.name}")
        if found:
            console.say(f"the create answer was lost, but {kind} {request.name} exists ({found[0].id}): using it")
            return found[0]
        return None

    return with_retry(
        lambda: create(request),
        policy,
        what=f"create {kind} {request.name}",
        before_retry=lookup,
        announce=True,
    )
