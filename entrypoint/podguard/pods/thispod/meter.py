"""This pod's price and spend, or its whole Instant Cluster's, read from the API once: `--max-cost` and the metrics
then need no more requests.

    budget = read_budget(pod_id)            # a pod: its cost/hr and start; a cluster member: every member's
    price = read_price(pod_id)              # this pod's own meter alone (the metrics' price and spend series)
    budget.spent(time.monotonic())          # US dollars so far, an estimate
    budget.reached_at(150.0)                # the monotonic time at which 150 USD is spent

A pod's spend is its `cost` per hour x the time since its `startedAt`. A member of an Instant Cluster (the API
shows it with `cluster {id, rank, ip}`) counts the whole cluster: the sum of that over every member
(`GET /v2/clusters/{id}/pods`), because the guard ends the whole cluster's billing (docs/guards.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from podguard import console
from podguard.pods.api import open_api
from podguard.pods.clusters.rest import cluster_api
from podguard.pods.pod import Pod
from podguard.pods.spend import seconds_since

__all__ = ["Budget", "Meter", "budget_from", "read_budget", "read_price"]


@dataclass(frozen=True)
class Meter:
    """One pod's meter when it was read: its price and how long it had run since its start."""

    pod_id: str
    cost_per_hr: float
    uptime_s: float


@dataclass(frozen=True)
class Budget:
    """The meters of this pod, or of every member of its cluster, read at `read_at` (time.monotonic())."""

    pod_id: str  # this pod
    meters: tuple[Meter, ...]  # the priced ones
    read_at: float
    cluster_id: str | None = None  # this pod is a member of this Instant Cluster
    nodes: int = 1  # the cluster's members (priced or not)

    @property
    def cost_per_hr(self) -> float:
        """What it costs per hour (a cluster: the sum of its members')."""
        return sum(m.cost_per_hr for m in self.meters)

    @property
    def what(self) -> str:
        """`pod abc` or `cluster c1 (4 nodes)`: what the spend is of."""
        if self.cluster_id is None:
            return f"pod {self.pod_id}"
        return f"cluster {self.cluster_id} ({self.nodes} nodes)"

    def elapsed(self, now: float) -> float:
        """Seconds since the read (never negative)."""
        return max(0.0, now - self.read_at)

    def spent(self, now: float) -> float:
        """US dollars spent by `now`: every meter's cost/hr x (its uptime at the read + the time since)."""
        return sum(m.cost_per_hr * (m.uptime_s + self.elapsed(now)) for m in self.meters) / 3600.0

    def reached_at(self, usd: float) -> float:
        """The monotonic time at which the spend reaches `usd` (in the past when it already did)."""
        return self.read_at + (usd - self.spent(self.read_at)) / self.cost_per_hr * 3600.0

    def running_s(self, now: float) -> float:
        """How long it has run by `now` (a cluster: its longest-running member)."""
        return max(m.uptime_s for m in self.meters) + self.elapsed(now)


def budget_from(pod_id: str, cluster_id: str | None, pods: Sequence[Pod], wall: float, read_at: float) -> Budget | None:
    """The budget of `pods` (this pod, or every member of `cluster_id`) read at wall-clock `wall`; None (with one
    line said) when the API gives no cost for any of them. A pod without a start time counts from now."""
    what = f"pod {pod_id}" if cluster_id is None else f"cluster {cluster_id}"
    meters, no_cost, no_start = [], [], []
    for pod in pods:
        if pod.cost_per_hr is None:
            no_cost.append(pod.id)
            continue
        uptime = seconds_since(pod.started_at, wall)
        if uptime is None:
            no_start.append(pod.id)
        meters.append(Meter(pod.id, float(pod.cost_per_hr), uptime or 0.0))
    if not any(m.cost_per_hr > 0 for m in meters):
        console.warn(f"--max-cost: the API gives no cost per hour for {what}; the guard is off")
        return None
    if no_cost:
        unpriced = ", ".join(no_cost)
        console.warn(f"--max-cost: the API gives no cost per hour for pod(s) {unpriced} of {what}; not counted")
    if no_start:
        pods_named = what if cluster_id is None else f"pod(s) {', '.join(no_start)} of {what}"
        console.warn(f"--max-cost: the API gives no start time for {pods_named}; counting from now")
    return Budget(pod_id, tuple(meters), read_at, cluster_id, len(pods))


def read_budget(pod_id: str) -> Budget | None:
    """This pod's GET; for a cluster member also its cluster's members (one request). None when there is no cost."""
    api = open_api("rest")
    pod = api.get_pod(pod_id)
    pods: Sequence[Pod] = [pod]
    if pod.cluster_id is not None:
        pods = [m.pod for m in cluster_api(api).members(pod.cluster_id)]
    return budget_from(pod_id, pod.cluster_id, pods, time.time(), time.monotonic())


def read_price(pod_id: str, *, retry_for: float = 60.0) -> Budget | None:
    """This pod's own meter: one GET (its retries last up to `retry_for` s); None when the API
    gives it no price. Inside a cluster member it is this pod's own price (the cost guard sums the cluster's)."""
    pod = open_api("rest", retry_for=retry_for).get_pod(pod_id)
    wall, read_at = time.time(), time.monotonic()
    if not pod.cost_per_hr:
        return None
    return Budget(pod_id, (Meter(pod_id, float(pod.cost_per_hr), seconds_since(pod.started_at, wall) or 0.0),), read_at)
