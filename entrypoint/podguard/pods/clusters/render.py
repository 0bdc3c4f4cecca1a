"""How clusters look on a terminal: a row per cluster in `pod list`, labelled lines plus a node table for one.

print(listing_table(pods, [(cluster, members), ...]))
print(cluster_details(cluster, members))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from podguard.durations import format_duration
from podguard.pods.clusters.cluster import Cluster, Member, cluster_view
from podguard.pods.pod import Pod
from podguard.pods.render import TABLE_HEADER, _printable, aligned, pod_row

__all__ = ["cluster_details", "listing_table"]


def _cluster_cost(cluster: Cluster, members: Sequence[Member]) -> str:
    total = cluster_view(cluster, list(members))["cost_per_hr"]
    return "-" if total is None else f"${total:.2f}/hr"


def _uptime(view: dict[str, Any]) -> str:
    return "-" if view["uptime_s"] is None else format_duration(view["uptime_s"])


def _spent(view: dict[str, Any]) -> str:
    return "-" if view["spent_usd"] is None else f"${view['spent_usd']:.2f}"


def listing_table(pods: Sequence[Pod], clusters: Sequence[tuple[Cluster, Sequence[Member]]]) -> str:
    """Pods, then one row per cluster (`4 nodes x 8x NVIDIA H100 ...`); members are not rows of their own."""
    if not pods and not clusters:
        return "no pods"
    rows = [TABLE_HEADER, *(pod_row(p) for p in pods)]
    for cluster, members in clusters:
        view = cluster_view(cluster, list(members))
        gpu = f"{cluster.nodes} nodes x {cluster.gpu.count}x {cluster.gpu.type}"
        status = f"{cluster.status} ({cluster.running()}/{cluster.nodes})"
        cost = _cluster_cost(cluster, members)
        rows.append(
            (cluster.id, _printable(cluster.name), status, gpu, cost, _uptime(view), _spent(view), view["ssh"] or "-")
        )
    return aligned(rows)


def cluster_details(cluster: Cluster, members: Sequence[Member]) -> str:
    view = cluster_view(cluster, list(members))
    lines = [
        f"id:       {cluster.id}",
        f"name:     {_printable(cluster.name)}",
        f"cluster:  {cluster.type}, {cluster.nodes} nodes ({cluster.summary()})",
        f"status:   {cluster.status}",
        f"gpu:      {cluster.gpu.count}x {cluster.gpu.type} per node",
        f"cost:     {_cluster_cost(cluster, members)}",
        f"uptime:   {_uptime(view)}",
        f"spent:    {_spent(view)}"
        + (" (all nodes since their start, an estimate)" if view["spent_usd"] is not None else ""),
        f"ssh:      {view['ssh'] or '-'}",
    ]
    if cluster.data_center:
        lines.append(f"where:    {cluster.data_center}")
    for m in sorted(members, key=lambda m: (m.rank is None, m.rank or 0)):
        lines.append(f"  {m.label}: {m.pod.id}  {m.pod.status}  {m.ip or '-'}  {m.pod.ssh or '-'}")
    return "\n".join(lines)
