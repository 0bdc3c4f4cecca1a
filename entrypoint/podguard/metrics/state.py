"""What the metrics say, kept from the state the supervisor already has, and published as immutable snapshots.

    state = MetricsState(version="0.1.0", mode="auto", pod_id="abc")
    state.begin_attempt(0, "per-gpu", gpus)      # the conductor, before each launch
    state.observe(runtime)                        # the supervisor's loop (metrics/watch.py), every second
    state.read_gpus(backend)                      # the run-time watch, after its NVML fault poll (rate-limited)
    state.add_source(lambda: {"podguard_x": (((), 1.0),)})   # series kept elsewhere (metrics/series.py)
    state.snapshot                                # what a scrape formats: one attribute read, never a lock

Every update happens on podguard's threads (the loop, the price reader) under a short lock and ends by publishing
a new `Snapshot`, so a scrape on the server's thread reads one reference and never blocks the loop. Counters are
kept here across attempts, so they never go down during one podguard process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from podguard.metrics.series import GPU_GAUGES
from podguard.rank.progress import Beat

if TYPE_CHECKING:
    from podguard.gpu.backend import GpuBackend
    from podguard.launch.watch.runtime import RuntimeWatch
    from podguard.pods.thispod.meter import Budget

__all__ = ["GPU_READ_S", "GpuRow", "MetricsState", "Rows", "Snapshot", "Source"]

GPU_READ_S = 5.0  # the GPU gauges' NVML read, at most this often (4 calls per GPU)

Rows = tuple[tuple[tuple[str, ...], float], ...]  # (label values, value) per sample
Source = Callable[[], Mapping[str, Rows]]  # series kept outside this module, read at each publish


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str
    model: str


@dataclass(frozen=True)
class Snapshot:
    """The series' samples at one moment; `price` (this pod's meter, as `--max-cost` reads it: price x uptime) is
    kept apart because the spend grows with the clock."""

    samples: Mapping[str, Rows] = field(default_factory=dict)
    price: Budget | None = None


@dataclass
class _Rank:
    heartbeats: int = 0
    step: int | None = None
    last_wall: float = 0.0


class MetricsState:
    """See the module docstring."""

    def __init__(self, *, version: str, mode: str, pod_id: str) -> None:
        self._lock = threading.Lock()
        self.info = (version, mode, pod_id)
        self.up = 1.0  # 0 once the run has ended (the textfile's last write says so)
        self.attempt = 0  # 1-based; 0 before the first launch
        self.restarts = 0
        self.gpus: dict[int, GpuRow] = {}  # every GPU of any attempt
        self.selected: tuple[int, ...] = ()  # this attempt's
        self.unhealthy: set[int] = set()
        self.readings: dict[int, dict[str, float]] = {}
        self.xids: dict[tuple[int, str, int], int] = {}
        self.ranks: dict[str, _Rank] = {}
        self.slow: set[str] = set()
        self.last_progress: float | None = None
        self.price: Budget | None = None
        self._board: dict[int, tuple[int, int]] = {}  # slot -> (pid, count) as last counted, this attempt
        self._faults_seen = 0  # of this attempt's runtime.faults
        self._next_read = 0.0
        self._sources: list[Source] = []
        self.source_errors = 0  # source calls that raised (their series are left out of that snapshot)
        self.snapshot = Snapshot()
        self._publish()

    # -- updates ----------------------------------------------------------------------------------------------
    def begin_attempt(self, attempt: int, mode: str, gpus: Sequence[GpuRow]) -> None:
        """A launch (attempt 0 is the first): the attempt series, the mode and this attempt's GPUs."""
        with self._lock:
            self._begin(attempt, mode, gpus)

    def _begin(self, attempt: int, mode: str, gpus: Sequence[GpuRow]) -> None:
        self.attempt = attempt + 1
        self.restarts = max(self.restarts, attempt)
        self.info = (self.info[0], mode, self.info[2])
        self.selected = tuple(g.index for g in gpus)
        self.gpus.update({g.index: g for g in gpus})
        self.readings = {i: r for i, r in self.readings.items() if i in self.selected}
        self._board, self._faults_seen, self._next_read = {}, 0, 0.0
        self.slow = set()
        self._publish()

    def observe(self, runtime: RuntimeWatch) -> None:
        """Take what the run-time watch has seen: heartbeats, stragglers, faults, progress (the loop's thread; at
        the end of an attempt, after the watch's close, which reads the board a last time)."""
        with self._lock:
            self._observe(runtime, runtime.beats)

    def _observe(self, runtime: RuntimeWatch, beats: Mapping[int, Beat]) -> None:
        now, wall = time.monotonic(), time.time()
        for slot, beat in beats.items():
            pid, counted = self._board.get(slot, (beat.pid, 0))
            if pid != beat.pid or beat.count < counted:
                counted = 0  # a new process in the slot (torchrun restarted it): its count starts again
            if beat.count == counted and slot in self._board:
                continue
            self._board[slot] = (beat.pid, beat.count)
            rank = self.ranks.setdefault(str(beat.label), _Rank())
            rank.heartbeats += beat.count - counted
            rank.step = beat.step if beat.step is not None else rank.step
            rank.last_wall = max(rank.last_wall, wall - max(0.0, now - beat.at))
            self.last_progress = max(self.last_progress or 0.0, rank.last_wall)  # a beat is the job's progress too
        labels = runtime.progress.labels
        self.slow = {str(labels.get(slot, slot)) for slot in runtime.rates.slow}
        for fault in runtime.faults[self._faults_seen :]:
            if fault.kind == "xid" and fault.xid is not None:
                key = (fault.index, fault.uuid or "", fault.xid)
                self.xids[key] = self.xids.get(key, 0) + 1
            if fault.fatal:
                self.unhealthy.add(fault.index)
        self._faults_seen = len(runtime.faults)
        progress = runtime.progress
        if progress.seen:
            at = wall - max(0.0, now - progress.last_at)
            self.last_progress = max(self.last_progress or 0.0, at)
        self._publish()

    def read_gpus(self, backend: GpuBackend) -> None:
        """The GPU gauges through the run-time watch's NVML session, at most every GPU_READ_S (its thread)."""
        now = time.monotonic()
        if now < self._next_read:
            return
        self._next_read = now + GPU_READ_S
        readings = {index: _read_gpu(backend, index) for index in self.selected}  # (NVML: outside the lock)
        with self._lock:
            self.readings = {i: r for i, r in readings.items() if i in self.selected}
            self._publish()

    def end(self) -> None:
        """The run is over: `podguard_up` 0 (the file keeps it; the endpoint closes right after)."""
        with self._lock:
            self.up = 0.0
            self._publish()

    def add_source(self, source: Source) -> None:
        """Series kept elsewhere (metrics/series.py, "Adding a series"): called at each publish, on podguard's
        threads; it must not block. A source that raises leaves its series out of that snapshot, nothing else."""
        with self._lock:
            self._sources.append(source)
            self._publish()

    def refresh(self) -> None:
        """A new snapshot now (a source's values changed and should not wait for the loop's next second)."""
        with self._lock:
            self._publish()

    def set_price(self, price: Budget | None) -> None:
        with self._lock:
            self.price = price
            self._publish()

    # -- the snapshot -----------------------------------------------------------------------------------------
    def _publish(self) -> None:
        """A new immutable snapshot from the current state (a few hundred samples at most: microseconds); the
        caller holds the lock."""
        self.snapshot = Snapshot(self._samples(), self.price)

    def _samples(self) -> dict[str, Rows]:
        out: dict[str, Rows] = {
            "podguard_up": (((), self.up),),
            "podguard_info": ((self.info, 1.0),),
            "podguard_job_attempt": (((), float(self.attempt)),),
            "podguard_job_restarts": (((), float(self.restarts)),),
        }
        gpus = sorted(self.gpus.values(), key=lambda g: g.index)
        if gpus:
            out["podguard_gpu_healthy"] = tuple(
                ((str(g.index), g.uuid, g.model), 0.0 if g.index in self.unhealthy else 1.0) for g in gpus
            )
        for name, series in GPU_GAUGES.items():
            rows = tuple(
                ((str(g.index), g.uuid), value)
                for g in gpus
                if (value := self.readings.get(g.index, {}).get(name)) is not None
            )
            if rows:
                out[series] = rows
        if self.xids:
            out["podguard_gpu_xid_errors"] = tuple(
                ((str(gpu), uuid, str(xid)), float(n)) for (gpu, uuid, xid), n in sorted(self.xids.items())
            )
        if gpus:  # at 0 before any Xid: `increase()` sees the first one (a series born at 1 shows no increase)
            events = {g.index: 0 for g in gpus}
            for (gpu, _, _), n in self.xids.items():
                events[gpu] = events.get(gpu, 0) + n
            out["podguard_gpu_xid_events"] = tuple(((str(g.index), g.uuid), float(events[g.index])) for g in gpus)
        ranks = sorted(self.ranks.items(), key=lambda item: _rank_key(item[0]))
        if ranks:
            steps = tuple(((r,), float(s.step)) for r, s in ranks if s.step is not None)
            if steps:
                out["podguard_rank_step"] = steps
            out["podguard_rank_heartbeats"] = tuple(((r,), float(s.heartbeats)) for r, s in ranks)
            out["podguard_rank_last_progress_timestamp_seconds"] = tuple(((r,), s.last_wall) for r, s in ranks)
            out["podguard_rank_slow"] = tuple(((r,), 1.0 if r in self.slow else 0.0) for r, _ in ranks)
        if self.last_progress is not None:
            out["podguard_job_last_progress_timestamp_seconds"] = (((), self.last_progress),)
        for source in self._sources:
            try:
                out.update(source())
            except Exception:  # a source's bug leaves its series out; the run's own series go on
                self.source_errors += 1
        return out


def _read_gpu(backend: Any, index: int) -> dict[str, float]:
    """One GPU's gauges; what NVML cannot tell is left out (never a made-up 0)."""
    values: dict[str, float | None] = {}
    try:
        util = backend.utilization(index)
        values["utilization"] = None if util is None else util / 100.0
        values["memory_used"] = backend.memory_used(index)
        sensors = getattr(backend, "sensors", None)
        if sensors is not None:
            values["power"], values["temperature"] = sensors(index)
    except Exception:  # a lost GPU, a binding quirk: the gauges wait for the next read; the fault watch tells
        pass
    return {k: float(v) for k, v in values.items() if v is not None}


def _rank_key(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1 << 30, label)
