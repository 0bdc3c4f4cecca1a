"""A pod's time running since its last start and what it cost: `pod list`/`pod status` and `--max-cost`.

    uptime_s(pod)      # seconds since the API's startedAt while RUNNING, else None
    spent_usd(pod)     # cost_per_hr x that time, an estimate (None when either is unknown)

RunPod bills by the second while the pod runs; `startedAt` is the pod's start (a restart of the container
inside it does not move it), so the estimate survives container restarts.
"""

from __future__ import annotations

import time
from datetime import datetime

from podguard.pods.model import Pod, PodStatus

__all__ = ["parse_timestamp", "spent_usd", "uptime_s"]


def parse_timestamp(text: str | None) -> float | None:
    """An RFC 3339 time (`2026-11-26T09:10:34.144Z`) as Unix seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp.timestamp() if stamp.tzinfo is not None else None


def uptime_s(pod: Pod, now: float | None = None) -> float | None:
    """Seconds the pod has been running since its last start; None when it is not RUNNING or the API gave
    no start time (GraphQL). Never negative (clock skew between here and the API)."""
    if pod.status is not PodStatus.RUNNING:
        return None
    started = parse_timestamp(pod.started_at)
    if started is None:
        return None
    return max(0.0, (time.time() if now is None else now) - started)


def spent_usd(pod: Pod, now: float | None = None) -> float | None:
    """cost_per_hr x uptime: what the pod has cost since its last start (an estimate)."""
    up = uptime_s(pod, now)
    if up is None or pod.cost_per_hr is None:
        return None
    return pod.cost_per_hr * up / 3600.0
