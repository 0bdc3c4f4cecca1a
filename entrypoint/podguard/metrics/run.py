"""The metrics of one `podguard train|run`: the state, the endpoint and the file, opened before anything runs.

    metrics = open_metrics(port=9464, path=Path("/var/lib/node_exporter/podguard.prom"), mode="auto")
    watch = metrics.attempt(runtime, attempt=0, mode="per-gpu", gpus=selection.gpus)
    metrics.close()

The options are checked where they are parsed (cli/options.py); the bind and the first write happen here, so a
taken port or an unwritable file is exit 64 before the preflight touches anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podguard import __version__, console
from podguard.errors import UsageError
from podguard.metrics.price import price_of_budget, read_price_later
from podguard.metrics.state import GpuRow, MetricsState, Source
from podguard.metrics.watch import MetricsWatch
from podguard.pods import thispod

if TYPE_CHECKING:
    from podguard.guards import GuardWatch
    from podguard.launch.watch.runtime import RuntimeWatch
    from podguard.metrics.server import MetricsServer
    from podguard.metrics.textfile import FileWriter

__all__ = ["ENV_INTERVAL", "Metrics", "file_interval", "open_metrics"]

ENV_INTERVAL = "PODGUARD_METRICS_INTERVAL"  # seconds between --metrics-file writes (default 15)


class Metrics:
    """The run's metrics; see the module docstring."""

    def __init__(
        self,
        state: MetricsState,
        server: MetricsServer | None,
        writer: FileWriter | None,
    ) -> None:
        self.state = state
        self.server = server
        self.writer = writer

    def read_price(self, guards: GuardWatch | None, pod_id: str | None = None) -> None:
        """Inside a pod: its price, from the cost guard's read where there is one, else one read on a thread."""
        pod_id = (pod_id if pod_id is not None else thispod.pod_id()).strip()
        if not pod_id:
            return
        price = price_of_budget(guards.budget if guards is not None else None)
        if price is not None:
            self.state.set_price(price)
        else:
            read_price_later(pod_id, self.state.set_price)

    def add_source(self, source: Source) -> None:
        """Series kept elsewhere (a row in metrics/series.py's SERIES each): see "Adding a series" there."""
        self.state.add_source(source)

    def refresh(self) -> None:
        """Publish a source's new values now rather than at the loop's next second."""
        self.state.refresh()

    def attempt(self, runtime: RuntimeWatch, *, attempt: int, mode: str, gpus: Sequence[Any]) -> MetricsWatch:
        """A launch: its number, mode and GPUs (`SelectedGpu`s); the GPU gauges hook into the run-time watch's
        NVML poll; the returned watch goes last in the supervisor's WatchGroup."""
        rows = [GpuRow(g.index, g.uuid or "", g.name or "") for g in dict.fromkeys(gpus)]
        self.state.begin_attempt(attempt, str(mode), rows)
        runtime.gpu_reader = self.state.read_gpus
        return MetricsWatch(self.state, runtime)

    def close(self) -> None:
        """`podguard_up` 0, the file's last write, then the port closes."""
        self.state.end()
        if self.writer is not None:
            self.writer.close()
        if self.server is not None:
            self.server.close()


def open_metrics(*, port: int | None, path: Path | None, mode: str, every_s: float | None = None) -> Metrics | None:
    """The endpoint and the file, or None when neither is asked for. UsageError (64) when the port is taken or
    cannot be bound, or the file cannot be written: before anything runs. `every_s`: the file's interval as
    `file_interval()` checked it (job/configure.py), else read here."""
    if port is None and path is None:
        return None
    from podguard.metrics.exposition import snapshot_registry  # noqa: PLC0415  lazy: prometheus_client
    from podguard.metrics.server import MetricsServer  # noqa: PLC0415  lazy: prometheus_client
    from podguard.metrics.textfile import FILE_INTERVAL_S, FileWriter, collector_note  # noqa: PLC0415  lazy: prometheus_client

    every_s = every_s if every_s is not None else file_interval()
    every_s = FILE_INTERVAL_S if every_s is None else every_s
    state = MetricsState(version=__version__, mode=str(mode), pod_id=thispod.pod_id())
    registry = snapshot_registry(state)
    server = MetricsServer.bind(port, registry) if port is not None else None
    try:
        writer = FileWriter(path, registry, every_s=every_s) if path is not None else None
    except BaseException:
        if server is not None:
            server.close()
        raise
    if server is not None:
        console.say(f"metrics: http://0.0.0.0:{port}/metrics")
    if writer is not None:
        console.say(f"metrics: {path} (every {every_s:g} s)")
        if (note := collector_note(writer.path)) is not None:
            console.warn(note)
    return Metrics(state, server, writer)


def file_interval(env: Mapping[str, str] | None = None) -> float | None:
    """PODGUARD_METRICS_INTERVAL: seconds between --metrics-file writes; None when unset (the file's default
    applies). UsageError (64) when not valid: job/configure.py asks before anything runs."""
    raw = (os.environ if env is None else env).get(ENV_INTERVAL)
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.05 <= value < float("inf"):
        raise UsageError(f"{ENV_INTERVAL}={raw!r} is not valid; expected seconds >= 0.05, e.g. 15")
    return value
