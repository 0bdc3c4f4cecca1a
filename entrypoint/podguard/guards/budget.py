"""This pod's spend, read from the API once: `--max-cost` then needs no more requests.

    budget = read_budget(pod_id)            # cost/hr and time running since the pod's start (startedAt)
    budget.spent(time.monotonic())          # US dollars so far, an estimate
    budget.reached_at(150.0)                # the monotonic time at which 150 USD is spent

Counting from the pod's start (not the container's) means a container restart does not reset the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PodBudget", "read_budget"]


@dataclass(frozen=True)
class PodBudget:
    pod_id: str
    cost_per_hr: float
    uptime_s: float  # time running since the pod's start, when it was read
    read_at: float  # time.monotonic() of that read

    def spent(self, now: float) -> float:
        return self.cost_per_hr * (self.uptime_s + max(0.0, now - self.read_at)) / 3600.0

    def reached_at(self, usd: float) -> float:
        """The monotonic time at which the spend reaches `usd` (in the past when it already did)."""
        return self.read_at + usd / self.cost_per_hr * 3600.0 - self.uptime_s

    def running_s(self, now: float) -> float:
        return self.uptime_s + max(0.0, now - self.read_at)


def read_budget(pod_id: str, say: Callable[[str], None]) -> PodBudget | None:
    """One GET of this pod: its cost/hr and start. None (with one line said) when the API gives no cost."""
    from podguard.pods.api import open_api
    from podguard.pods.spend import parse_timestamp

    pod = open_api("rest").get_pod(pod_id)
    now_wall, now = time.time(), time.monotonic()
    if not pod.cost_per_hr:
        say(f"warning: --max-cost: the API gives no cost per hour for pod {pod_id}; the guard is off")
        return None
    started = parse_timestamp(pod.started_at)
    if started is None:
        say(f"warning: --max-cost: the API gives no start time for pod {pod_id}; counting from now")
    uptime = 0.0 if started is None else max(0.0, now_wall - started)
    return PodBudget(pod_id, float(pod.cost_per_hr), uptime, now)
