"""The metrics' bookkeeping in-process: counters kept across heartbeat boards that start again from zero, and what
a snapshot holds before anything is known.

Why: the end-to-end tests restart whole attempts; a rank restarted inside one attempt (torchrun's own
--max-restarts: the same slot, a new process, its count from 1 again) must not make a counter go down either.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from podguard.launch.watch.gpu_faults import GpuFault
from podguard.metrics.exposition import render, snapshot_registry
from podguard.metrics.state import GpuRow, MetricsState
from podguard.rank.progress import Beat


def runtime(beats: dict[int, Beat], slow: tuple[int, ...] = ()) -> SimpleNamespace:
    """What the run-time watch holds (its public attributes) after a tick."""
    now = time.monotonic()
    return SimpleNamespace(
        beats=beats,
        faults=[],
        progress=SimpleNamespace(labels={s: b.label for s, b in beats.items()}, seen=bool(beats), last_at=now),
        rates=SimpleNamespace(slow={s: None for s in slow}),
    )


def totals(state: MetricsState) -> dict[tuple[str, ...], float]:
    return dict(state.snapshot.samples["podguard_rank_heartbeats"])


def test_a_new_process_in_a_slot_adds_its_beats_instead_of_lowering_the_counter():
    state = MetricsState(version="0", mode="torchrun", pod_id="")
    state.begin_attempt(0, "torchrun", [GpuRow(0, "GPU-a", "H100")])
    now = time.monotonic()
    state.observe(runtime({0: Beat(0, 40, 39, now, pid=100, rank=3)}))
    assert totals(state) == {("3",): 40.0}
    state.observe(runtime({0: Beat(0, 5, 4, now, pid=200, rank=3)}))  # restarted by torchrun: counts from 1 again
    assert totals(state) == {("3",): 45.0}
    state.observe(runtime({0: Beat(0, 9, 8, now, pid=200, rank=3)}, slow=(0,)))
    assert totals(state) == {("3",): 49.0}
    assert dict(state.snapshot.samples["podguard_rank_slow"]) == {("3",): 1.0}
    state.begin_attempt(1, "torchrun", [GpuRow(0, "GPU-a", "H100")])  # a relaunch: a new board from zero
    state.observe(runtime({0: Beat(0, 2, 1, now, pid=300, rank=3)}))
    assert totals(state) == {("3",): 51.0}
    assert dict(state.snapshot.samples["podguard_rank_slow"]) == {("3",): 0.0}
    assert dict(state.snapshot.samples["podguard_job_restarts"]) == {(): 1.0}


def test_before_the_first_launch_only_the_process_series_are_there():
    state = MetricsState(version="9.9", mode="auto", pod_id="pod1")
    text = render(snapshot_registry(state)).decode()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert names == ["podguard_up", "podguard_info", "podguard_job_attempt", "podguard_job_restarts_total"]
    assert 'podguard_info{mode="auto",pod_id="pod1",version="9.9"} 1.0' in text
    assert "podguard_job_attempt 0.0" in text


def test_a_heartbeat_read_only_at_the_end_still_moves_the_jobs_last_progress():
    """A short attempt whose beats are read only by the watch's last board read (progress.seen still False): the
    rank's last progress is set, and so is the job's, never older than any rank's."""
    state = MetricsState(version="0", mode="single", pod_id="")
    state.begin_attempt(0, "single", [GpuRow(0, "GPU-a", "H100")])
    unseen = runtime({0: Beat(0, 3, 2, time.monotonic(), pid=100, rank=0)})
    unseen.progress.seen = False
    state.observe(unseen)
    [(_, rank_at)] = state.snapshot.samples["podguard_rank_last_progress_timestamp_seconds"]
    [(_, job_at)] = state.snapshot.samples["podguard_job_last_progress_timestamp_seconds"]
    assert job_at >= rank_at > 0


def test_the_xid_event_total_is_0_for_every_watched_gpu_from_the_first_launch_and_counts_each_xid():
    """`increase()` only sees a counter grow from a sample it has: a series born at 1 with its first Xid is
    invisible to it, so the per-GPU total is there at 0 before any Xid can come."""
    state = MetricsState(version="0", mode="per-gpu", pod_id="")
    state.begin_attempt(0, "per-gpu", [GpuRow(0, "GPU-a", "H100"), GpuRow(1, "GPU-b", "H100")])
    events = "podguard_gpu_xid_events"
    assert dict(state.snapshot.samples[events]) == {("0", "GPU-a"): 0.0, ("1", "GPU-b"): 0.0}
    assert events + "_total" in render(snapshot_registry(state)).decode()
    now = time.monotonic()
    watch = runtime({})
    watch.faults = [
        GpuFault(1, "GPU-b", "xid", 13, False, "Xid 13", now),
        GpuFault(1, "GPU-b", "xid", 31, False, "Xid 31", now),
        GpuFault(0, "GPU-a", "lost", None, True, "GPU 0 lost", now),  # not an Xid
    ]
    state.observe(watch)
    assert dict(state.snapshot.samples[events]) == {("0", "GPU-a"): 0.0, ("1", "GPU-b"): 2.0}
    state.begin_attempt(1, "per-gpu", [GpuRow(1, "GPU-b", "H100")])  # GPU 0 left out of the relaunch
    watch.faults = [GpuFault(1, "GPU-b", "xid", 13, False, "Xid 13", now)]  # the new attempt's watch tells it again
    state.observe(watch)
    assert dict(state.snapshot.samples[events]) == {("0", "GPU-a"): 0.0, ("1", "GPU-b"): 3.0}  # never down, kept


def test_a_series_kept_elsewhere_is_a_row_in_the_table_and_a_source(monkeypatch):
    """How the checkpoint store (or anything else) adds series: a row in SERIES and a source; a source that raises
    leaves its own series out of that snapshot and nothing else."""
    from podguard.metrics import exposition
    from podguard.metrics.series import SERIES, Series

    rows = (Series("podguard_test_lag_seconds", "gauge", "A test series."), Series("podguard_test_boom", "gauge", "X"))
    monkeypatch.setattr(exposition, "SERIES", (*SERIES, *rows))
    state = MetricsState(version="0", mode="auto", pod_id="")
    lag = {"value": 3.5}
    state.add_source(lambda: {"podguard_test_lag_seconds": (((), lag["value"]),)})
    registry = snapshot_registry(state)
    assert "# TYPE podguard_test_lag_seconds gauge\npodguard_test_lag_seconds 3.5" in render(registry).decode()
    lag["value"] = 0.0
    state.refresh()
    assert "podguard_test_lag_seconds 0.0" in render(registry).decode()

    def boom() -> dict:
        raise RuntimeError("a bug in a source")

    state.add_source(boom)
    text = render(registry).decode()
    assert "podguard_test_lag_seconds 0.0" in text and "podguard_up 1.0" in text and "podguard_test_boom" not in text
    assert state.source_errors >= 1
