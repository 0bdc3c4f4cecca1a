"""Clusters over RunPod's REST v2 (`/v2/clusters`), sharing the pod client's transport and retry policy.

    clusters = cluster_api(api)                  # 64 when `api` is the GraphQL client: clusters are REST only
    clusters.list_clusters(); clusters.get_cluster(cid); clusters.members(cid)
    clusters.create_cluster(request)             # one attempt, never retried (placement.py looks a lost one up)
    clusters.delete_cluster(cid)

REST v2 has no start/stop/restart for a cluster; member pods take pod actions only where the API allows.
RunPod's spec says member pods "cannot be modified or deleted via the pod endpoints" without naming the
status of that refusal (409 for a terminate; 409 or 400 for an action; a 403 is possible), so callers treat
any of `member_refused()` as the expected answer "manage it through the cluster". Unknown answer fields are
ignored.
"""

from __future__ import annotations

from typing import Any

from podguard.errors import UsageError
from podguard.pods.api import PodApi
from podguard.pods.clusters.cluster import Cluster, ClusterRequest, Member
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.pod import GpuInfo, Pod
from podguard.pods.rest_api import RestApi, answer_field, mounts_body, parse_answer, pod_from_rest, too_large
from podguard.pods.retry import RetryPolicy
from podguard.pods.transport import path_of

__all__ = [
    "ClusterApi",
    "cluster_api",
    "cluster_create_body",
    "cluster_from_rest",
    "member_from_rest",
    "member_refused",
    "not_a_cluster_action",
]


class ClusterApi:
    def __init__(self, rest: RestApi) -> None:
        self.rest = rest

    @property
    def policy(self) -> RetryPolicy:
        return self.rest.policy

    @property
    def pods(self) -> PodApi:
        return self.rest

    def list_clusters(self) -> list[Cluster]:
        body = self.rest.call("list clusters", "GET", "/v2/clusters")
        return [
            parse_answer(cluster_from_rest, c, "list clusters") for c in answer_field(body, "clusters", "list clusters")
        ]

    def get_cluster(self, cluster_id: str) -> Cluster:
        body = self.rest.call(f"get cluster {cluster_id}", "GET", path_of("v2", "clusters", cluster_id))
        return parse_answer(cluster_from_rest, body, "get cluster")

    def members(self, cluster_id: str) -> list[Member]:
        what = f"list the pods of cluster {cluster_id}"
        body = self.rest.call(what, "GET", path_of("v2", "clusters", cluster_id, "pods"))
        members = [parse_answer(member_from_rest, p, what) for p in answer_field(body, "pods", what)]
        return sorted(members, key=lambda m: (m.rank is None, m.rank or 0, m.pod.id))

    def member_pods(self) -> list[Member]:
        """Every cluster member pod of the account (one `GET /v2/pods?includeClusterPods=true`)."""
        objects = self.rest.list_pod_objects(include_cluster_pods=True)
        return [parse_answer(member_from_rest, p, "list pods") for p in objects if isinstance(p.get("cluster"), dict)]

    def create_cluster(self, request: ClusterRequest) -> Cluster:
        payload = cluster_create_body(request)
        try:
            body = self.rest.transport.request("POST", "/v2/clusters", body=payload)
        except ApiError as exc:
            raise too_large(exc, payload, "cluster") from None
        return parse_answer(cluster_from_rest, body, "create cluster")

    def delete_cluster(self, cluster_id: str) -> None:
        self.rest.call(f"delete cluster {cluster_id}", "DELETE", path_of("v2", "clusters", cluster_id))


def cluster_api(api: PodApi) -> ClusterApi:
    """The cluster client over the same REST transport as `api` (GraphQL's client carries one as `.rest`)."""
    rest = api if isinstance(api, RestApi) else getattr(api, "rest", None)
    if not isinstance(rest, RestApi):
        raise UsageError("clusters are managed through REST v2 only; drop --api graphql")
    return ClusterApi(rest)


def cluster_from_rest(d: dict[str, Any]) -> Cluster:
    """A REST v2 `Cluster` object (extra fields ignored)."""
    compute = d["compute"]
    pods = d.get("pods") or {}
    primary = d.get("primary") or {}
    by_status = pods.get("byStatus") or {}
    return Cluster(
        id=str(d["id"]),
        name=str(d.get("name", "")),
        type=str(d.get("type") or "TRAINING"),
        gpu=GpuInfo(str(compute["gpuTypeId"]), int(compute["gpuCountPerPod"])),
        nodes=int(compute["podCount"]),
        by_status={str(k).upper(): int(v) for k, v in by_status.items()},
        total=int(pods.get("total") or 0),
        data_center=d.get("dataCenterId"),
        primary_pod_id=primary.get("podId"),
        primary_ssh=primary.get("sshEndpoint"),
        created_at=d.get("createdAt"),
    )


def member_from_rest(d: dict[str, Any]) -> Member:
    """A member pod object: the pod plus its `cluster {id, rank, ip}`."""
    pod: Pod = pod_from_rest(d)
    cluster = d.get("cluster") or {}
    rank = cluster.get("rank")
    return Member(pod=pod, rank=None if rank is None else int(rank), ip=cluster.get("ip"), cluster_id=cluster.get("id"))


def cluster_create_body(r: ClusterRequest) -> dict[str, Any]:
    """The POST /v2/clusters body (REST v2 CreateClusterRequest; it has no `registry` field)."""
    body: dict[str, Any] = {
        "name": r.name,
        "type": r.type,
        "compute": {"gpuTypeId": r.gpu.type, "gpuCountPerPod": r.gpu.count, "podCount": r.nodes},
        "image": r.image,
        "args": r.args,
        "disk": r.disk_gb,
        "ports": list(r.ports),
        "env": dict(r.env),
        "startSsh": r.ssh,
    }
    if r.data_center:
        body["dataCenterIds"] = [r.data_center]
    mounts = mounts_body(r.volume)
    if mounts:
        body["mounts"] = mounts
    return body


# How RunPod may refuse an action on a member pod: 409 (not allowed), 400 (a rule; also "not enough free GPUs on
# the host" for a start), 403 (not through the pod endpoints).
MEMBER_REFUSALS = (ApiErrorKind.CONFLICT, ApiErrorKind.REJECTED, ApiErrorKind.NO_CAPACITY, ApiErrorKind.FORBIDDEN)


def member_refused(exc: ApiError) -> bool:
    """Whether an action on a member pod was refused (an expected answer), not a failure of the request."""
    return exc.kind in MEMBER_REFUSALS


def not_a_cluster_action(name: str, action: str) -> UsageError:
    """stop/start/restart of a cluster: RunPod has no such action."""
    return UsageError(
        f"{name} is a cluster: RunPod has no {action} for a cluster; "
        f"use `podguard pod heal {name}` (restarts sick nodes, --replace recreates it) or `podguard pod down {name}`"
    )
