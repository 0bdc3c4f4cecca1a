"""One name, one kind: a spec that makes a pod while a cluster of its name exists (or the other way round) is refused.

    refuse_other_kind(api, spec)     # 64 naming the cluster (pod) of the name that podguard made

An edited spec (a pod turned into a cluster) kept or brought up again would otherwise make the new kind beside the
old one, and leave the old one billing unwatched. `pod up` and `pod keep` check it before they create anything.
"""

from __future__ import annotations

from podguard.errors import UsageError
from podguard.pods.api import PodApi
from podguard.pods.clusters.placement import clusters_named
from podguard.pods.clusters.rest import cluster_api
from podguard.pods.mark import owned
from podguard.pods.pod import PodStatus
from podguard.pods.spec import PodSpec

__all__ = ["refuse_other_kind"]


def refuse_other_kind(api: PodApi, spec: PodSpec) -> None:
    """64 when the spec makes a pod and a cluster of the name exists (or the other way round): a kind change
    would leave the other one billing beside it."""
    if spec.cluster is None:
        clusters = cluster_api(api)
        for c in clusters_named(clusters, spec.name):
            raise UsageError(
                f"the spec makes a pod, but cluster {spec.name} ({c.id}, {c.summary()}) exists: a pod beside it would "
                f"leave it billing; `podguard pod down {c.id}` first, or keep it with its cluster spec"
            )
        return
    for p in api.list_pods():
        if p.name == spec.name and p.status is not PodStatus.TERMINATED and owned(p, spec.name):
            raise UsageError(
                f"the spec makes a cluster, but pod {spec.name} ({p.id}, {p.status}) exists: a cluster beside it would "
                f"leave it billing; `podguard pod down {p.id}` first, or keep it with its pod spec"
            )
