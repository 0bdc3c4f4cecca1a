"""How clusters look on a terminal: a row per cluster in `pod list`, labelled lines plus a node table for one.

print(listing_table(pods, [(cluster, members), ...]))
print(cluster_details(cluster, members))
"""

from __future__ import annotations

from collections.abc import Sequence

from podguard.pods.clusters.model import Cluster, Member, cluster_view
from podguard.pods.model import Pod
from podguard.pods.render import _cost, _gpu, _printable

__all__ = ["cluster_details", "listing_table"]


def _cluster_cost(cluster: Cluster, members: Sequence[Member]) -> str:
    total = cluster_view(cluster, list(members))["cost_per_hr"]
    return "-" if total is None else f"${total:.2f}/hr"


def listing_table(pods: Sequence[Pod], clusters: Sequence[tuple[Cluster, Sequence[Member]]]) -> str:
    """Pods, then one row per cluster (`4x 8x NVIDIA H100 ...`); members are not rows of their own."""
    if not pods and not clusters:
        return "no pods"
    rows = [("ID", "NAME", "STATUS", "GPU", "COST", "SSH")]
    rows += [(p.id, _printable(p.name), str(p.status), _gpu(p), _cost(p), p.ssh or "-") for p in pods]
    for cluster, members in clusters:
        ssh = cluster_view(cluster, list(members))["ssh"] or "-"
        gpu = f"{cluster.nodes} nodes x {cluster.gpu.count}x {cluster.gpu.type}"
        status = f"{cluster.status} ({cluster.running()}/{cluster.nodes})"
        rows.append((cluster.id, _printable(cluster.name), status, gpu, _cluster_cost(cluster, members), ssh))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows)


def cluster_details(cluster: Cluster, members: Sequence[Member]) -> str:
    view = cluster_view(cluster, list(members))
    lines = [
        f"id:       {cluster.id}",
        f"name:     {_printable(cluster.name)}",
        f"cluster:  {cluster.type}, {cluster.nodes} nodes ({cluster.summary()})",
        f"status:   {cluster.status}",
        f"gpu:      {cluster.gpu.count}x {cluster.gpu.type} per node",
        f"cost:     {_cluster_cost(cluster, members)}",
        f"ssh:      {view['ssh'] or '-'}",
    ]
    if cluster.data_center:
        lines.append(f"where:    {cluster.data_center}")
    for m in sorted(members, key=lambda m: (m.rank is None, m.rank or 0)):
        lines.append(f"  {m.label}: {m.pod.id}  {m.pod.status}  {m.ip or '-'}  {m.pod.ssh or '-'}")
    return "\n".join(lines)
