"""The records of the cluster code: a cluster as the API shows it, its members, a create attempt, the spec's shape.

    cluster.status          # RUNNING only when every node is; see `aggregate_status`
    Member(pod, rank=1, ip="10.65.0.3")
    ClusterRequest(name=..., type="TRAINING", gpu=GpuInfo("NVIDIA H100 80GB HBM3", 8), nodes=4, ...)

`GET /v2/clusters/{id}` carries only aggregate member counts (`pods {total, byStatus}`); the member pods
themselves come from `GET /v2/clusters/{id}/pods`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from podguard.pods.pod import GpuInfo, Pod, PodStatus, Volume, public_view

__all__ = [
    "CLUSTER_TYPES",
    "Cluster",
    "ClusterRequest",
    "ClusterShape",
    "Member",
    "aggregate_status",
    "cluster_view",
]

CLUSTER_TYPES = ("TRAINING", "APPLICATION", "SLURM", "RAY")  # REST v2 ClusterType
MIN_NODES, MAX_NODES = 2, 250


@dataclass(frozen=True)
class ClusterShape:
    """The spec's `[cluster]` table: `nodes` pods, each with the spec's `[gpu] count` GPUs."""

    nodes: int
    type: str = "TRAINING"


@dataclass(frozen=True)
class Cluster:
    id: str
    name: str
    type: str
    gpu: GpuInfo
    nodes: int  # compute.podCount: the shape asked for
    by_status: Mapping[str, int] = field(default_factory=dict)  # pods.byStatus
    total: int = 0  # pods.total: members currently provisioned
    data_center: str | None = None
    primary_pod_id: str | None = None
    primary_ssh: str | None = None  # `host:port` of the primary node's SSH
    created_at: str | None = None

    @property
    def status(self) -> PodStatus:
        return aggregate_status(self.by_status, self.nodes)

    def running(self) -> int:
        return int(self.by_status.get(PodStatus.RUNNING.value, 0))

    def summary(self) -> str:
        """`2/4 RUNNING, 2 PROVISIONING`: what a waiting command shows."""
        others = ", ".join(f"{n} {s}" for s, n in sorted(self.by_status.items()) if s != "RUNNING" and n)
        return f"{self.running()}/{self.nodes} RUNNING" + (f", {others}" if others else "")


# A cluster is as far along as its least advanced node; a failed node makes it ERROR.
_ORDER = (PodStatus.ERROR, PodStatus.EXITED, PodStatus.PROVISIONING, PodStatus.STARTING, PodStatus.RUNNING)


def aggregate_status(by_status: Mapping[str, int], nodes: int) -> PodStatus:
    """One status for the whole cluster: RUNNING only when all `nodes` are."""
    present = {s for s, n in by_status.items() if n}
    if not present:
        return PodStatus.PROVISIONING
    for status in _ORDER:
        if status.value in present and (status is not PodStatus.RUNNING or by_status[status.value] >= nodes):
            return status
    if PodStatus.RUNNING.value in present:
        return PodStatus.PROVISIONING  # some nodes run, the others are not placed yet
    return PodStatus.TERMINATED if PodStatus.TERMINATED.value in present else PodStatus.PROVISIONING


@dataclass(frozen=True)
class Member:
    """A cluster's member pod with its node rank (None until assigned) and private address."""

    pod: Pod
    rank: int | None
    ip: str | None = None
    cluster_id: str | None = None

    @property
    def label(self) -> str:
        return f"node{self.rank if self.rank is not None else '?'}"


@dataclass(frozen=True)
class ClusterRequest:
    """One create attempt: one GPU type, at most one data centre, every node the same."""

    name: str
    type: str
    image: str
    gpu: GpuInfo
    nodes: int
    args: str = ""
    env: dict[str, str] = field(default_factory=dict)
    ports: tuple[str, ...] = ()
    disk_gb: int = 50
    data_center: str | None = None
    volume: Volume | None = None
    ssh: bool = True

    def describe(self) -> str:
        return f"{self.nodes} nodes x {self.gpu.count}x {self.gpu.type} in {self.data_center or 'any data centre'}"


def cluster_view(cluster: Cluster, members: list[Member]) -> dict[str, Any]:
    """The `--json` object: the pod keys (gpu per node, cost the sum, ssh the primary's) + nodes and members."""
    ordered = sorted(members, key=lambda m: (m.rank is None, m.rank or 0))
    primary = next((m for m in ordered if m.pod.id == cluster.primary_pod_id), ordered[0] if ordered else None)
    costs = [m.pod.cost_per_hr for m in ordered if m.pod.cost_per_hr is not None]
    views = [{**public_view(m.pod), "rank": m.rank, "cluster_ip": m.ip} for m in ordered]
    ups = [v["uptime_s"] for v in views if v["uptime_s"] is not None]
    spent = [v["spent_usd"] for v in views if v["spent_usd"] is not None]
    ssh = primary.pod.ssh if primary is not None else None
    if ssh is None and cluster.primary_ssh:
        host, _, port = cluster.primary_ssh.rpartition(":")
        ssh = f"ssh root@{host} -p {port}" if host else None
    return {
        "id": cluster.id,
        "name": cluster.name,
        "status": str(cluster.status),
        "gpu": {"type": cluster.gpu.type, "count": cluster.gpu.count},
        "cost_per_hr": round(sum(costs), 4) if costs else None,
        "uptime_s": max(ups) if ups else None,  # the longest-running node's
        "spent_usd": round(sum(spent), 4) if spent else None,  # every node's since its start, an estimate
        "ssh": ssh,
        "ports": list(views[ordered.index(primary)]["ports"]) if primary is not None else [],
        "actions": ["terminate"],
        "image": primary.pod.image if primary is not None else "",
        "data_center": cluster.data_center,
        "started_at": primary.pod.started_at if primary is not None else None,
        "cluster": True,
        "type": cluster.type,
        "nodes": cluster.nodes,
        "members": views,
    }
