"""The metrics on the supervisor's loop: a timer that takes the run-time watch's state into a new snapshot.

    run_job(specs, watch=WatchGroup([guards, runtime, MetricsWatch(state, runtime)]))

It is last in the group, so its `close()` (after the run-time watch's final fault poll) keeps the attempt's last
faults and heartbeats: the metrics file written at the end has them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from podguard.launch.supervisor import Supervisor
    from podguard.launch.watch.runtime import RuntimeWatch
    from podguard.metrics.state import MetricsState

__all__ = ["OBSERVE_S", "MetricsWatch"]

OBSERVE_S = 1.0  # as often as the run-time watch reads the heartbeat board


class MetricsWatch:
    """A supervisor `Watch` (launch/supervisor.py)."""

    def __init__(self, state: MetricsState, runtime: RuntimeWatch, every_s: float = OBSERVE_S) -> None:
        self.state = state
        self.runtime = runtime
        self.every_s = every_s
        self._sup: Supervisor | None = None
        self._timer: Any = None

    def start(self, sup: Supervisor) -> None:
        self._sup = sup
        self._timer = sup.call_later(self.every_s, self._tick)

    def _tick(self) -> None:
        self.state.observe(self.runtime)
        if self._sup is not None:
            self._timer = self._sup.call_later(self.every_s, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._sup = None
        self.state.observe(self.runtime)
