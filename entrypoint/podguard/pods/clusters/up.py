"""`pod up` for a spec with `[cluster]`: create the Instant Cluster (idempotent by name), then wait for every node.

    result = cluster_up(clusters, spec, timeout_s=1800, wait=True, tuning=Tuning())   # its lines: the console

An existing cluster of that name is reused (REST v2 has no start for a cluster: a cluster exists or it
does not). Otherwise the spec's GPU types and data centres are tried in order for all nodes at once.
A spec whose pods get a billing guard (`[limits]`) is told once, up front, that a guard deletes the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from podguard import console
from podguard.errors import UsageError
from podguard.pods.clusters.cluster import Cluster
from podguard.pods.clusters.readiness import ClusterOutcome, wait_cluster_ready
from podguard.pods.clusters.rest import ClusterApi
from podguard.pods.clusters.target import ClusterTarget
from podguard.pods.kinds import refuse_other_kind
from podguard.pods.limits import GUARD_KEYS, LIMIT_KEYS
from podguard.pods.retry import with_retry
from podguard.pods.spec import PodSpec
from podguard.pods.target import check_adopted, one_of_name
from podguard.pods.tuning import Tuning

__all__ = ["ClusterUpResult", "cluster_up", "guards_on"]


@dataclass(frozen=True)
class ClusterUpResult:
    cluster: Cluster
    action: str  # created | reused
    outcome: ClusterOutcome | None  # None with --no-wait


def guards_on(env: Mapping[str, str]) -> list[str]:
    """The billing guards the pods' environment turns on (from `[limits]` or `[env]`; `0`/`off` is off)."""
    on = []
    for variable, parse, _valid in (LIMIT_KEYS[key] for key in GUARD_KEYS):
        if variable not in env:
            continue
        try:
            if parse(env[variable], variable) is None:
                continue
        except UsageError:
            pass  # a bad value set through [env]: the pod refuses it (64); it is still meant as a guard
        on.append(variable)
    return on


def cluster_up(
    api: ClusterApi,
    spec: PodSpec,
    *,
    timeout_s: float,
    wait: bool,
    tuning: Tuning,
    adopt: tuple[str, ...] = (),
) -> ClusterUpResult:
    assert spec.cluster is not None
    if guards_on(spec.env):
        console.say(
            f"note: [limits] on a cluster: a billing guard that fires on any node deletes cluster {spec.name} "
            f"(all {spec.cluster.nodes} nodes; member pods cannot be stopped and a cluster has no stop; network "
            "volumes stay), and --max-cost counts every node's spend"
        )
    refuse_other_kind(api.pods, spec)
    target = ClusterTarget(api)
    existing = with_retry(lambda: target.named(spec.name), api.policy, what=f"look up cluster {spec.name}")
    check_adopted(target.kind, {c.id for c in existing}, adopt, spec.name)
    for cluster in existing:
        if target.owner(cluster, spec.name) is False and cluster.id not in adopt:
            raise UsageError(
                f"cluster {cluster.id} ({cluster.summary()}) is named {spec.name!r} but was not made by podguard (its "
                f"pods have no podguard mark): `pod up` will not touch it. Give the spec another name, remove it "
                f"(`podguard pod down {cluster.id}`), or hand it over: `podguard pod up --spec FILE --adopt "
                f"{cluster.id}`"
            )
    one_of_name(target.kind, [c.id for c in existing], spec.name)
    if existing:
        cluster = existing[0]
        if cluster.nodes != spec.cluster.nodes or cluster.gpu.count != (spec.gpu.count if spec.gpu else 0):
            console.say(
                f"note: cluster {cluster.name} has {cluster.nodes} nodes x {cluster.gpu.count} GPUs, the spec says "
                f"{spec.cluster.nodes} x {spec.gpu.count if spec.gpu else 0}; `pod down` it to recreate"
            )
        console.say(f"cluster {cluster.name} ({cluster.id}) exists ({cluster.summary()}): reusing it")
        action = "reused"
    else:
        cluster = target.first_fit(target.candidates(spec, keep="up"))
        console.say(f"created cluster {cluster.name} ({cluster.id}): {cluster.nodes} nodes")
        action = "created"
    if not wait:
        return ClusterUpResult(cluster, action, None)
    outcome = wait_cluster_ready(api, cluster.id, timeout_s=timeout_s, tuning=tuning)
    return ClusterUpResult(outcome.cluster, action, outcome)
