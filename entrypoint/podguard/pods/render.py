"""How pods look on a terminal: a table for lists, a few labelled lines for one pod.

    print(pod_table(pods))
    print(pod_details(pod))

`--json` output uses model.public_view instead; neither ever shows the pod's environment.
"""

from __future__ import annotations

from collections.abc import Sequence

from podguard.durations import format_duration
from podguard.pods.pod import Pod
from podguard.pods.proxy import metrics_url

__all__ = ["pod_details", "pod_table"]


def _gpu(pod: Pod) -> str:
    if pod.gpu is not None:
        return f"{pod.gpu.count}x {pod.gpu.type}"
    return f"CPU {pod.cpu.id} x{pod.cpu.vcpus}" if pod.cpu is not None else "-"


def _cost(pod: Pod) -> str:
    return "-" if pod.cost_per_hr is None else f"${pod.cost_per_hr:.2f}/hr"


def _uptime(pod: Pod) -> str:
    up = pod.uptime_s()
    return "-" if up is None else format_duration(up)


def _spent(pod: Pod) -> str:
    spent = pod.spent_usd()
    return "-" if spent is None else f"${spent:.2f}"


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text)


TABLE_HEADER = ("ID", "NAME", "STATUS", "GPU", "COST", "UPTIME", "SPENT", "SSH")


def pod_row(p: Pod) -> tuple[str, ...]:
    """One pod's row under TABLE_HEADER."""
    return (p.id, _printable(p.name), str(p.status), _gpu(p), _cost(p), _uptime(p), _spent(p), p.ssh or "-")


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows as columns, the last one (SSH, long) unpadded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows)


def pod_table(pods: Sequence[Pod]) -> str:
    if not pods:
        return "no pods"
    return aligned([TABLE_HEADER, *(pod_row(p) for p in pods)])


def pod_details(pod: Pod) -> str:
    ports = ", ".join(
        f"{p.private}/{p.type} -> {p.ip or '?'}:{p.public}" if p.public else f"{p.private}/{p.type}" for p in pod.ports
    )
    lines = [
        f"id:       {pod.id}",
        f"name:     {_printable(pod.name)}",
        f"status:   {pod.status}",
        f"gpu:      {_gpu(pod)}",
        f"cost:     {_cost(pod)}",
        f"uptime:   {_uptime(pod)}",
        f"spent:    {_spent(pod)}" + (" (since its start, an estimate)" if pod.spent_usd() is not None else ""),
        f"ssh:      {pod.ssh or '-'}",
        f"ports:    {ports or ', '.join(pod.port_specs) or '-'}",
    ]
    if pod.data_center:
        lines.append(f"where:    {pod.data_center}")
    if (metrics := metrics_url(pod)) is not None:  # [env] PODGUARD_METRICS_PORT + ports = ["9464/http"]
        lines.append(f"metrics:  {metrics}")
    return "\n".join(lines)
