"""What a pod command's POD argument names: a pod, or a cluster (the pod commands take a cluster's name too).

    target = find_target(api, "llm-train")       # a Pod, a Cluster, a Member, or ApiError NOT_FOUND (66)

Pods are looked up first (one `GET /v2/pods`), then clusters (`GET /v2/clusters`), so a command
on a pod costs no cluster request; last, a member pod's id (`includeClusterPods=true`), which the pod
commands treat as that node's pod (status, logs, wait) or, for actions, as a node of its cluster.
"""

from __future__ import annotations

from podguard.pods.api import PodApi
from podguard.pods.clusters.cluster import Cluster, Member
from podguard.pods.clusters.placement import find_cluster
from podguard.pods.clusters.rest import cluster_api, member_from_rest
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.placement import find_pod
from podguard.pods.pod import Pod, PodStatus
from podguard.pods.rest_api import RestApi, parse_answer, pod_from_rest

__all__ = ["find_target", "listing"]


def find_target(api: PodApi, ref: str, *, missing_ok: bool = False) -> Pod | Cluster | Member | None:
    """A pod (by id or name), else a cluster (by id or name), else a cluster's member pod (by id)."""
    pod = find_pod(api, ref, missing_ok=True)
    if pod is not None:
        return pod
    clusters = cluster_api(api)
    cluster = find_cluster(clusters, ref)
    if cluster is not None:
        return cluster
    member = next((m for m in clusters.member_pods() if m.pod.id == ref), None)
    if member is not None or missing_ok:
        return member
    raise ApiError(
        ApiErrorKind.NOT_FOUND, f"no pod named {ref!r} or with that id, and no such cluster (see `podguard pod list`)"
    )


def listing(api: PodApi) -> tuple[list[Pod], list[tuple[Cluster, list[Member]]]]:
    """The account's pods (cluster members left out) and its clusters with their members.

    Over REST: one `GET /v2/pods?includeClusterPods=true` and one `GET /v2/clusters`, whatever the
    number of clusters."""
    clusters_api = cluster_api(api)
    if isinstance(api, RestApi):
        objects = api.list_pod_objects(include_cluster_pods=True)
        pods = [parse_answer(pod_from_rest, o, "list pods") for o in objects if not isinstance(o.get("cluster"), dict)]
        members = [
            parse_answer(member_from_rest, o, "list pods") for o in objects if isinstance(o.get("cluster"), dict)
        ]
    else:
        pods = api.list_pods()
        members = clusters_api.member_pods()
        member_ids = {m.pod.id for m in members}
        pods = [p for p in pods if p.id not in member_ids]
    clusters = clusters_api.list_clusters()
    by_cluster: dict[str, list[Member]] = {c.id: [] for c in clusters}
    for member in members:
        if member.cluster_id in by_cluster:
            by_cluster[member.cluster_id].append(member)
    pods = [p for p in pods if p.status is not PodStatus.TERMINATED]
    return pods, [(c, sorted(by_cluster[c.id], key=lambda m: (m.rank is None, m.rank or 0))) for c in clusters]
