"""Finding clusters by name or id, and creating one without ever creating two.

    cluster = find_cluster(clusters, "llm-train-4x8")          # None when there is none
    cluster = create_cluster_first_fit(clusters, spec.cluster_candidates())   # each step a console line

Creation walks the candidates in the spec's order (GPU types within each data centre) for the whole cluster
at once: every node must fit, in one data centre, or the next candidate is tried. A create whose answer was
lost is looked up by name before it is sent again, as for pods (pods/placement.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from podguard.errors import UsageError
from podguard.pods.clusters.cluster import Cluster, ClusterRequest
from podguard.pods.clusters.rest import ClusterApi
from podguard.pods.placement import first_fit

__all__ = ["clusters_named", "create_cluster_first_fit", "find_cluster"]


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
    exclude: Collection[str] = (),
) -> Cluster:
    """Create the first candidate with room for every node. ApiError NO_CAPACITY (69) lists what was tried."""
    return first_fit(
        candidates,
        api.create_cluster,
        lambda name: clusters_named(api, name, exclude=exclude),
        api.policy,
        kind="cluster",
        none_fits="all nodes of any spec candidate",
    )
