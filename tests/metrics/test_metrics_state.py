"""The metrics' bookkeeping in-process: counters kept across heartbeat boards that start again from zero, and what
a snapshot holds before anything is known.

Why: the end-to-end tests restart whole attempts; a rank restarted inside one attempt (torchrun's own
--max-restarts: the same slot, a new process, its count from 1 again) must not make a counter go down either.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

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
