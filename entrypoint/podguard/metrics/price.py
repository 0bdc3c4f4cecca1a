"""This pod's price and spend for the metrics, read from RunPod's API once, whether or not a cost guard is set.

    price_of_budget(guards.budget)            # --max-cost already read the pod's meter: reuse it (no request)
    read_price_later(pod_id, state.set_price)        # else one GET /v2/pods/{id} on a helper thread

The price is a `Budget` of this pod's one meter (pods/thispod/meter.py), so the spend is the price x the time since
the pod's `startedAt` exactly as `--max-cost` counts it: one read, then the clock. Inside a cluster member it is
this pod's own price and spend (the cost guard sums the cluster's). A failed read leaves the two series out, says
one line, and never delays or fails the job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from podguard import console
from podguard.errors import PodguardError
from podguard.pods.thispod.meter import Budget, read_price

__all__ = ["price_of_budget", "read_price_later"]

RETRY_FOR_S = 60.0  # the API's retries for this one read (a helper thread: the job does not wait)


def price_of_budget(budget: Budget | None) -> Budget | None:
    """This pod's own meter from the cost guard's budget (read once at start; a cluster's has every member's), or
    None."""
    if budget is None:
        return None
    meter = next((m for m in budget.meters if m.pod_id == budget.pod_id), None)
    if meter is None or meter.cost_per_hr <= 0:
        return None
    return Budget(budget.pod_id, (meter,), budget.read_at)


def read_price_later(pod_id: str, done: Callable[[Budget | None], None]) -> threading.Thread:
    """`read_price` on a daemon thread; `done(price)` with the answer; a failure is one line (never the key)."""

    def run() -> None:
        try:
            price = read_price(pod_id, retry_for=RETRY_FOR_S)
        except Exception as exc:  # no key, the API down: the metrics go on without the price
            why = exc.message if isinstance(exc, PodguardError) else f"{type(exc).__name__}: {exc}"
            console.say(f"metrics: no price for pod {pod_id}: {why}")
            return
        if price is None:
            console.say(f"metrics: the API gives no price for pod {pod_id}; the price and spend series are left out")
        done(price)

    thread = threading.Thread(target=run, name="podguard-metrics-price", daemon=True)
    thread.start()
    return thread
