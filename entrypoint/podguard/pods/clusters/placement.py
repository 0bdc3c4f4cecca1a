"""Finding clusters by name or id, and creating one without ever creating two.

    cluster = find_cluster(clusters, "llm-train-4x8")          # None when there is none
    cluster = create_cluster_first_fit(clusters, spec.cluster_candidates(), say=progress.say)

Creation walks the candidates in the spec's order (GPU types within each data centre) for the whole cluster
at once: every node must fit, in one data centre, or the next candidate is tried. A create whose answer was
lost is looked up by name before it is sent again, as for pods (pods/placement.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from podguard.errors import UsageError
from podguard.pods.clusters.model import Cluster, ClusterRequest
from podguard.pods.clusters.rest import ClusterApi
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.retry import with_retry

__all__ = ["clusters_named", "create_cluster_first_fit", "find_cluster"]

_NEXT_CANDIDATE = (ApiErrorKind.NO_CAPACITY, ApiErrorKind.REJECTED, ApiErrorKind.FORBIDDEN)


def clusters_named(api: ClusterApi, name: str, *, exclude: Collection[str] = ()) -> list[Cluster]:
    return [c for c in api.list_clusters() if c.name == name and c.id not in exclude]


def find_cluster(api: ClusterApi, ref: str) -> Cluster | None:
    """The cluster whose id is `ref`, else the one named `ref`; None when there is none."""
    clusters = api.list_clusters()
    for cluster in clusters:
        if cluster.id == ref:
            return cluster
    named = [c for c in clusters if c.name == ref]
    if len(named) > 1:
        ids = ", ".join(c.id for c in named)
        raise UsageError(f"{len(named)} clusters are named {ref!r} ({ids}); name one by its id")
    return named[0] if named else None


def create_cluster_first_fit(
    api: ClusterApi,
    candidates: Sequence[ClusterRequest],
    *,
    say: Callable[[str], None],
    exclude: Collection[str] = (),
) -> Cluster:
    """Create the first candidate with room for every node. ApiError NO_CAPACITY (69) lists what was tried."""
    tried: list[str] = []
    kinds: set[ApiErrorKind] = set()
    for request in candidates:
        say(f"creating cluster {request.name}: {request.describe()}")
        try:
            return _create_once(api, request, say=say, exclude=exclude)
        except ApiError as exc:
            if exc.kind not in _NEXT_CANDIDATE:
                raise
            kinds.add(exc.kind)
            tried.append(f"{request.describe()} ({exc.detail or exc.message})")
            say(f"  not placed: {exc.detail or exc.message}")
    listing = "; ".join(tried)
    if kinds == {ApiErrorKind.FORBIDDEN}:
        raise ApiError(ApiErrorKind.FORBIDDEN, f"the API key may not create any candidate in the spec: {listing}")
    raise ApiError(ApiErrorKind.NO_CAPACITY, f"no capacity for all nodes of any spec candidate; tried: {listing}")


def _create_once(
    api: ClusterApi, request: ClusterRequest, *, say: Callable[[str], None], exclude: Collection[str]
) -> Cluster:
    def lookup(error: ApiError) -> Cluster | None:
        if error.kind is ApiErrorKind.RATE_LIMITED:
            return None  # a 429 was refused before anything happened
        found = with_retry(
            lambda: clusters_named(api, request.name, exclude=exclude),
            api.policy,
            what=f"look up cluster {request.name}",
        )
        if found:
            say(f"the create answer was lost, but cluster {request.name} exists ({found[0].id}): using it")
            return found[0]
        return None

    return with_retry(
        lambda: api.create_cluster(request),
        api.policy,
        what=f"create cluster {request.name}",
        before_retry=lookup,
        on_wait=say,
    )
