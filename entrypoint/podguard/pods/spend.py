"""Time running and what it cost: the arithmetic behind a pod's `uptime_s`/`spent_usd` and `--max-cost`.

    seconds_since(pod.started_at)          # seconds since the API's startedAt, None when unknown
    cost_of(pod.cost_per_hr, seconds)      # cost_per_hr x that time, an estimate

RunPod bills by the second while the pod runs; `startedAt` is the pod's start (a restart of the container
inside it does not move it), so the estimate survives container restarts. `Pod.uptime_s()` and
`Pod.spent_usd()` (pods/pod.py) apply it to a pod.
"""

from __future__ import annotations

import time
from datetime import datetime

__all__ = ["cost_of", "parse_timestamp", "seconds_since"]


def parse_timestamp(text: str | None) -> float | None:
    """An RFC 3339 time (`2026-11-26T09:10:34.144Z`) as Unix seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp.timestamp() if stamp.tzinfo is not None else None


def seconds_since(started_at: str | None, now: float | None = None) -> float | None:
    """Seconds since `started_at`; None when the API gave no start time (GraphQL). Never negative (clock skew
    between here and the API)."""
    started = parse_timestamp(started_at)
    if started is None:
        return None
    return max(0.0, (time.time() if now is None else now) - started)


def cost_of(cost_per_hr: float | None, seconds: float | None) -> float | None:
    """cost_per_hr x seconds, in US dollars; None when either is unknown."""
    if seconds is None or cost_per_hr is None:
        return None
    return cost_per_hr * seconds / 3600.0
