"""The text a scrape gets, formatted by Prometheus's own client library from one snapshot.

    registry = snapshot_registry(state)     # a CollectorRegistry whose one collector reads `state.snapshot`
    text = render(registry)                 # Prometheus text format 0.0.4 (what --metrics-file holds)

Formatting is the only work a scrape does: the snapshot was built on podguard's loop, so the server's thread never
waits for the loop and the loop never waits for a scrape. The spend is computed here, from the price and the clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from podguard.metrics.series import SERIES

if TYPE_CHECKING:
    from podguard.metrics.state import MetricsState, Snapshot

__all__ = ["SnapshotCollector", "render", "snapshot_registry"]


class SnapshotCollector(Collector):
    """Yields podguard's series from the state's latest snapshot (no lock, no NVML, no I/O)."""

    def __init__(self, state: MetricsState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        snap: Snapshot = self.state.snapshot  # one reference read: the loop may publish a newer one meanwhile
        samples = dict(snap.samples)
        if snap.price is not None:
            samples["podguard_price_dollars_per_hour"] = (((), snap.price.cost_per_hr),)
            samples["podguard_spend_dollars"] = (((), round(snap.price.spent(time.monotonic()), 6)),)
        for series in SERIES:
            rows = samples.get(series.name)
            if rows is None:
                continue  # not (yet) known: rank series before a heartbeat, Xids before one came
            family_type = CounterMetricFamily if series.kind == "counter" else GaugeMetricFamily
            family = family_type(series.name, series.help, labels=series.labels)
            for labels, value in rows:
                family.add_metric(labels, value)
            yield family


def snapshot_registry(state: MetricsState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(state))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
