"""`pod up` for a spec with `[cluster]`: create the Instant Cluster (idempotent by name), then wait for every node.

    result = cluster_up(clusters, spec, timeout_s=1800, wait=True, tuning=Tuning(), progress=Progress())

An existing cluster of that name is reused (REST v2 has no start for a cluster: a cluster exists or it
does not). Otherwise the spec's GPU types and data centres are tried in order for all nodes at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from podguard.errors import UsageError
from podguard.pods.clusters.model import Cluster
from podguard.pods.clusters.placement import clusters_named, create_cluster_first_fit
from podguard.pods.clusters.readiness import ClusterOutcome, wait_cluster_ready
from podguard.pods.clusters.rest import ClusterApi
from podguard.pods.progress import Progress
from podguard.pods.retry import with_retry
from podguard.pods.spec import PodSpec
from podguard.pods.tuning import Tuning

__all__ = ["ClusterUpResult", "cluster_up"]


@dataclass(frozen=True)
class ClusterUpResult:
    cluster: Cluster
    action: str  # created | reused
    outcome: ClusterOutcome | None  # None with --no-wait


def cluster_up(
    api: ClusterApi, spec: PodSpec, *, timeout_s: float, wait: bool, tuning: Tuning, progress: Progress
) -> ClusterUpResult:
    assert spec.cluster is not None
    existing = with_retry(lambda: clusters_named(api, spec.name), api.policy, what=f"look up cluster {spec.name}")
    if len(existing) > 1:
        ids = ", ".join(c.id for c in existing)
        raise UsageError(f"{len(existing)} clusters are named {spec.name!r} ({ids}); take the extra ones down first")
    if existing:
        cluster = existing[0]
        if cluster.nodes != spec.cluster.nodes or cluster.gpu.count != (spec.gpu.count if spec.gpu else 0):
            progress.say(
                f"note: cluster {cluster.name} has {cluster.nodes} nodes x {cluster.gpu.count} GPUs, the spec says "
                f"{spec.cluster.nodes} x {spec.gpu.count if spec.gpu else 0}; `pod down` it to recreate"
            )
        progress.say(f"cluster {cluster.name} ({cluster.id}) exists ({cluster.summary()}): reusing it")
        action = "reused"
    else:
        cluster = create_cluster_first_fit(api, spec.cluster_candidates(), say=progress.say)
        progress.say(f"created cluster {cluster.name} ({cluster.id}): {cluster.nodes} nodes")
        action = "created"
    if not wait:
        return ClusterUpResult(cluster, action, None)
    outcome = wait_cluster_ready(api, cluster.id, timeout_s=timeout_s, tuning=tuning, progress=progress)
    return ClusterUpResult(outcome.cluster, action, outcome)
