"""A cluster as pods/target.py's `Target`, and what a pod command's POD argument names: a pod, or a cluster.

    target = ClusterTarget(cluster_api(api))     # named, owner (its members' mark), candidates, create, terminate
    found = find_target(api, "llm-train")        # a Pod, a Cluster, a Member, or ApiError NOT_FOUND (66)

A cluster's mark is read from its member pods (`GET /v2/clusters/{id}/pods`: the Cluster object has no env), once per
cluster: until its members are listed its owner is not known (None). A cluster has no start and no stop: terminating
it is deleting it, whole.

Pods are looked up first (one `GET /v2/pods`), then clusters (`GET /v2/clusters`), so a command
on a pod costs no cluster request; last, a member pod's id (`includeClusterPods=true`), which the pod
commands treat as that node's pod (status, logs, wait) or, for actions, as a node of its cluster.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from podguard.pods.api import PodApi
from podguard.pods.clusters.cluster import Cluster, ClusterRequest, Member
from podguard.pods.clusters.placement import clusters_named, create_cluster_first_fit, find_cluster
from podguard.pods.clusters.rest import ClusterApi, cluster_api, member_from_rest
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.mark import marked_spec, owned
from podguard.pods.placement import find_pod
from podguard.pods.pod import Pod, PodStatus
from podguard.pods.rest_api import RestApi, parse_answer, pod_from_rest
from podguard.pods.retry import RetryPolicy
from podguard.pods.spec import PodSpec
from podguard.pods.target import pinned

__all__ = ["ClusterTarget", "find_target", "listing"]


class ClusterTarget:
    """An Instant Cluster: its mark in its members' env (read once per cluster), candidates one per GPU type for all
    nodes at once, terminated by deleting it."""

    kind = "cluster"
    none_fits = "all nodes of any spec candidate"

    def __init__(self, api: ClusterApi) -> None:
        self.api = api
        self.owners: dict[str, bool] = {}  # cluster id -> podguard's mark on its members (known once listed)

    @property
    def policy(self) -> RetryPolicy:
        return self.api.policy

    def listed(self, name: str) -> list[Cluster]:
        return [c for c in self.api.list_clusters() if c.name == name]

    def named(self, name: str, *, exclude: Collection[str] = ()) -> list[Cluster]:
        return clusters_named(self.api, name, exclude=exclude)

    def read(self, item_id: str) -> Cluster:
        return self.api.get_cluster(item_id)

    def owner(self, item: Cluster, name: str, adopted: Collection[str] = ()) -> bool | None:
        """Whether every member carries podguard's mark for the name (or the cluster was adopted); None until a
        member is listed (one `GET /v2/clusters/{id}/pods` per cluster, then remembered)."""
        if item.id in adopted:
            return True
        self.learn(item, name)
        return self.owners.get(item.id)

    def learn(self, item: Cluster, name: str) -> list[Member]:
        """List the members of a cluster whose owner is not known yet and remember it; what was listed ([] when the
        owner was known already, or no member is listed yet)."""
        if item.id in self.owners:
            return []
        members = self.api.members(item.id)
        if members:
            self.owners[item.id] = all(owned(m.pod, name) for m in members)
        return members

    def candidates(self, spec: PodSpec, *, keep: str, dc: str | None = None) -> list[ClusterRequest]:
        made = marked_spec(spec, keep=keep).cluster_candidates()
        if spec.volume is not None and spec.volume.network:
            return pinned(dc, made, key=lambda c: c.gpu)
        return made

    def create(self, request: ClusterRequest) -> Cluster:
        return self.api.create_cluster(request)

    def first_fit(self, candidates: Sequence[ClusterRequest], *, exclude: Collection[str] = ()) -> Cluster:
        return create_cluster_first_fit(self.api, candidates, exclude=exclude)

    def terminate(self, item_id: str) -> None:
        try:
            self.api.delete_cluster(item_id)
        except ApiError as exc:
            if exc.kind is not ApiErrorKind.NOT_FOUND:
                raise

    def describe(self, item: Cluster) -> str:
        return f"cluster {item.id} ({item.summary()})"


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
